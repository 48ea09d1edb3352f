/* Hostile files (issue 8): sizes claimed huge are refused before anything of that size is
 * allocated (run under ASan, whose allocator flags absurd requests), size arithmetic that would
 * overflow is an error, and weights at odd byte offsets (an unpadded safetensors header) load and
 * compute exactly like aligned ones. One regression test per bug found by fuzzing or audit. */
#include <stdint.h>

#include "base/npy.h"
#include "rel_common.h"

static char dir[] = "/tmp/tj_hostile_XXXXXX";

static char *tmp(const char *name)
{
    static char bufs[4][512];
    static int i;
    char *b = bufs[i++ % 4];
    snprintf(b, 512, "%s/%s", dir, name);
    return b;
}

static void put(const char *p, const void *data, size_t n)
{
    FILE *f = fopen(p, "wb");
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

/* A safetensors file from a header text and data bytes (no padding added). */
static void put_st(const char *p, const char *header, const void *data, size_t n)
{
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl + n + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    if (n) memcpy(buf + 8 + hl, data, n);
    put(p, buf, 8 + hl + n);
    free(buf);
}

static void expect_st_error(const char *header, size_t data_bytes, const char *fragment)
{
    void *zeros = calloc(data_bytes ? data_bytes : 1, 1);
    put_st(tmp("h.st"), header, zeros, data_bytes);
    free(zeros);
    tj_st_file *f = NULL;
    tj_error err;
    tj_error_clear(&err);
    tj_status s = tj_st_open(tmp("h.st"), &f, &err);
    CHECKF(s == TJ_ERR_FORMAT && strstr(err.msg, fragment), "header %.80s: status %d, message '%s' (want '%s')", header,
           (int)s, err.msg, fragment);
    tj_st_close(f);
}

static void test_safetensors_huge_claims(void)
{
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,16]}}", 16, "overflows");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776,1099511627776],\"data_offsets\":[0,16]}}", 16,
                    "overflows");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,9223372036854775807]}}", 16, "outside");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[-16,0]}}", 16, "outside");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,2,3,4,5,6,7,8,9],\"data_offsets\":[0,16]}}", 16, "dimensions");
    expect_st_error("{\"w\":{\"dtype\":\"F32\",\"shape\":[-4],\"data_offsets\":[0,16]}}", 16, "non-negative");
    /* Header length claimed far beyond the file. */
    unsigned char big[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, '{', '}'};
    put(tmp("big.st"), big, sizeof big);
    tj_st_file *f = NULL;
    tj_error err;
    CHECK(tj_st_open(tmp("big.st"), &f, &err) == TJ_ERR_FORMAT && strstr(err.msg, "exceeds the file size"));
}

static void write_npy_header(const char *p, int major, const char *dict, size_t data_bytes)
{
    size_t dl = strlen(dict), pre = major == 1 ? 10 : 12;
    unsigned char *buf = calloc(pre + dl + data_bytes + 1, 1);
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)major;
    for (size_t i = 0; i < pre - 8; i++) buf[8 + i] = (unsigned char)(dl >> (8 * i));
    memcpy(buf + pre, dict, dl);
    put(p, buf, pre + dl + data_bytes);
    free(buf);
}

static void test_npy_huge_claims(void)
{
    static const struct { const char *dict; const char *frag; } cases[] = {
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4611686018427387904), }", "overflows"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }", "overflows"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000, 1000), }", "truncated"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999, 2), }", "not a tuple"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        write_npy_header(tmp("h.npy"), 1 + (int)(i % 2), cases[i].dict, 16);
        tj_npy a;
        tj_error err;
        tj_error_clear(&err);
        tj_status s = tj_npy_read(tmp("h.npy"), &a, &err);
        CHECKF(s == TJ_ERR_FORMAT && strstr(err.msg, cases[i].frag), "npy case %zu: status %d, '%s'", i, (int)s, err.msg);
        CHECK(a.data == NULL);
    }
    /* A v2 header length of 4 GiB − 1 in a 12-byte file. */
    unsigned char h[12] = {0x93, 'N', 'U', 'M', 'P', 'Y', 2, 0, 0xff, 0xff, 0xff, 0xff};
    put(tmp("hl.npy"), h, sizeof h);
    tj_npy a;
    tj_error err;
    CHECK(tj_npy_read(tmp("hl.npy"), &a, &err) == TJ_ERR_FORMAT && strstr(err.msg, "exceeds the file size"));
}

