/* safetensors reader and writer: round trips (plain and streaming), and hostile files built here
 * byte by byte, each of which must give a status and a message naming the problem. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/safetensors.h"
#include "tj_test.h"

static char dir[256];

static const char *tmp_path(const char *name)
{
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

/* A file of the 8-byte length `hlen`, the header text and `ndata` bytes of data. */
static void write_raw(const char *path, uint64_t hlen, const char *header, size_t ndata)
{
    FILE *f = fopen(path, "wb");
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen >> (8 * i));
    fwrite(b, 1, 8, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < ndata; i++) fputc((int)(i & 0xff), f);
    fclose(f);
}

/* Opens a hostile file and checks status and that the message contains `want`. */
static void expect_bad(const char *label, uint64_t hlen, const char *header, size_t ndata, tj_status want_st,
                       const char *want)
{
    const char *path = tmp_path("bad.safetensors");
    write_raw(path, hlen, header, ndata);
    tj_st_file *f = NULL;
    tj_error err = {0};
    tj_status st = tj_st_open(path, &f, &err);
    CHECKF(st == want_st, "%s: status %d, want %d (%s)", label, st, want_st, err.msg);
    CHECKF(f == NULL, "%s: handle returned on failure", label);
    CHECKF(strstr(err.msg, want) != NULL, "%s: message '%s' lacks '%s'", label, err.msg, want);
    CHECKF(strstr(err.msg, path) != NULL, "%s: message '%s' does not name the file", label, err.msg);
    tj_st_close(f);
}

static void expect_bad_header(const char *label, const char *header, size_t ndata, const char *want)
{
    expect_bad(label, strlen(header), header, ndata, TJ_ERR_FORMAT, want);
}

static tj_status fill_iota(void *user, int64_t index, void *buf, tj_error *err)
{
    (void)err;
    int *calls = user;
    (*calls)++;
    float *p = buf;
    for (int i = 0; i < 6; i++) p[i] = (float)(index * 100 + i);
    return TJ_OK;
}

static tj_status fill_fail(void *user, int64_t index, void *buf, tj_error *err)
{
    (void)user, (void)buf;
    return tj_fail(err, TJ_ERR_INTERNAL, "fill failed on %lld", (long long)index);
}

