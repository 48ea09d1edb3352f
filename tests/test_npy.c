/* .npy reader and writer: round trips in both dtypes, the three header versions, and malformed
 * files built here byte by byte, each giving a status and a message naming the problem. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/npy.h"
#include "tj_test.h"

static char dir[256];

static const char *tmp_path(const char *name)
{
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

/* magic, version, header length in the version's width, header text, ndata bytes of data. */
static void write_npy(const char *path, int major, const char *magic, uint32_t hlen, const char *header,
                      size_t ndata)
{
    FILE *f = fopen(path, "wb");
    fwrite(magic, 1, 6, f);
    fputc(major, f);
    fputc(0, f);
    int width = major == 1 ? 2 : 4;
    for (int i = 0; i < width; i++) fputc((int)((hlen >> (8 * i)) & 0xff), f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < ndata; i++) fputc(0, f);
    fclose(f);
}

static void expect_bad(const char *label, int major, const char *magic, const char *header, size_t ndata,
                       const char *want)
{
    const char *path = tmp_path("bad.npy");
    write_npy(path, major, magic, (uint32_t)strlen(header), header, ndata);
    tj_npy a = {0};
    tj_error err = {0};
    tj_status st = tj_npy_read(path, &a, &err);
    CHECKF(st == TJ_ERR_FORMAT, "%s: status %d (%s)", label, st, err.msg);
    CHECKF(a.data == NULL, "%s: data returned on failure", label);
    CHECKF(strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", label, err.msg, want);
    CHECKF(strstr(err.msg, path) != NULL, "%s: message '%s' does not name the file", label, err.msg);
    tj_npy_free(&a);
}

static void test_round_trip(void)
{
    tj_rng r = {42};
    const int64_t shapes[][2] = {{3, 5}, {1, 1}, {17, 300}, {0, 4}};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int64_t rows = shapes[s][0], cols = shapes[s][1], n = rows * cols;
        float *x = malloc((size_t)(n ? n : 1) * sizeof *x);
        uint16_t *h = malloc((size_t)(n ? n : 1) * sizeof *h);
        tj_test_fill(&r, x, n);
        for (int64_t i = 0; i < n; i++) h[i] = tj_f32_to_f16(x[i]);
        tj_error err = {0};
        tj_npy a = {0};
        CHECK_OK(tj_npy_write(tmp_path("x.npy"), TJ_F32, rows, cols, x, &err), &err);
        CHECK_OK(tj_npy_read(tmp_path("x.npy"), &a, &err), &err);
        CHECK(a.dtype == TJ_F32 && a.rows == rows && a.cols == cols && a.data);
        CHECK(a.data && memcmp(a.data, x, (size_t)n * 4) == 0);
        tj_npy_free(&a);
        CHECK(a.data == NULL);
        CHECK_OK(tj_npy_write(tmp_path("h.npy"), TJ_F16, rows, cols, h, &err), &err);
        CHECK_OK(tj_npy_read(tmp_path("h.npy"), &a, &err), &err);
        CHECK(a.dtype == TJ_F16 && a.rows == rows && a.cols == cols && a.data);
        CHECK(a.data && memcmp(a.data, h, (size_t)n * 2) == 0);
        tj_npy_free(&a);
        free(x);
        free(h);
    }
    /* The written header is NumPy's: version 1.0, data 64-byte aligned, '\n'-terminated. */
    FILE *f = fopen(tmp_path("x.npy"), "rb");
    unsigned char b[128];
    size_t got = fread(b, 1, sizeof b, f);
    fclose(f);
    CHECK(got >= 64 && memcmp(b, "\x93NUMPY\x01\x00", 8) == 0);
    unsigned hlen = b[8] | b[9] << 8;
    CHECK((10 + hlen) % 64 == 0 && b[10 + hlen - 1] == '\n');
    {
        const char *want = "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4), }";
        CHECK(memcmp(b + 10, want, strlen(want)) == 0);
    }

    tj_error err = {0};
    tj_status st = tj_npy_write(tmp_path("y.npy"), TJ_BF16, 1, 1, b, &err);
    CHECKF(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "BF16"), "%s", err.msg);
    st = tj_npy_write("/nonexistent-dir/y.npy", TJ_F32, 1, 1, b, &err);
    CHECKF(st == TJ_ERR_IO && strstr(err.msg, "/nonexistent-dir/y.npy"), "%s", err.msg);
    tj_npy a = {0};
    st = tj_npy_read(tmp_path("missing.npy"), &a, &err);
    CHECKF(st == TJ_ERR_IO && strstr(err.msg, "cannot open"), "%s", err.msg);
}

