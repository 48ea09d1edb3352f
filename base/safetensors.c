/* safetensors reader and writer: the weights side of model loading (model.c) and the output of
 * the pruner. The reader maps the file, validates the 8-byte header length and the JSON header
 * against the file size, and only then hands out pointers into the data section. */
#include "base/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tilejit reads little-endian tensor data in place: a little-endian host is required"
#endif

/* A header larger than this is refused before anything is allocated for it (the Rust reference
 * implementation uses the same bound). */
#define TJ_ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)

/* Element size of every dtype the format knows; 0 for names it does not. */
static int dtype_bytes(const char *s)
{
    static const struct { const char *name; int size; } table[] = {
        {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2},
        {"I8", 1},  {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1},    {"BOOL", 1},
        {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}, {"C64", 8},
    };
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (strcmp(s, table[i].name) == 0) return table[i].size;
    return 0;
}

static int usable_dtype(const char *s, tj_dtype *out)
{
    if (strcmp(s, "F32") == 0) *out = TJ_F32;
    else if (strcmp(s, "F16") == 0) *out = TJ_F16;
    else if (strcmp(s, "BF16") == 0) *out = TJ_BF16;
    else return 0;
    return 1;
}

void tj_st_close(tj_st_file *f)
{
    if (!f) return;
    if (f->map) munmap(f->map, f->map_size);
    for (int64_t i = 0; i < f->ntensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    free(f->metadata_json);
    free(f->path);
    free(f);
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const tj_st_tensor *)a)->name, ((const tj_st_tensor *)b)->name);
}

