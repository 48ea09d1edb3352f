/* Allocation of densities across layers (calib.h): the multiple-choice knapsack (an exact
 * dynamic program over integer costs) and the measured loss table it reads, with a weight budget
 * (kept weights) or a latency budget (per-layer times at each density). */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "prune/calib.h"

#define KNAPSACK_MAX_BUDGET ((int64_t)1 << 24)

tj_status tj_knapsack_solve(const int64_t *cost, const double *loss, int64_t nl, int64_t nc, int64_t budget,
                            int64_t *choice, tj_error *err)
{
    if (nl < 1 || nc < 1 || nc > 65535)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "knapsack: %lld layers with %lld choices each", (long long)nl,
                       (long long)nc);
    if (budget < 0 || budget > KNAPSACK_MAX_BUDGET)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "knapsack: budget %lld units is outside [0, %lld]", (long long)budget,
                       (long long)KNAPSACK_MAX_BUDGET);
    int64_t minsum = 0;
    for (int64_t l = 0; l < nl; l++) {
        int64_t mc = INT64_MAX;
        for (int64_t c = 0; c < nc; c++) {
            if (cost[l * nc + c] < 0 || !isfinite(loss[l * nc + c]))
                return tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "knapsack: layer %lld choice %lld has cost %lld, loss %g",
                               (long long)l, (long long)c, (long long)cost[l * nc + c], loss[l * nc + c]);
            if (cost[l * nc + c] < mc) mc = cost[l * nc + c];
        }
        minsum += mc;
    }
    if (minsum > budget)
        return tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                       "knapsack: the budget (%lld units) is below the cheapest allocation (%lld units)", (long long)budget,
                       (long long)minsum);
    /* best[c]: least loss of the layers so far with total cost ≤ c. */
    int64_t B = budget + 1;
    double *best = malloc((size_t)B * sizeof *best), *next = malloc((size_t)B * sizeof *next);
    uint16_t *pick = malloc((size_t)(nl * B) * sizeof *pick);
    if (!best || !next || !pick) {
        free(best), free(next), free(pick);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "knapsack: out of memory for %lld × %lld states", (long long)nl,
                       (long long)B);
    }
    for (int64_t c = 0; c < B; c++) best[c] = 0;
    for (int64_t l = 0; l < nl; l++) {
        uint16_t *pl = pick + l * B;
        for (int64_t c = 0; c < B; c++) {
            double v = INFINITY;
            uint16_t arg = 0;
            for (int64_t j = 0; j < nc; j++) {
                int64_t cj = cost[l * nc + j];
                if (cj > c) continue;
                double t = best[c - cj] + loss[l * nc + j];
                if (t < v) {
                    v = t;
                    arg = (uint16_t)j;
                }
            }
            next[c] = v;
            pl[c] = arg;
        }
        double *tmp = best;
        best = next;
        next = tmp;
    }
    int64_t c = budget;
    for (int64_t l = nl - 1; l >= 0; l--) {
        choice[l] = pick[l * B + c];
        c -= cost[l * nc + choice[l]];
    }
    free(best), free(next), free(pick);
    return TJ_OK;
}

void tj_prune_profile_destroy(tj_prune_profile *p)
{
    if (!p) return;
    for (int64_t i = 0; p->names && i < p->nl; i++) free(p->names[i]);
    free(p->names);
    free(p->densities);
    free(p->n);
    free(p->k);
    free(p->loss);
    free(p->time_ms);
    free(p);
}

static tj_status read_numbers(const char *path, const char *what, json_t *arr, int64_t count, double *out,
                              tj_error *err)
{
    if (!json_is_array(arr) || (int64_t)json_array_size(arr) != count)
        return tj_fail(err, TJ_ERR_FORMAT, "%s: %s must be an array of %lld numbers", path, what, (long long)count);
    for (int64_t i = 0; i < count; i++) {
        json_t *v = json_array_get(arr, (size_t)i);
        if (!json_is_number(v) || !isfinite(json_number_value(v)))
            return tj_fail(err, TJ_ERR_FORMAT, "%s: %s[%lld] is not a finite number", path, what, (long long)i);
        out[i] = json_number_value(v);
    }
    return TJ_OK;
}

