/* Pattern parsing and validation: one fixture per rule (tests/fixtures/pattern/<case>/ holds
 * pattern.json and expected.txt, "OK" or a fragment of the expected message), plus the hash
 * and the writer. */
#include <dirent.h>

#include "pattern/pattern.h"
#include "pattern/random.h"
#include "tj_test.h"

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (buf) buf[n] = '\0';
    fclose(f);
    return buf;
}

static int run_fixtures(const char *root)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/pattern", root);
    DIR *d = opendir(dir);
    CHECKF(d != NULL, "cannot open %s", dir);
    if (!d) return 0;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[8192], exp_path[8192];
        snprintf(path, sizeof path, "%s/%s/pattern.json", dir, e->d_name);
        snprintf(exp_path, sizeof exp_path, "%s/%s/expected.txt", dir, e->d_name);
        char *expected = slurp(exp_path);
        CHECKF(expected != NULL, "%s: no expected.txt", e->d_name);
        if (!expected) continue;
        expected[strcspn(expected, "\n")] = '\0';
        tj_pattern *p = NULL;
        tj_error err;
        tj_error_clear(&err);
        tj_status s = tj_pattern_load(path, &p, &err);
        if (strcmp(expected, "OK") == 0) {
            CHECKF(s == TJ_OK, "%s: unexpected error: %s", e->d_name, err.msg);
        } else {
            CHECKF(s == TJ_ERR_FORMAT, "%s: expected a format error, got status %d", e->d_name, s);
            CHECKF(strstr(err.msg, expected) != NULL, "%s: message '%s' lacks '%s'", e->d_name, err.msg, expected);
            CHECKF(strstr(err.msg, path) != NULL, "%s: message '%s' does not name the file", e->d_name, err.msg);
        }
        tj_pattern_destroy(p);
        free(expected);
        count++;
    }
    closedir(d);
    return count;
}

static void test_hash_and_roundtrip(void)
{
    const char *a = "{\"format\":\"tilejit-pattern\",\"version\":1,\"layers\":[{\"name\":\"a\",\"n\":4,\"k\":5,\"g\":2,\"tiles\":[[0,2],[1,3,4]]}]}";
    const char *b = "{ \"layers\" : [ { \"tiles\" : [ [ 0 , 2 ] ,\n [1,3,4] ], \"g\": 2, \"k\": 5, \"n\": 4, \"name\": \"other\" } ],\n \"version\": 1, \"format\": \"tilejit-pattern\" }";
    const char *c = "{\"format\":\"tilejit-pattern\",\"version\":1,\"layers\":[{\"name\":\"a\",\"n\":4,\"k\":5,\"g\":2,\"tiles\":[[0,3],[1,3,4]]}]}";
    tj_pattern *pa = NULL, *pb = NULL, *pc = NULL;
    tj_error err;
    CHECK_OK(tj_pattern_parse(a, strlen(a), "a", &pa, &err), &err);
    CHECK_OK(tj_pattern_parse(b, strlen(b), "b", &pb, &err), &err);
    CHECK_OK(tj_pattern_parse(c, strlen(c), "c", &pc, &err), &err);
    if (pa && pb && pc) {
        CHECK(pa->layers[0].hash == pb->layers[0].hash); /* whitespace, key order and name do not matter */
        CHECK(pa->layers[0].hash != pc->layers[0].hash); /* one kept row does */
    }
    /* Writer round trip on random layers with cols, ew and empty tiles. */
    for (int i = 0; i < 20; i++) {
        tj_random_spec spec = {.n = 37 + i * 11, .k = 29 + i * 7, .g = 8 + i, .sparsity = 0.1 * (i % 9),
                               .mode = 1 + i % 2, .seed = (uint64_t)i, .ew_fraction = i % 3 ? 0.05 : 0,
                               .empty_tile_fraction = 0.2, .act = (tj_activation)(i % 3)};
        tj_pattern p = {.nlayers = 1};
        tj_layer l;
        CHECK_OK(tj_random_layer(&spec, "layer.x", &l, &err), &err);
        p.layers = &l;
        char *json = tj_pattern_to_json(&p);
        CHECK(json != NULL);
        tj_pattern *back = NULL;
        if (json) CHECK_OK(tj_pattern_parse(json, strlen(json), "roundtrip", &back, &err), &err);
        if (back) {
            CHECK(back->layers[0].hash == l.hash);
            CHECK(strcmp(back->layers[0].name, "layer.x") == 0);
            CHECK(tj_layer_kept(&back->layers[0]) == tj_layer_kept(&l));
        }
        tj_pattern_destroy(back);
        free(json);
        tj_layer_free(&l);
    }
    tj_pattern_destroy(pa);
    tj_pattern_destroy(pb);
    tj_pattern_destroy(pc);
}

static void test_missing_file(void)
{
    tj_pattern *p = NULL;
    tj_error err;
    CHECK(tj_pattern_load("/nonexistent/pattern.json", &p, &err) == TJ_ERR_IO);
    CHECK(strstr(err.msg, "/nonexistent/pattern.json") != NULL);
    CHECK(p == NULL);
}

int main(void)
{
    const char *root = getenv("TJ_FIXTURES");
    if (!root) root = "tests/fixtures";
    int n = run_fixtures(root);
    CHECKF(n >= 40, "only %d fixtures found", n);
    test_hash_and_roundtrip();
    test_missing_file();
    return tj_test_end();
}