static void test_round_trip(void)
{
    float w[12];
    uint16_t h[5], bf[4];
    int64_t ids[2] = {7, -3};
    for (int i = 0; i < 12; i++) w[i] = (float)i * 0.5f - 2.0f;
    for (int i = 0; i < 5; i++) h[i] = tj_f32_to_f16((float)i - 1.5f);
    for (int i = 0; i < 4; i++) bf[i] = tj_f32_to_bf16((float)i * 3.25f);
    int64_t s_w[2] = {3, 4}, s_h[1] = {5}, s_bf[2] = {2, 2}, s_ids[1] = {2};
    tj_st_out_tensor ts[] = {
        {"layer.weight", "F32", 2, s_w, w, sizeof w},
        {"layer.bias", "F16", 1, s_h, h, sizeof h},
        {"emb", "BF16", 2, s_bf, bf, sizeof bf},
        {"ids", "I64", 1, s_ids, ids, sizeof ids},
        {"scalar", "F32", 0, NULL, w, 4},
        {"empty", "F32", 2, (int64_t[]){0, 4}, NULL, 0},
    };
    const char *path = tmp_path("rt.safetensors");
    tj_error err = {0};
    CHECK_OK(tj_st_write(path, ts, 6, "{\"format\": \"pt\", \"note\": \"x\"}", &err), &err);

    /* The data section starts 8-byte aligned. */
    FILE *fp = fopen(path, "rb");
    unsigned char b[8];
    CHECK(fread(b, 1, 8, fp) == 8);
    fclose(fp);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    CHECKF(hlen % 8 == 0, "header length %llu", (unsigned long long)hlen);

    tj_st_file *f = NULL;
    CHECK_OK(tj_st_open(path, &f, &err), &err);
    if (!f) return;
    CHECK(f->ntensors == 6);
    for (int64_t i = 1; i < f->ntensors; i++) CHECK(strcmp(f->tensors[i - 1].name, f->tensors[i].name) < 0);
    const tj_st_tensor *t = tj_st_find(f, "layer.weight");
    CHECK(t && t->dtype_ok && t->dtype == TJ_F32 && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 4);
    CHECK(t && memcmp(t->data, w, sizeof w) == 0);
    CHECK(t && ((uintptr_t)t->data % 4) == 0);
    t = tj_st_find(f, "layer.bias");
    CHECK(t && t->dtype == TJ_F16 && t->ndim == 1 && t->shape[0] == 5 && memcmp(t->data, h, sizeof h) == 0);
    t = tj_st_find(f, "emb");
    CHECK(t && t->dtype == TJ_BF16 && memcmp(t->data, bf, sizeof bf) == 0);
    t = tj_st_find(f, "ids");
    CHECK(t && !t->dtype_ok && strcmp(t->dtype_str, "I64") == 0 && memcmp(t->data, ids, sizeof ids) == 0);
    t = tj_st_find(f, "scalar");
    CHECK(t && t->ndim == 0 && t->end - t->begin == 4);
    t = tj_st_find(f, "empty");
    CHECK(t && t->ndim == 2 && t->shape[0] == 0 && t->end == t->begin);
    CHECK(tj_st_find(f, "missing") == NULL);
    CHECK(tj_st_find(f, "layer") == NULL);
    CHECK(tj_st_find(f, "zzz") == NULL);
    CHECK(f->metadata_json && strstr(f->metadata_json, "\"format\":\"pt\""));

    /* Copy through everything just read (what the pruner does) and read it back. */
    tj_st_out_tensor copy[6];
    for (int64_t i = 0; i < f->ntensors; i++) {
        const tj_st_tensor *x = &f->tensors[i];
        copy[i] = (tj_st_out_tensor){x->name, x->dtype_str, x->ndim, x->shape, x->data, x->end - x->begin};
    }
    const char *path2 = tmp_path("rt2.safetensors");
    CHECK_OK(tj_st_write(path2, copy, f->ntensors, f->metadata_json, &err), &err);
    tj_st_file *g = NULL;
    CHECK_OK(tj_st_open(path2, &g, &err), &err);
    if (g) {
        CHECK(g->ntensors == f->ntensors);
        for (int64_t i = 0; i < g->ntensors && i < f->ntensors; i++) {
            CHECK(strcmp(g->tensors[i].name, f->tensors[i].name) == 0);
            CHECK(g->tensors[i].end - g->tensors[i].begin == f->tensors[i].end - f->tensors[i].begin);
            CHECK(memcmp(g->tensors[i].data, f->tensors[i].data, f->tensors[i].end - f->tensors[i].begin) == 0);
        }
        CHECK(g->metadata_json && strcmp(g->metadata_json, f->metadata_json) == 0);
    }
    tj_st_close(g);
    tj_st_close(f);
    tj_st_close(NULL);
}

static void test_stream(void)
{
    int64_t shape[2] = {2, 3};
    float direct[6] = {1, 2, 3, 4, 5, 6};
    tj_st_out_tensor ts[] = {
        {"a", "F32", 2, shape, NULL, 24},
        {"b", "F32", 2, shape, direct, 24},
        {"c", "F32", 2, shape, NULL, 24},
    };
    int calls = 0;
    tj_error err = {0};
    const char *path = tmp_path("stream.safetensors");
    CHECK_OK(tj_st_write_stream(path, ts, 3, NULL, fill_iota, &calls, &err), &err);
    CHECK(calls == 2);
    tj_st_file *f = NULL;
    CHECK_OK(tj_st_open(path, &f, &err), &err);
    if (f) {
        const float *a = tj_st_find(f, "a")->data, *b = tj_st_find(f, "b")->data, *c = tj_st_find(f, "c")->data;
        CHECK(a[0] == 0 && a[5] == 5 && c[0] == 200 && c[5] == 205 && memcmp(b, direct, 24) == 0);
        CHECK(f->metadata_json == NULL);
    }
    tj_st_close(f);

    /* A failing fill leaves no file behind and keeps its message. */
    const char *path2 = tmp_path("stream_fail.safetensors");
    tj_status st = tj_st_write_stream(path2, ts, 3, NULL, fill_fail, NULL, &err);
    CHECK(st == TJ_ERR_INTERNAL && strstr(err.msg, "fill failed on 0"));
    CHECK(access(path2, F_OK) != 0);
    /* Without a fill function, NULL data is an argument error. */
    st = tj_st_write(path2, ts, 3, NULL, &err);
    CHECK(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "'a' has no data"));
}