tj_status tj_prune_profile_load(const char *path, tj_prune_profile **out, tj_error *err)
{
    *out = NULL;
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (!root) return tj_fail(err, TJ_ERR_FORMAT, "%s: line %d: %s", path, je.line, je.text);
    tj_status s = TJ_OK;
    tj_prune_profile *p = calloc(1, sizeof *p);
    if (!p) {
        json_decref(root);
        return tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
    }
    json_t *fmt = json_object_get(root, "format"), *ver = json_object_get(root, "version");
    json_t *dens = json_object_get(root, "densities"), *layers = json_object_get(root, "layers");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "tilejit-prune-profile") != 0 ||
        json_integer_value(ver) != 1) {
        s = tj_fail(err, TJ_ERR_FORMAT, "%s: not a loss table (expected \"format\": \"tilejit-prune-profile\", \"version\": 1)",
                    path);
        goto fail;
    }
    if (!json_is_array(dens) || json_array_size(dens) < 1 || json_array_size(dens) > 65535 || !json_is_array(layers) ||
        json_array_size(layers) < 1 || json_array_size(layers) > TJ_MAX_LAYERS) {
        s = tj_fail(err, TJ_ERR_FORMAT, "%s: needs a non-empty \"densities\" array and a non-empty \"layers\" array", path);
        goto fail;
    }
    p->nd = (int64_t)json_array_size(dens);
    p->nl = (int64_t)json_array_size(layers);
    p->densities = malloc((size_t)p->nd * sizeof *p->densities);
    p->names = calloc((size_t)p->nl, sizeof *p->names);
    p->n = malloc((size_t)p->nl * sizeof *p->n);
    p->k = malloc((size_t)p->nl * sizeof *p->k);
    p->loss = malloc((size_t)(p->nl * p->nd) * sizeof *p->loss);
    p->time_ms = malloc((size_t)(p->nl * p->nd) * sizeof *p->time_ms);
    if (!p->densities || !p->names || !p->n || !p->k || !p->loss || !p->time_ms) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
        goto fail;
    }
    if ((s = read_numbers(path, "densities", dens, p->nd, p->densities, err)) != TJ_OK) goto fail;
    for (int64_t j = 0; j < p->nd; j++)
        if (!(p->densities[j] >= 0 && p->densities[j] <= 1)) {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "%s: density %g is outside [0, 1]", path, p->densities[j]);
            goto fail;
        }
    int have_time = 1;
    for (int64_t l = 0; l < p->nl; l++) {
        json_t *L = json_array_get(layers, (size_t)l);
        json_t *name = json_object_get(L, "name"), *n = json_object_get(L, "n"), *k = json_object_get(L, "k");
        if (!json_is_string(name) || !json_is_integer(n) || !json_is_integer(k) || json_integer_value(n) < 1 ||
            json_integer_value(k) < 1 || json_integer_value(n) > TJ_MAX_DIM || json_integer_value(k) > TJ_MAX_DIM) {
            s = tj_fail(err, TJ_ERR_FORMAT, "%s: layers[%lld] needs \"name\", and \"n\" and \"k\" in [1, %lld]", path,
                        (long long)l, (long long)TJ_MAX_DIM);
            goto fail;
        }
        if (!(p->names[l] = strdup(json_string_value(name)))) {
            s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "%s: out of memory", path);
            goto fail;
        }
        p->n[l] = json_integer_value(n);
        p->k[l] = json_integer_value(k);
        char what[64];
        snprintf(what, sizeof what, "layers[%lld].loss", (long long)l);
        if ((s = read_numbers(path, what, json_object_get(L, "loss"), p->nd, p->loss + l * p->nd, err)) != TJ_OK)
            goto fail;
        json_t *t = json_object_get(L, "time_ms");
        if (!t) {
            have_time = 0;
            continue;
        }
        snprintf(what, sizeof what, "layers[%lld].time_ms", (long long)l);
        if ((s = read_numbers(path, what, t, p->nd, p->time_ms + l * p->nd, err)) != TJ_OK) goto fail;
        for (int64_t j = 0; j < p->nd; j++)
            if (p->time_ms[l * p->nd + j] < 0) {
                s = tj_fail(err, TJ_ERR_FORMAT, "%s: %s has a negative time", path, what);
                goto fail;
            }
    }
    if (!have_time) {
        free(p->time_ms);
        p->time_ms = NULL;
    }
    json_decref(root);
    *out = p;
    return TJ_OK;
fail:
    json_decref(root);
    tj_prune_profile_destroy(p);
    return s;
}

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

tj_status tj_prune_allocate(const tj_prune_profile *p, double sparsity, double budget_ms, double *density,
                            int64_t *choice_out, tj_error *err)
{
    const int64_t nl = p->nl, nd = p->nd;
    int64_t *cost = calloc((size_t)(nl * nd), sizeof *cost), *choice = calloc((size_t)nl, sizeof *choice);
    tj_status s = TJ_OK;
    if (!cost || !choice) {
        s = tj_fail(err, TJ_ERR_OUT_OF_MEMORY, "allocation: out of memory");
        goto done;
    }
    int64_t budget;
    if (budget_ms > 0) {
        if (!p->time_ms) {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT,
                        "allocation: a latency budget needs \"time_ms\" for every layer of the loss table");
            goto done;
        }
        const int64_t Q = 4096;
        double unit = budget_ms / (double)Q;
        for (int64_t i = 0; i < nl * nd; i++) cost[i] = (int64_t)ceil(p->time_ms[i] / unit - 1e-9);
        budget = Q;
    } else {
        if (!(sparsity >= 0 && sparsity < 1)) {
            s = tj_fail(err, TJ_ERR_INVALID_ARGUMENT, "allocation: sparsity %g is outside [0, 1)", sparsity);
            goto done;
        }
        int64_t total = 0, g = 0;
        for (int64_t l = 0; l < nl; l++) {
            total += p->n[l] * p->k[l];
            for (int64_t j = 0; j < nd; j++) {
                int64_t q = llround(p->densities[j] * (double)p->k[l]);
                cost[l * nd + j] = q * p->n[l];
                g = gcd64(g, cost[l * nd + j]);
            }
        }
        budget = (int64_t)floor((1.0 - sparsity) * (double)total);
        if (g == 0) g = 1;
        /* Exact in units of the costs' gcd; beyond 2^20 units, costs round up (never over budget). */
        int64_t unit = g;
        if (budget / unit > ((int64_t)1 << 20)) unit = (budget >> 20) + 1;
        for (int64_t i = 0; i < nl * nd; i++) cost[i] = (cost[i] + unit - 1) / unit;
        budget /= unit;
    }
    if ((s = tj_knapsack_solve(cost, p->loss, nl, nd, budget, choice, err)) != TJ_OK) {
        tj_error_prefix(err, "allocation%s", budget_ms > 0 ? " (latency budget)" : "");
        goto done;
    }
    for (int64_t l = 0; l < nl; l++) {
        density[l] = p->densities[choice[l]];
        if (choice_out) choice_out[l] = choice[l];
    }
done:
    free(cost);
    free(choice);
    return s;
}
