/* tilejit/prune.h — allocation of pruning densities across layers (public API).
 *
 * Calibrated pruning (`tilejit prune --calibration`, docs/pruning-calibrated.md) rebuilds each
 * layer at a density; which density each layer gets comes from a measured loss table (one row
 * per layer: 1 − output cosine of the model with that layer alone pruned to density d_j) and a
 * budget, in kept weights or in milliseconds. These functions solve that allocation:
 *
 *     tj_prune_profile *p;
 *     if (tj_prune_profile_load("profile.json", &p, &err) != TJ_OK) ...
 *     double *d = malloc(p->nl * sizeof *d);
 *     tj_prune_allocate(p, 0.5, 0, d, &err);     // half the weights, least summed loss
 *     tj_prune_profile_destroy(p);
 *
 * Errors: a status, and the message in the caller's tj_error (base/error.h; the message is
 * err.msg). Every output is written only on success. */
#ifndef TILEJIT_PRUNE_H
#define TILEJIT_PRUNE_H

#include <stdint.h>

#include "tilejit.h"
#include "tilejit/export.h"

typedef struct tj_error tj_error;

/* Multiple-choice knapsack: for each of nl layers pick one of nc choices (cost[l·nc + c] ≥ 0,
 * loss[l·nc + c] finite) minimising Σ loss with Σ cost ≤ budget. Costs are integers in units
 * (weights, or time quanta, see tj_prune_allocate); the dynamic program is exact over them.
 * choice[l] receives the index. An infeasible budget (the cheapest choices exceed it) is an
 * error that names the minimum. Ties go to the cheaper total, then to lower choice indices. */
TJ_API tj_status tj_knapsack_solve(const int64_t *cost, const double *loss, int64_t nl, int64_t nc, int64_t budget,
                            int64_t *choice, tj_error *err);

/* The loss table written by the profiling driver (JSON, format "tilejit-prune-profile", v1):
 *   {"format": "tilejit-prune-profile", "version": 1, "densities": [d_0, ...],
 *    "layers": [{"name": ..., "n": N, "k": K, "loss": [...], "time_ms": [...]}, ...]}
 * densities in [0, 1]; loss (1 − output cosine with that layer alone at d_j) one per density;
 * time_ms optional (needed for a latency budget). */
typedef struct tj_prune_profile {
    int64_t nd, nl;
    double *densities;
    char **names;
    int64_t *n, *k;
    double *loss;    /* [nl × nd] */
    double *time_ms; /* [nl × nd], or NULL when some layer has none */
} tj_prune_profile;

TJ_API tj_status tj_prune_profile_load(const char *path, tj_prune_profile **out, tj_error *err);
TJ_API void tj_prune_profile_destroy(tj_prune_profile *p);

/* Per-layer densities from a profile: with budget_ms ≤ 0, the kept weights of all profile
 * layers (round(d·k)·n each) stay within (1 − sparsity) of their total; with budget_ms > 0,
 * their summed time_ms stays within budget_ms (times quantised to budget/4096, rounded up, so
 * the budget is never exceeded). density[l] for profile layer l. */
TJ_API tj_status tj_prune_allocate(const tj_prune_profile *p, double sparsity, double budget_ms, double *density,
                            tj_error *err);

#endif