static void test_writer_errors(void)
{
    int64_t shape[2] = {2, 3};
    float d[6] = {0};
    tj_error err = {0};
    tj_st_out_tensor wrong_size[] = {{"a", "F32", 2, shape, d, 20}};
    tj_status st = tj_st_write(tmp_path("w.safetensors"), wrong_size, 1, NULL, &err);
    CHECKF(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "'a'") && strstr(err.msg, "24"), "%s", err.msg);
    tj_st_out_tensor dup[] = {{"a", "F32", 2, shape, d, 24}, {"a", "F32", 2, shape, d, 24}};
    st = tj_st_write(tmp_path("w.safetensors"), dup, 2, NULL, &err);
    CHECKF(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "given twice"), "%s", err.msg);
    st = tj_st_write(tmp_path("w.safetensors"), wrong_size, 0, "[1, 2]", &err);
    CHECKF(st == TJ_ERR_INVALID_ARGUMENT && strstr(err.msg, "__metadata__"), "%s", err.msg);
    st = tj_st_write("/nonexistent-dir/x.safetensors", dup, 1, NULL, &err);
    CHECKF(st == TJ_ERR_IO && strstr(err.msg, "/nonexistent-dir/x.safetensors"), "%s", err.msg);
    CHECK(access(tmp_path("w.safetensors"), F_OK) != 0);
}

