/* NumPy .npy arrays (format versions 1.0, 2.0, 3.0): the activations `tilejit run` reads and the
 * outputs it writes. Only 2-D, C-order, little-endian float32 ('<f4') and float16 ('<f2'). */
#include "base/npy.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tilejit reads little-endian arrays in place: a little-endian host is required"
#endif

/* Real headers are a few hundred bytes; anything near this is hostile. */
#define TJ_NPY_MAX_HEADER (1u << 20)

void tj_npy_free(tj_npy *a)
{
    if (!a) return;
    free(a->data);
    a->data = NULL;
}

/* A tiny parser for the header's Python dict literal, e.g.
 * {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), } */
typedef struct hp {
    const char *s, *end;
} hp;

static void hp_ws(hp *p)
{
    while (p->s < p->end && isspace((unsigned char)*p->s)) p->s++;
}

static int hp_eat(hp *p, char c)
{
    hp_ws(p);
    if (p->s < p->end && *p->s == c) {
        p->s++;
        return 1;
    }
    return 0;
}

/* A quoted string (single or double quotes, no escapes needed for the keys we know). */
static int hp_string(hp *p, char *buf, size_t cap)
{
    hp_ws(p);
    if (p->s >= p->end || (*p->s != '\'' && *p->s != '"')) return 0;
    char q = *p->s++;
    size_t n = 0;
    while (p->s < p->end && *p->s != q) {
        if (n + 1 >= cap) return 0;
        buf[n++] = *p->s++;
    }
    if (p->s >= p->end) return 0;
    p->s++;
    buf[n] = '\0';
    return 1;
}

static int hp_word(hp *p, const char *w)
{
    hp_ws(p);
    size_t n = strlen(w);
    if ((size_t)(p->end - p->s) >= n && strncmp(p->s, w, n) == 0) {
        p->s += n;
        return 1;
    }
    return 0;
}

/* A tuple of non-negative integers: (), (3,), (3, 4), (3, 4, ). Returns the count or -1. */
static int hp_tuple(hp *p, int64_t *dims, int max)
{
    if (!hp_eat(p, '(')) return -1;
    int n = 0;
    for (;;) {
        if (hp_eat(p, ')')) return n;
        hp_ws(p);
        if (p->s >= p->end || !isdigit((unsigned char)*p->s)) return -1;
        int64_t v = 0;
        while (p->s < p->end && isdigit((unsigned char)*p->s)) {
            if (v > (INT64_MAX - 9) / 10) return -1;
            v = v * 10 + (*p->s++ - '0');
        }
        hp_ws(p); /* numpy may write 3L on Python 2 */
        if (p->s < p->end && *p->s == 'L') p->s++;
        if (n < max) dims[n] = v;
        n++;
        if (!hp_eat(p, ',')) {
            if (hp_eat(p, ')')) return n;
            return -1;
        }
    }
}

