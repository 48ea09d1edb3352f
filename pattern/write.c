/* Pattern → JSON (docs/formats.md), used by `prune`, `pattern` and the benchmarks' random patterns.
 * Written with the string builder, not Jansson, so large models serialise in linear time. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pattern/pattern.h"
#include "base/strbuf.h"

static void put_json_string(tj_strbuf *sb, const char *s)
{
    tj_sb_puts(sb, "\"");
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') tj_sb_printf(sb, "\\%c", *c);
        else if (*c < 0x20) tj_sb_printf(sb, "\\u%04x", *c);
        else tj_sb_append(sb, (const char *)c, 1);
    }
    tj_sb_puts(sb, "\"");
}

static void put_i64s(tj_strbuf *sb, const int64_t *v, int64_t n)
{
    tj_sb_puts(sb, "[");
    for (int64_t i = 0; i < n; i++) tj_sb_printf(sb, i ? ", %lld" : "%lld", (long long)v[i]);
    tj_sb_puts(sb, "]");
}

static void put_i32s(tj_strbuf *sb, const int32_t *v, int64_t n)
{
    tj_sb_puts(sb, "[");
    for (int64_t i = 0; i < n; i++) tj_sb_printf(sb, i ? ", %d" : "%d", v[i]);
    tj_sb_puts(sb, "]");
}

char *tj_pattern_to_json(const tj_pattern *p)
{
    tj_strbuf sb;
    tj_sb_init(&sb);
    tj_sb_puts(&sb, "{\n  \"format\": \"tilejit-pattern\",\n  \"version\": 1,\n  \"layers\": [");
    for (int64_t i = 0; i < p->nlayers; i++) {
        const tj_layer *l = &p->layers[i];
        tj_sb_puts(&sb, i ? ",\n    {\n      \"name\": " : "\n    {\n      \"name\": ");
        put_json_string(&sb, l->name);
        tj_sb_printf(&sb, ",\n      \"n\": %lld, \"k\": %lld, \"g\": %lld,\n", (long long)l->n,
                     (long long)l->k, (long long)l->g);
        if (l->cols) {
            tj_sb_puts(&sb, "      \"cols\": ");
            put_i64s(&sb, l->cols, l->ncols);
            tj_sb_puts(&sb, ",\n");
        }
        tj_sb_puts(&sb, "      \"tiles\": [");
        for (int64_t t = 0; t < l->ntiles; t++) {
            tj_sb_puts(&sb, t ? ",\n        " : "\n        ");
            put_i32s(&sb, l->tile_rows + l->tile_ptr[t], tj_tile_nrows(l, t));
        }
        tj_sb_puts(&sb, l->ntiles ? "\n      ]" : "]");
        if (l->ew_indptr) {
            tj_sb_puts(&sb, ",\n      \"ew\": {\"indptr\": ");
            put_i64s(&sb, l->ew_indptr, l->n + 1);
            tj_sb_puts(&sb, ", \"indices\": ");
            put_i32s(&sb, l->ew_indices, l->ew_nnz);
            tj_sb_puts(&sb, "}");
        }
        tj_sb_printf(&sb, ",\n      \"activation\": \"%s\"\n    }", tj_activation_name(l->act));
    }
    tj_sb_puts(&sb, p->nlayers ? "\n  ]\n}\n" : "]\n}\n");
    return tj_sb_take(&sb);
}

tj_status tj_pattern_save(const tj_pattern *p, const char *path, tj_error *err)
{
    char *text = tj_pattern_to_json(p);
    if (!text) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory serialising the pattern", path);
    /* Write beside the target and rename, so a reader never sees half a file. */
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) { free(text); return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "out of memory"); }
    snprintf(tmp, plen + 16, "%s.tmp%d", path, (int)getpid());
    tj_status s = TJ_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) { s = tj_fail(err, TJ_ERR_IO, "%s: cannot write: %s", path, strerror(errno)); goto done; }
    size_t len = strlen(text);
    int bad = fwrite(text, 1, len, f) != len;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        s = tj_fail(err, TJ_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
        remove(tmp);
    }
done:
    free(tmp);
    free(text);
    return s;
}