static void test_versions(void)
{
    /* Versions 2.0 and 3.0 use a 4-byte header length; double quotes and odd spacing are legal. */
    const char *h2 = "{\"descr\":\"<f4\",\"fortran_order\":False,\"shape\":(2,3)}\n";
    for (int major = 2; major <= 3; major++) {
        write_npy(tmp_path("v.npy"), major, "\x93NUMPY", (uint32_t)strlen(h2), h2, 24);
        tj_npy a = {0};
        tj_error err = {0};
        CHECK_OK(tj_npy_read(tmp_path("v.npy"), &a, &err), &err);
        CHECK(a.rows == 2 && a.cols == 3 && a.dtype == TJ_F32);
        tj_npy_free(&a);
    }
    const char *h1 = "{ 'shape' : ( 4 , 1 , ) , 'fortran_order' : False , 'descr' : '<f2' , }   \n";
    write_npy(tmp_path("v.npy"), 1, "\x93NUMPY", (uint32_t)strlen(h1), h1, 8);
    tj_npy a = {0};
    tj_error err = {0};
    CHECK_OK(tj_npy_read(tmp_path("v.npy"), &a, &err), &err);
    CHECK(a.rows == 4 && a.cols == 1 && a.dtype == TJ_F16);
    tj_npy_free(&a);
}

static void test_malformed(void)
{
    const char *M = "\x93NUMPY";
    const char *good = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }\n";
    expect_bad("bad magic", 1, "\x93NUMPX", good, 24, "bad magic");
    expect_bad("version 4", 4, M, good, 24, "version 4.0 is not supported");
    expect_bad("fortran order", 1, M, "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24,
               "Fortran order");
    expect_bad("float64", 1, M, "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }", 48,
               "dtype '<f8' is not supported");
    expect_bad("big endian", 1, M, "{'descr': '>f4', 'fortran_order': False, 'shape': (2, 3), }", 24,
               "dtype '>f4'");
    expect_bad("int32", 1, M, "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }", 24, "'<i4'");
    expect_bad("structured", 1, M, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8,
               "structured");
    expect_bad("1-D", 1, M, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", 24, "1 dimension;");
    expect_bad("3-D", 1, M, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3), }", 24, "3 dimensions");
    expect_bad("0-D", 1, M, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, "0 dimensions");
    expect_bad("truncated data", 1, M, good, 20, "data is 20 bytes but shape (2, 3) of <f4 needs 24 (truncated)");
    expect_bad("trailing data", 1, M, good, 28, "trailing bytes");
    expect_bad("missing shape", 1, M, "{'descr': '<f4', 'fortran_order': False}", 24, "lacks 'shape'");
    expect_bad("unknown key", 1, M, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", 24,
               "unexpected key 'x'");
    expect_bad("garbage header", 1, M, "not a dict at all", 24, "not a dict literal");
    expect_bad("unterminated", 1, M, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3", 24, "'shape'");
    expect_bad("negative dim", 1, M, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2, 3), }", 24, "'shape'");
    expect_bad("huge dims", 1, M, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }",
               24, "overflows");

    /* Header length beyond the file. */
    write_npy(tmp_path("bad.npy"), 1, M, 60000, good, 0);
    tj_npy a = {0};
    tj_error err = {0};
    tj_status st = tj_npy_read(tmp_path("bad.npy"), &a, &err);
    CHECKF(st == TJ_ERR_FORMAT && strstr(err.msg, "exceeds the file size"), "%s", err.msg);
    write_npy(tmp_path("bad.npy"), 2, M, 0xffffffffu, good, 0);
    st = tj_npy_read(tmp_path("bad.npy"), &a, &err);
    CHECKF(st == TJ_ERR_FORMAT && strstr(err.msg, "exceeds the file size"), "%s", err.msg);

    /* Every truncation of a valid file fails with a format error. */
    float x[6] = {1, 2, 3, 4, 5, 6};
    CHECK_OK(tj_npy_write(tmp_path("full.npy"), TJ_F32, 2, 3, x, &err), &err);
    FILE *f = fopen(tmp_path("full.npy"), "rb");
    unsigned char buf[256];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    int failures = 0;
    for (size_t cut = 0; cut < n; cut++) {
        f = fopen(tmp_path("cut.npy"), "wb");
        fwrite(buf, 1, cut, f);
        fclose(f);
        st = tj_npy_read(tmp_path("cut.npy"), &a, &err);
        if (st != TJ_ERR_FORMAT || a.data) failures++;
        tj_npy_free(&a);
    }
    CHECKF(failures == 0, "%d truncations did not fail with TJ_ERR_FORMAT", failures);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/tj_test_npy_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_round_trip();
    test_versions();
    test_malformed();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tj_test_end();
}