static tj_status parse_header(const char *path, const char *h, size_t len, tj_dtype *dt, int64_t *rows,
                              int64_t *cols, tj_error *err)
{
    hp p = {h, h + len};
    char key[64], descr[64] = "";
    int have_descr = 0, have_order = 0, have_shape = 0, fortran = 0, nd = 0;
    int64_t dims[8];
    if (!hp_eat(&p, '{')) return tj_fail(err, TJ_ERR_FORMAT, "%s: .npy header is not a dict literal", path);
    for (;;) {
        if (hp_eat(&p, '}')) break;
        if (!hp_string(&p, key, sizeof key) || !hp_eat(&p, ':'))
            return tj_fail(err, TJ_ERR_FORMAT, "%s: .npy header: cannot parse near '%.20s'", path, p.s);
        if (strcmp(key, "descr") == 0) {
            if (!hp_string(&p, descr, sizeof descr))
                return tj_fail(err, TJ_ERR_FORMAT, "%s: .npy header: 'descr' is not a simple dtype string (structured arrays are not supported)", path);
            have_descr = 1;
        } else if (strcmp(key, "fortran_order") == 0) {
            if (hp_word(&p, "True")) fortran = 1;
            else if (hp_word(&p, "False")) fortran = 0;
            else return tj_fail(err, TJ_ERR_FORMAT, "%s: .npy header: 'fortran_order' is not True or False", path);
            have_order = 1;
        } else if (strcmp(key, "shape") == 0) {
            if ((nd = hp_tuple(&p, dims, 8)) < 0)
                return tj_fail(err, TJ_ERR_FORMAT, "%s: .npy header: 'shape' is not a tuple of integers", path);
            have_shape = 1;
        } else {
            return tj_fail(err, TJ_ERR_FORMAT, "%s: .npy header: unexpected key '%s'", path, key);
        }
        if (!hp_eat(&p, ',')) {
            if (hp_eat(&p, '}')) break;
            return tj_fail(err, TJ_ERR_FORMAT, "%s: .npy header: cannot parse near '%.20s'", path, p.s);
        }
    }
    if (!have_descr || !have_order || !have_shape)
        return tj_fail(err, TJ_ERR_FORMAT, "%s: .npy header lacks '%s'", path,
                       !have_descr ? "descr" : !have_order ? "fortran_order" : "shape");
    if (strcmp(descr, "<f4") == 0) *dt = TJ_F32;
    else if (strcmp(descr, "<f2") == 0) *dt = TJ_F16;
    else
        return tj_fail(err, TJ_ERR_FORMAT, "%s: dtype '%s' is not supported (use float32 '<f4' or float16 '<f2')",
                       path, descr);
    if (fortran)
        return tj_fail(err, TJ_ERR_FORMAT, "%s: array is in Fortran order; save it C-ordered (np.ascontiguousarray)", path);
    if (nd != 2)
        return tj_fail(err, TJ_ERR_FORMAT, "%s: array has %d dimension%s; a 2-D array [rows × cols] is required",
                       path, nd, nd == 1 ? "" : "s");
    *rows = dims[0];
    *cols = dims[1];
    return TJ_OK;
}

tj_status tj_npy_read(const char *path, tj_npy *out, tj_error *err)
{
    memset(out, 0, sizeof *out);
    tj_status st = TJ_OK;
    char *header = NULL;
    void *data = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return tj_fail(err, TJ_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = tj_fail(err, TJ_ERR_IO, "%s: not a regular file", path);
        goto done;
    }
    uint64_t size = (uint64_t)sb.st_size;
    unsigned char pre[12];
    size_t got = fread(pre, 1, 10, fp);
    if (got < 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        st = tj_fail(err, TJ_ERR_FORMAT, "%s: not a .npy file (bad magic or shorter than 10 bytes)", path);
        goto done;
    }
    int major = pre[6], minor = pre[7];
    uint64_t hlen, pos;
    if (major == 1) {
        hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
        pos = 10;
    } else if (major == 2 || major == 3) {
        if (fread(pre + 10, 1, 2, fp) != 2) {
            st = tj_fail(err, TJ_ERR_FORMAT, "%s: truncated .npy header", path);
            goto done;
        }
        hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 | (uint64_t)pre[11] << 24;
        pos = 12;
    } else {
        st = tj_fail(err, TJ_ERR_FORMAT, "%s: .npy format version %d.%d is not supported (1.0, 2.0, 3.0 are)", path,
                     major, minor);
        goto done;
    }
    if (hlen > size - pos) {
        st = tj_fail(err, TJ_ERR_FORMAT, "%s: .npy header length %llu exceeds the file size (%llu bytes)", path,
                     (unsigned long long)hlen, (unsigned long long)size);
        goto done;
    }
    if (hlen > TJ_NPY_MAX_HEADER) {
        st = tj_fail(err, TJ_ERR_FORMAT, "%s: .npy header length %llu is over the %u-byte limit", path,
                     (unsigned long long)hlen, TJ_NPY_MAX_HEADER);
        goto done;
    }
    if (!(header = malloc((size_t)hlen + 1))) {
        st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto done;
    }
    if (fread(header, 1, (size_t)hlen, fp) != hlen) {
        st = tj_fail(err, TJ_ERR_IO, "%s: cannot read the .npy header", path);
        goto done;
    }
    header[hlen] = '\0';
    tj_dtype dt = TJ_F32;
    int64_t rows = 0, cols = 0, numel, nbytes;
    if ((st = parse_header(path, header, (size_t)hlen, &dt, &rows, &cols, err)) != TJ_OK) goto done;
    if (!tj_mul_ok(rows, cols, &numel) || !tj_mul_ok(numel, (int64_t)tj_dtype_size(dt), &nbytes)) {
        st = tj_fail(err, TJ_ERR_FORMAT, "%s: shape (%lld, %lld) overflows", path, (long long)rows, (long long)cols);
        goto done;
    }
    uint64_t avail = size - pos - hlen;
    if (avail != (uint64_t)nbytes) {
        st = tj_fail(err, TJ_ERR_FORMAT, "%s: data is %llu bytes but shape (%lld, %lld) of %s needs %lld (%s)", path,
                     (unsigned long long)avail, (long long)rows, (long long)cols, dt == TJ_F32 ? "<f4" : "<f2",
                     (long long)nbytes, avail < (uint64_t)nbytes ? "truncated" : "trailing bytes");
        goto done;
    }
    if (!(data = malloc(nbytes ? (size_t)nbytes : 1))) {
        st = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory for %lld bytes", path, (long long)nbytes);
        goto done;
    }
    if (fread(data, 1, (size_t)nbytes, fp) != (size_t)nbytes) {
        st = tj_fail(err, TJ_ERR_IO, "%s: cannot read the array data", path);
        goto done;
    }
    out->dtype = dt;
    out->rows = rows;
    out->cols = cols;
    out->data = data;
    data = NULL;
done:
    free(data);
    free(header);
    fclose(fp);
    return st;
}