/* A pattern whose dimensions are at the limit (n = k = g = 2^24, one empty tile) is valid and
 * costs nothing; the model load must then fail on the missing weights without allocating n·k. */
static void test_pattern_huge_dims(void)
{
    const char *pj = "{\"format\":\"tilejit-pattern\",\"version\":1,\"layers\":[{\"name\":\"big\",\"n\":16777216,"
                     "\"k\":16777216,\"g\":16777216,\"tiles\":[[0,16777215]]}]}";
    put(tmp("big.json"), pj, strlen(pj));
    float w[4] = {1, 2, 3, 4};
    put_st(tmp("small.st"), "{\"big.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", w, sizeof w);
    tj_options opt = tj_options_default();
    opt.backend = TJ_BACKEND_REFERENCE;
    tj_context *ctx = NULL;
    CHECK(tj_context_create(&opt, &ctx) == TJ_OK);
    tj_model *m = NULL;
    tj_status s = tj_model_load(ctx, tmp("big.json"), tmp("small.st"), &m);
    CHECKF(s == TJ_ERR_FORMAT && strstr(tj_context_error(ctx), "does not match"), "status %d: %s", (int)s,
           tj_context_error(ctx));
    /* Over the limit: refused by the parser. */
    const char *over = "{\"format\":\"tilejit-pattern\",\"version\":1,\"layers\":[{\"name\":\"big\",\"n\":16777217,"
                       "\"k\":1,\"g\":1,\"tiles\":[]}]}";
    tj_pattern *p = NULL;
    tj_error err;
    CHECK(tj_pattern_parse(over, strlen(over), "over.json", &p, &err) == TJ_ERR_FORMAT && strstr(err.msg, "exceeds the limit"));
    tj_context_destroy(ctx);
}

/* Layer names are bounded (TJ_MAX_NAME): longer ones could not be bound to "<name>.weight"
 * without truncation, which could pick another tensor. */
static void test_long_names(void)
{
    char *name = malloc(TJ_MAX_NAME + 2);
    memset(name, 'a', TJ_MAX_NAME + 1);
    name[TJ_MAX_NAME + 1] = '\0';
    char *json = malloc(TJ_MAX_NAME + 200);
    snprintf(json, TJ_MAX_NAME + 200,
             "{\"format\":\"tilejit-pattern\",\"version\":1,\"layers\":[{\"name\":\"%s\",\"n\":2,\"k\":2,\"g\":2,\"tiles\":[[0]]}]}", name);
    tj_pattern *p = NULL;
    tj_error err;
    tj_error_clear(&err);
    CHECKF(tj_pattern_parse(json, strlen(json), "long.json", &p, &err) == TJ_ERR_FORMAT && strstr(err.msg, "over the limit"),
           "%s", err.msg);
    name[TJ_MAX_NAME] = '\0'; /* exactly at the limit: accepted */
    snprintf(json, TJ_MAX_NAME + 200,
             "{\"format\":\"tilejit-pattern\",\"version\":1,\"layers\":[{\"name\":\"%s\",\"n\":2,\"k\":2,\"g\":2,\"tiles\":[[0]]}]}", name);
    CHECK_OK(tj_pattern_parse(json, strlen(json), "long.json", &p, &err), &err);
    tj_pattern_destroy(p);
    free(json);
    free(name);
}

/* Weights at odd offsets (header of odd length, as an unpadded writer leaves it): every dtype must
 * load and give exactly the results of the same weights aligned. Found by fuzz_safetensors
 * (UBSan: misaligned uint16_t loads in tj_load_f32). */
