/* libFuzzer target: pattern JSON → parser + validator (pattern/parse.c, pattern/validate.c). Any input
 * must give TJ_OK or a clean error with a message. An accepted pattern must survive the rest of
 * the host-side pipeline: the writer's JSON parses back to the same layers (same hashes), the
 * plan builds, and the derived counts are consistent. */
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "pattern/pattern.h"
#include "gen/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tj_pattern *p = NULL;
    tj_error err;
    tj_error_clear(&err);
    tj_status s = tj_pattern_parse((const char *)data, size, "fuzz.json", &p, &err);
    if (s != TJ_OK) {
        FUZZ_ASSERT(p == NULL);
        FUZZ_ASSERT(err.msg[0] != '\0');
        return 0;
    }
    for (int64_t i = 0; i < p->nlayers; i++) {
        const tj_layer *l = &p->layers[i];
        FUZZ_ASSERT(tj_layer_validate(l, "revalidate", &err) == TJ_OK);
        int64_t kept = tj_layer_kept(l);
        FUZZ_ASSERT(kept >= 0 && kept <= l->n * l->k);
        tj_plan plan;
        if (tj_plan_build(l, 8, &plan, &err) == TJ_OK) {
            FUZZ_ASSERT(plan.packed_elems >= kept - l->ew_nnz);
            for (int64_t t = 0; t < l->ntiles; t++) FUZZ_ASSERT(plan.order[t] >= 0 && plan.order[t] < l->ntiles);
            tj_plan_free(&plan);
        }
    }
    /* Round trip through the writer. */
    char *json = tj_pattern_to_json(p);
    if (json) {
        tj_pattern *q = NULL;
        s = tj_pattern_parse(json, strlen(json), "roundtrip.json", &q, &err);
        if (s != TJ_OK) fprintf(stderr, "round trip failed: %s\n", err.msg);
        FUZZ_ASSERT(s == TJ_OK);
        FUZZ_ASSERT(q->nlayers == p->nlayers);
        for (int64_t i = 0; i < p->nlayers; i++) {
            FUZZ_ASSERT(strcmp(q->layers[i].name, p->layers[i].name) == 0);
            FUZZ_ASSERT(q->layers[i].hash == p->layers[i].hash);
        }
        tj_pattern_destroy(q);
        free(json);
    }
    tj_pattern_destroy(p);
    return 0;
}
