/* libFuzzer target: the tuning-log reader (tuning/records.c, tuning/db.c). Input: a JSON
 * Lines log. Loading it into a database must never fail on content (malformed lines are counted
 * and skipped), lookups must work on whatever was loaded, and every line that parses must
 * survive the writer: record → JSON → record → JSON gives the same text the second time. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autotune/autotune.h"
#include "fuzz_common.h"
#include "pattern/pattern.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int count_row(void *user, const tj_tune_best_row *row)
{
    FUZZ_ASSERT(row->backend != NULL && row->layer != NULL);
    FUZZ_ASSERT(row->config != NULL || isinf(row->median)); /* a group where every config failed */
    (*(int64_t *)user)++;
    return 0;
}

static void roundtrip_line(const char *line)
{
    tj_tune_record r, back;
    tj_error err;
    if (tj_tune_record_parse(line, "fuzz.jsonl:1", &r, &err) != TJ_OK) {
        tj_tune_record_free(&r);
        return;
    }
    char *j1 = NULL, *j2 = NULL;
    if (tj_tune_record_to_json(&r, &j1, &err) == TJ_OK) {
        tj_status s = tj_tune_record_parse(j1, "roundtrip", &back, &err);
        if (s != TJ_OK) fprintf(stderr, "written record does not parse back: %s\n%s\n", err.msg, j1);
        FUZZ_ASSERT(s == TJ_OK);
        FUZZ_ASSERT(tj_tune_record_to_json(&back, &j2, &err) == TJ_OK);
        if (strcmp(j1, j2) != 0) fprintf(stderr, "round trip differs:\n%s\n%s\n", j1, j2);
        FUZZ_ASSERT(strcmp(j1, j2) == 0);
        tj_tune_record_free(&back);
    }
    free(j1);
    free(j2);
    tj_tune_record_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    if (fd < 0) return 0;
    tj_tune_db *db = NULL;
    tj_error err;
    tj_error_clear(&err);
    FUZZ_ASSERT(tj_tune_db_create(&db, &err) == TJ_OK);
    tj_status s = tj_tune_db_load(db, path, 0, &err);
    if (s != TJ_OK) fprintf(stderr, "load: %s\n", err.msg);
    FUZZ_ASSERT(s == TJ_OK || s == TJ_ERR_OUT_OF_MEMORY);
    int64_t rows = 0;
    FUZZ_ASSERT(tj_tune_db_each_best(db, count_row, &rows, &err) == TJ_OK);
    FUZZ_ASSERT(rows <= tj_tune_db_size(db));
    /* A lookup for a small layer on each backend. */
    int64_t tile_ptr[3] = {0, 1, 2};
    int32_t trows[2] = {0, 1};
    tj_layer l = {.name = "a", .n = 64, .k = 48, .g = 32, .ncols = 64, .ntiles = 2, .tile_ptr = tile_ptr, .tile_rows = trows};
    l.hash = tj_layer_hash(&l);
    static const char *backends[] = {"cpu", "cuda", "reference"};
    for (int b = 0; b < 3; b++) {
        tj_tune_choice ch;
        for (int64_t m = 0; m <= 4096; m = m ? m * 8 : 1)
            if (tj_tune_db_best(db, backends[b], "rocketlake", "x86_64-avx512", &l, m, &ch) == TJ_OK)
                FUZZ_ASSERT(ch.config != NULL);
    }
    tj_tune_db_destroy(db);
    close(fd);
    /* Each line on its own through parse and write. */
    char *text = malloc(size + 1);
    FUZZ_ASSERT(text);
    memcpy(text, data, size);
    text[size] = '\0';
    for (char *line = text, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl) *nl = '\0';
        roundtrip_line(line);
    }
    free(text);
    return 0;
}