static void test_unaligned_weights(void)
{
    int64_t tile_ptr[3] = {0, 2, 4};
    int32_t rows[4] = {0, 2, 1, 3};
    for (int d = 0; d < 3; d++) {
        tj_layer l = {.name = "fc", .n = 4, .k = 4, .g = 2, .ncols = 4, .ntiles = 2, .tile_ptr = tile_ptr, .tile_rows = rows};
        tj_pattern pat = {.nlayers = 1, .layers = &l};
        tj_error err;
        CHECK_OK(tj_pattern_save(&pat, tmp("u.json"), &err), &err);
        float wf[16], bias[4] = {0.5f, -1, 2, 0}, out[2][4 * 3];
        for (int i = 0; i < 16; i++) wf[i] = (float)(i % 7) - 3.25f;
        unsigned char raw[64 + 16];
        tj_convert_from_f32(wf, 16, (tj_dtype)d, raw);
        size_t wbytes = 16 * tj_dtype_size((tj_dtype)d);
        memcpy(raw + wbytes, bias, sizeof bias);
        for (int pad = 0; pad < 2; pad++) {
            char h[512];
            /* pad 0: header length a multiple of 8; pad 1: odd, so every tensor is misaligned. */
            int hl = snprintf(h, sizeof h, "{\"fc.weight\":{\"dtype\":\"%s\",\"shape\":[4,4],\"data_offsets\":[0,%zu]},"
                              "\"fc.bias\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[%zu,%zu]}}",
                              tj_dtype_name((tj_dtype)d), wbytes, wbytes, wbytes + 16);
            int want = pad ? ((hl % 2) ? hl : hl + 1) : (hl + 7) / 8 * 8;
            while (hl < want) h[hl++] = ' ';
            h[hl] = '\0';
            put_st(tmp("u.st"), h, raw, wbytes + 16);
            tj_options opt = tj_options_default();
            opt.backend = TJ_BACKEND_REFERENCE;
            tj_context *ctx = NULL;
            tj_model *m = NULL;
            CHECK(tj_context_create(&opt, &ctx) == TJ_OK);
            tj_status s = tj_model_load(ctx, tmp("u.json"), tmp("u.st"), &m);
            CHECKF(s == TJ_OK, "dtype %d pad %d: %s", d, pad, tj_context_error(ctx));
            if (s == TJ_OK) {
                float x[3 * 4] = {1, 2, 3, 4, -1, 0.5f, 0, 2, 3, 3, -3, 1};
                int64_t xs[2] = {3, 4}, ys[2] = {3, 4};
                DLTensor xt = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 32, 1}};
                DLTensor yt = {.data = out[pad], .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
                CHECK(tj_linear(m, "fc", &xt, &yt, NULL) == TJ_OK);
            }
            tj_model_destroy(m);
            tj_context_destroy(ctx);
        }
        CHECKF(memcmp(out[0], out[1], sizeof out[0]) == 0, "dtype %s: unaligned weights give other results",
               tj_dtype_name((tj_dtype)d));
    }
}

/* M·N and M·K of a caller's tensors overflow int64: an error, not a wild allocation. */
static void test_huge_m(void)
{
    int64_t tile_ptr[2] = {0, 1};
    int32_t rows[1] = {0};
    tj_layer l = {.name = "fc", .n = 2, .k = 2, .g = 2, .ncols = 2, .ntiles = 1, .tile_ptr = tile_ptr, .tile_rows = rows};
    tj_pattern pat = {.nlayers = 1, .layers = &l};
    tj_error err;
    CHECK_OK(tj_pattern_save(&pat, tmp("m.json"), &err), &err);
    float w[4] = {1, 2, 3, 4};
    put_st(tmp("m.st"), "{\"fc.weight\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", w, sizeof w);
    tj_options opt = tj_options_default();
    opt.backend = TJ_BACKEND_REFERENCE;
    tj_context *ctx = NULL;
    tj_model *m = NULL;
    CHECK(tj_context_create(&opt, &ctx) == TJ_OK);
    CHECK(tj_model_load(ctx, tmp("m.json"), tmp("m.st"), &m) == TJ_OK);
    if (m) {
        uint16_t x[4] = {0};
        float y[4];
        int64_t xs[2] = {INT64_MAX / 2, 2}, ys[2] = {INT64_MAX / 2, 2};
        DLTensor xt = {.data = x, .device = {kDLCPU, 0}, .ndim = 2, .shape = xs, .dtype = {kDLFloat, 16, 1}};
        DLTensor yt = {.data = y, .device = {kDLCPU, 0}, .ndim = 2, .shape = ys, .dtype = {kDLFloat, 32, 1}};
        tj_status s = tj_linear(m, "fc", &xt, &yt, NULL);
        CHECKF(s == TJ_ERR_INVALID_ARGUMENT && strstr(tj_context_error(ctx), "too large"), "status %d: %s", (int)s,
               tj_context_error(ctx));
        xs[0] = ys[0] = -5;
        CHECK(tj_linear(m, "fc", &xt, &yt, NULL) != TJ_OK);
    }
    tj_model_destroy(m);
    tj_context_destroy(ctx);
}

int main(void)
{
    if (!mkdtemp(dir)) return 1;
    test_safetensors_huge_claims();
    test_npy_huge_claims();
    test_pattern_huge_dims();
    test_long_names();
    test_unaligned_weights();
    test_huge_m();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tj_test_end();
}