tj_status tj_npy_write(const char *path, tj_dtype dtype, int64_t rows, int64_t cols, const void *data, tj_error *err)
{
    if (dtype != TJ_F32 && dtype != TJ_F16)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: .npy output must be F32 or F16, not %s", path,
                       tj_dtype_name(dtype));
    int64_t numel, nbytes;
    if (rows < 0 || cols < 0 || !tj_mul_ok(rows, cols, &numel) ||
        !tj_mul_ok(numel, (int64_t)tj_dtype_size(dtype), &nbytes))
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: bad shape (%lld, %lld)", path, (long long)rows,
                       (long long)cols);
    /* Version 1.0; header padded with spaces and ended by '\n' so the data starts 64-byte aligned. */
    char h[256];
    int n = snprintf(h, sizeof h, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld, %lld), }",
                     dtype == TJ_F32 ? "<f4" : "<f2", (long long)rows, (long long)cols);
    size_t total = ((size_t)(10 + n + 1) + 63) & ~(size_t)63, hlen = total - 10;
    memset(h + n, ' ', hlen - (size_t)n - 1);
    h[hlen - 1] = '\n';
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hlen & 0xff),
                             (unsigned char)(hlen >> 8)};

    size_t plen = strlen(path);
    char *tmp = malloc(plen + 16);
    if (!tmp) return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    snprintf(tmp, plen + 16, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0) {
        tj_status st = tj_fail(err, TJ_ERR_IO, "%s: cannot create a temporary file next to it: %s", path,
                               strerror(errno));
        free(tmp);
        return st;
    }
    fchmod(fd, 0644);
    FILE *fp = fdopen(fd, "wb");
    int ok = fp != NULL;
    if (!fp) close(fd);
    ok = ok && fwrite(pre, 1, 10, fp) == 10 && fwrite(h, 1, hlen, fp) == hlen &&
         (nbytes == 0 || fwrite(data, 1, (size_t)nbytes, fp) == (size_t)nbytes);
    if (fp && fclose(fp) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        tj_status st = tj_fail(err, TJ_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        unlink(tmp);
        free(tmp);
        return st;
    }
    free(tmp);
    return TJ_OK;
}