static void test_malformed(void)
{
    tj_error err = {0};
    tj_st_file *f = NULL;
    tj_status st = tj_st_open(tmp_path("does-not-exist.safetensors"), &f, &err);
    CHECKF(st == TJ_ERR_IO && strstr(err.msg, "cannot open"), "%s", err.msg);

    FILE *fp = fopen(tmp_path("bad.safetensors"), "wb");
    fwrite("abc", 1, 3, fp);
    fclose(fp);
    st = tj_st_open(tmp_path("bad.safetensors"), &f, &err);
    CHECKF(st == TJ_ERR_FORMAT && strstr(err.msg, "too short"), "%s", err.msg);

    const char *ok = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    expect_bad("header longer than file", 1000, ok, 8, TJ_ERR_FORMAT, "exceeds the file size");
    expect_bad("huge header length", UINT64_MAX, ok, 8, TJ_ERR_FORMAT, "exceeds the file size");
    expect_bad("truncated data", strlen(ok), ok, 5, TJ_ERR_FORMAT, "outside the data section");
    expect_bad_header("garbage header", "{\"a\": {\"dtype\": \"F32\", \"shape\": [2", 0, "not valid JSON");
    expect_bad_header("binary header", "\x01\x02\x03\x04garbage", 0, "does not start with a JSON object");
    expect_bad_header("array header", "[1, 2, 3]", 0, "does not start with a JSON object");
    expect_bad_header("trailing garbage", "{} xyz", 0, "not valid JSON");
    expect_bad_header("entry not object", "{\"a\": 3}", 0, "tensor 'a': header entry is not an object");
    expect_bad_header("missing dtype", "{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "'dtype' is missing");
    expect_bad_header("missing shape", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "'shape' is missing");
    expect_bad_header("missing offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, "'data_offsets' is not a pair");
    expect_bad_header("negative dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
                      "'shape'[0] is not a non-negative integer");
    expect_bad_header("float dim", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8,
                      "'shape'[0]");
    expect_bad_header("shape overflow",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
                      "overflows");
    expect_bad_header("too many dims",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
                      "9 dimensions");
    expect_bad_header("size mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
                      "spans 8 bytes but shape and dtype F32 need 12");
    expect_bad_header("wrong dtype size", "{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                      "need 4");
    expect_bad_header("offsets reversed", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
                      "outside the data section");
    expect_bad_header("negative offset", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 8,
                      "outside the data section");
    expect_bad_header("overlap",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                      "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
                      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                      16, "overlaps tensor 'a'");
    expect_bad_header("duplicate names",
                      "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                      8, "duplicate");
    expect_bad_header("metadata not object", "{\"__metadata__\": 5}", 0, "'__metadata__' is not an object");
    expect_bad_header("long dtype", "{\"a\":{\"dtype\":\"FLOAT32_BUT_LONGER\",\"shape\":[1],\"data_offsets\":[0,4]}}",
                      4, "is not a dtype");

    /* Unknown dtypes are listed, flagged, and checked against the offsets only for known sizes. */
    const char *odd = "{\"q\":{\"dtype\":\"Q4_K\",\"shape\":[3],\"data_offsets\":[0,7]}}";
    write_raw(tmp_path("odd.safetensors"), strlen(odd), odd, 7);
    f = NULL;
    CHECK_OK(tj_st_open(tmp_path("odd.safetensors"), &f, &err), &err);
    if (f) CHECK(f->ntensors == 1 && !f->tensors[0].dtype_ok && strcmp(f->tensors[0].dtype_str, "Q4_K") == 0);
    tj_st_close(f);

    /* An empty header object is a valid, empty file. */
    write_raw(tmp_path("empty.safetensors"), 8, "{}      ", 0);
    f = NULL;
    CHECK_OK(tj_st_open(tmp_path("empty.safetensors"), &f, &err), &err);
    if (f) CHECK(f->ntensors == 0 && tj_st_find(f, "a") == NULL);
    tj_st_close(f);

    /* A directory is not a weights file. */
    st = tj_st_open(dir, &f, &err);
    CHECKF(st == TJ_ERR_IO && strstr(err.msg, "not a regular file"), "%s", err.msg);
}

/* Every truncation of a valid file fails cleanly (never crashes or succeeds with bad pointers). */
static void test_truncations(void)
{
    int64_t shape[2] = {4, 8};
    float d[32];
    for (int i = 0; i < 32; i++) d[i] = (float)i;
    tj_st_out_tensor ts[] = {{"w", "F32", 2, shape, d, sizeof d}, {"b", "F32", 1, shape, d, 16}};
    tj_error err = {0};
    const char *path = tmp_path("full.safetensors");
    CHECK_OK(tj_st_write(path, ts, 2, NULL, &err), &err);
    FILE *fp = fopen(path, "rb");
    unsigned char buf[1024];
    size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    int failures = 0;
    for (size_t cut = 0; cut < n; cut++) {
        const char *p2 = tmp_path("cut.safetensors");
        fp = fopen(p2, "wb");
        fwrite(buf, 1, cut, fp);
        fclose(fp);
        tj_st_file *f = NULL;
        tj_status st = tj_st_open(p2, &f, &err);
        if (st != TJ_ERR_FORMAT || f || !err.msg[0]) failures++;
        tj_st_close(f);
    }
    CHECKF(failures == 0, "%d truncations did not fail with TJ_ERR_FORMAT", failures);
}

int main(void)
{
    snprintf(dir, sizeof dir, "/tmp/tj_test_st_XXXXXX");
    if (!mkdtemp(dir)) return 1;
    test_round_trip();
    test_stream();
    test_writer_errors();
    test_malformed();
    test_truncations();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    return tj_test_end();
}