static int by_offset(const void *a, const void *b)
{
    const tj_st_tensor *x = *(tj_st_tensor *const *)a, *y = *(tj_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Reads one header entry into t; the caller has set t->name. */
static tj_status parse_entry(const char *path, const char *name, json_t *v, uint64_t data_size,
                             tj_st_tensor *t, tj_error *err)
{
    if (!json_is_object(v))
        return tj_fail(err, TJ_ERR_FORMAT, "%s: tensor '%s': header entry is not an object", path, name);
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *offs = json_object_get(v, "data_offsets");
    if (!json_is_string(dt))
        return tj_fail(err, TJ_ERR_FORMAT, "%s: tensor '%s': field 'dtype' is missing or not a string", path, name);
    const char *ds = json_string_value(dt);
    if (strlen(ds) >= sizeof t->dtype_str)
        return tj_fail(err, TJ_ERR_FORMAT, "%s: tensor '%s': field 'dtype': '%.40s' is not a dtype", path, name, ds);
    strcpy(t->dtype_str, ds);
    t->dtype_ok = usable_dtype(ds, &t->dtype);
    if (!t->dtype_ok) t->dtype = TJ_F32;

    if (!json_is_array(shape))
        return tj_fail(err, TJ_ERR_FORMAT, "%s: tensor '%s': field 'shape' is missing or not an array", path, name);
    size_t nd = json_array_size(shape);
    if (nd > TJ_ST_MAX_DIMS)
        return tj_fail(err, TJ_ERR_FORMAT, "%s: tensor '%s': field 'shape' has %zu dimensions (at most %d supported)",
                       path, name, nd, TJ_ST_MAX_DIMS);
    t->ndim = (int)nd;
    int64_t numel = 1;
    for (size_t d = 0; d < nd; d++) {
        json_t *e = json_array_get(shape, d);
        if (!json_is_integer(e) || json_integer_value(e) < 0)
            return tj_fail(err, TJ_ERR_FORMAT, "%s: tensor '%s': field 'shape'[%zu] is not a non-negative integer",
                           path, name, d);
        t->shape[d] = json_integer_value(e);
        if (!tj_mul_ok(numel, t->shape[d], &numel))
            return tj_fail(err, TJ_ERR_FORMAT, "%s: tensor '%s': field 'shape': element count overflows", path, name);
    }

    if (!json_is_array(offs) || json_array_size(offs) != 2 || !json_is_integer(json_array_get(offs, 0)) ||
        !json_is_integer(json_array_get(offs, 1)))
        return tj_fail(err, TJ_ERR_FORMAT, "%s: tensor '%s': field 'data_offsets' is not a pair of integers", path, name);
    json_int_t b = json_integer_value(json_array_get(offs, 0)), e = json_integer_value(json_array_get(offs, 1));
    if (b < 0 || e < b || (uint64_t)e > data_size)
        return tj_fail(err, TJ_ERR_FORMAT,
                       "%s: tensor '%s': field 'data_offsets' [%lld, %lld] is outside the data section of %llu bytes",
                       path, name, (long long)b, (long long)e, (unsigned long long)data_size);
    t->begin = (uint64_t)b;
    t->end = (uint64_t)e;
    int esize = dtype_bytes(ds);
    int64_t nbytes;
    if (esize && (!tj_mul_ok(numel, esize, &nbytes) || (uint64_t)nbytes != t->end - t->begin))
        return tj_fail(err, TJ_ERR_FORMAT,
                       "%s: tensor '%s': field 'data_offsets' spans %llu bytes but shape and dtype %s need %lld",
                       path, name, (unsigned long long)(t->end - t->begin), ds,
                       (long long)(numel > INT64_MAX / 8 ? -1 : numel * esize));
    return TJ_OK;
}

tj_status tj_st_open(const char *path, tj_st_file **out, tj_error *err)
{
    *out = NULL;
    tj_status st = TJ_OK;
    json_t *root = NULL;
    tj_st_tensor **order = NULL;
    tj_st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto fail;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = tj_fail(err, TJ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = tj_fail(err, TJ_ERR_IO, "%s: not a regular file", path);
        close(fd);
        goto fail;
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8) {
        st = tj_fail(err, TJ_ERR_FORMAT, "%s: file is %llu bytes, too short for the 8-byte header length",
                     path, (unsigned long long)size);
        close(fd);
        goto fail;
    }
    f->map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        st = tj_fail(err, TJ_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
        goto fail;
    }
    f->map_size = (size_t)size;
    const unsigned char *p = f->map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen > size - 8) {
        st = tj_fail(err, TJ_ERR_FORMAT, "%s: header length %llu exceeds the file size (%llu bytes): truncated or not a safetensors file",
                     path, (unsigned long long)hlen, (unsigned long long)size);
        goto fail;
    }
    if (hlen > TJ_ST_MAX_HEADER) {
        st = tj_fail(err, TJ_ERR_FORMAT, "%s: header length %llu is over the %llu-byte limit", path,
                     (unsigned long long)hlen, (unsigned long long)TJ_ST_MAX_HEADER);
        goto fail;
    }
    if (hlen < 2 || p[8] != '{') {
        st = tj_fail(err, TJ_ERR_FORMAT, "%s: header does not start with a JSON object ('{')", path);
        goto fail;
    }
    uint64_t data_size = size - 8 - hlen;
    const unsigned char *data = p + 8 + hlen;
    json_error_t jerr;
    root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        st = tj_fail(err, TJ_ERR_FORMAT, "%s: header is not valid JSON (line %d, column %d): %s", path,
                     jerr.line, jerr.column, jerr.text);
        goto fail;
    }
    if (!json_is_object(root)) {
        st = tj_fail(err, TJ_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto fail;
    }
    size_t cap = json_object_size(root);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    if (!f->tensors) {
        st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory for %zu tensors", path, cap);
        goto fail;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                st = tj_fail(err, TJ_ERR_FORMAT, "%s: field '__metadata__' is not an object", path);
                goto fail;
            }
            f->metadata_json = json_dumps(val, JSON_COMPACT);
            if (!f->metadata_json) {
                st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
                goto fail;
            }
            continue;
        }
        tj_st_tensor *t = &f->tensors[f->ntensors];
        if (!(t->name = strdup(key))) {
            st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
            goto fail;
        }
        f->ntensors++;
        if ((st = parse_entry(path, key, val, data_size, t, err)) != TJ_OK) goto fail;
        t->data = data + t->begin;
    }
    /* No two tensors may share bytes (holes between them are tolerated). */
    order = malloc((size_t)(f->ntensors ? f->ntensors : 1) * sizeof *order);
    if (!order) {
        st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto fail;
    }
    for (int64_t i = 0; i < f->ntensors; i++) order[i] = &f->tensors[i];
    qsort(order, (size_t)f->ntensors, sizeof *order, by_offset);
    const tj_st_tensor *a = NULL; /* the non-empty tensor reaching furthest so far */
    for (int64_t i = 0; i < f->ntensors; i++) {
        const tj_st_tensor *b = order[i];
        if (b->end == b->begin) continue;
        if (a && b->begin < a->end) {
            st = tj_fail(err, TJ_ERR_FORMAT,
                         "%s: tensor '%s': field 'data_offsets' [%llu, %llu] overlaps tensor '%s' [%llu, %llu]",
                         path, b->name, (unsigned long long)b->begin, (unsigned long long)b->end, a->name,
                         (unsigned long long)a->begin, (unsigned long long)a->end);
            goto fail;
        }
        a = b;
    }
    free(order);
    order = NULL;
    qsort(f->tensors, (size_t)f->ntensors, sizeof *f->tensors, by_name);
    json_decref(root);
    *out = f;
    return TJ_OK;
fail:
    free(order);
    json_decref(root);
    tj_st_close(f);
    return st;
}

const tj_st_tensor *tj_st_find(const tj_st_file *f, const char *name)
{
    int64_t lo = 0, hi = f->ntensors;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->tensors[mid].name, name);
        if (c == 0) return &f->tensors[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid;
    }
    return NULL;
}

/* ---- writer ---- */

static tj_status write_all(FILE *fp, const void *buf, size_t n, const char *path, tj_error *err)
{
    if (n && fwrite(buf, 1, n, fp) != n)
        return tj_fail(err, TJ_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    return TJ_OK;
}

/* Builds the header text, padded with spaces so the data section starts 8-byte aligned. */
static tj_status build_header(const char *path, const tj_st_out_tensor *ts, int64_t n, const char *metadata_json,
                              char **out, size_t *out_len, tj_error *err)
{
    tj_status st = TJ_OK;
    json_t *root = json_object(), *meta = NULL;
    char *text = NULL;
    if (!root) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    if (metadata_json) {
        json_error_t jerr;
        meta = json_loads(metadata_json, 0, &jerr);
        if (!json_is_object(meta)) {
            st = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: '__metadata__' is not a JSON object: %s", path,
                         meta ? "not an object" : jerr.text);
            json_decref(meta);
            goto done;
        }
        json_object_set_new(root, "__metadata__", meta);
    }
    uint64_t off = 0;
    for (int64_t i = 0; i < n; i++) {
        const tj_st_out_tensor *t = &ts[i];
        if (!t->name || strcmp(t->name, "__metadata__") == 0 || !t->dtype_str || t->ndim < 0 ||
            t->ndim > TJ_ST_MAX_DIMS || (t->ndim && !t->shape)) {
            st = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: tensor %lld: bad name, dtype or shape", path, (long long)i);
            goto done;
        }
        if (json_object_get(root, t->name)) {
            st = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: tensor '%s' is given twice", path, t->name);
            goto done;
        }
        int64_t numel = 1;
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0 || !tj_mul_ok(numel, t->shape[d], &numel)) {
                json_decref(shape);
                st = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: tensor '%s': bad shape", path, t->name);
                goto done;
            }
            json_array_append_new(shape, json_integer(t->shape[d]));
        }
        int esize = dtype_bytes(t->dtype_str);
        int64_t need;
        if (esize && (!tj_mul_ok(numel, esize, &need) || (uint64_t)need != t->nbytes)) {
            json_decref(shape);
            st = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: tensor '%s': %llu bytes given, shape and dtype %s need %lld",
                         path, t->name, (unsigned long long)t->nbytes, t->dtype_str, (long long)need);
            goto done;
        }
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string(t->dtype_str));
        json_object_set_new(e, "shape", shape);
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + t->nbytes)));
        if (json_object_set_new(root, t->name, e) != 0) {
            st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory building the header", path);
            goto done;
        }
        off += t->nbytes;
    }
    text = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) {
        st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory building the header", path);
        goto done;
    }
    size_t len = strlen(text), padded = (len + 7) & ~(size_t)7;
    char *p = realloc(text, padded + 1);
    if (!p) {
        st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory building the header", path);
        goto done;
    }
    text = p;
    memset(text + len, ' ', padded - len);
    text[padded] = '\0';
    *out = text;
    *out_len = padded;
    text = NULL;
done:
    free(text);
    json_decref(root);
    return st;
}

tj_status tj_st_write_stream(const char *path, const tj_st_out_tensor *tensors, int64_t n,
                             const char *metadata_json, tj_st_fill_fn fill, void *user, tj_error *err)
{
    char *header = NULL, *tmp = NULL;
    void *scratch = NULL;
    size_t scratch_cap = 0, hlen = 0;
    FILE *fp = NULL;
    tj_status st = build_header(path, tensors, n, metadata_json, &header, &hlen, err);
    if (st != TJ_OK) return st;
    size_t plen = strlen(path);
    if (!(tmp = malloc(plen + 16))) {
        st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto fail;
    }
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        st = tj_fail(err, TJ_ERR_IO, "%s: cannot create a temporary file next to it: %s", path, strerror(errno));
        free(tmp);
        tmp = NULL;
        goto fail;
    }
    fchmod(fd, 0644);
    if (!(fp = fdopen(fd, "wb"))) {
        close(fd);
        st = tj_fail(err, TJ_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto fail;
    }
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    if ((st = write_all(fp, lenbuf, 8, path, err)) != TJ_OK) goto fail;
    if ((st = write_all(fp, header, hlen, path, err)) != TJ_OK) goto fail;
    for (int64_t i = 0; i < n; i++) {
        const tj_st_out_tensor *t = &tensors[i];
        const void *src = t->data;
        if (!src && t->nbytes) {
            if (!fill) {
                st = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: tensor '%s' has no data", path, t->name);
                goto fail;
            }
            if (t->nbytes > scratch_cap) {
                free(scratch);
                scratch_cap = 0;
                if (t->nbytes > SIZE_MAX || !(scratch = malloc((size_t)t->nbytes))) {
                    st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: tensor '%s': out of memory for %llu bytes", path,
                                 t->name, (unsigned long long)t->nbytes);
                    goto fail;
                }
                scratch_cap = (size_t)t->nbytes;
            }
            if ((st = fill(user, i, scratch, err)) != TJ_OK) goto fail;
            src = scratch;
        }
        if ((st = write_all(fp, src, (size_t)t->nbytes, path, err)) != TJ_OK) goto fail;
    }
    int rc = fflush(fp);
    if (rc == 0) rc = fsync(fileno(fp));
    int rc2 = fclose(fp);
    fp = NULL;
    if (rc != 0 || rc2 != 0) {
        st = tj_fail(err, TJ_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        st = tj_fail(err, TJ_ERR_IO, "%s: cannot rename the temporary file into place: %s", path, strerror(errno));
        goto fail;
    }
    free(tmp);
    free(header);
    free(scratch);
    return TJ_OK;
fail:
    if (fp) fclose(fp);
    if (tmp) {
        unlink(tmp);
        free(tmp);
    }
    free(header);
    free(scratch);
    return st;
}

tj_status tj_st_write(const char *path, const tj_st_out_tensor *tensors, int64_t n, const char *metadata_json,
                      tj_error *err)
{
    return tj_st_write_stream(path, tensors, n, metadata_json, NULL, NULL, err);
}
