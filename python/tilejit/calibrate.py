"""Calibrated tile-wise pruning of a BERT-family checkpoint: the driver around `tilejit prune
--calibration` (the maths runs in the C library; this module runs the model).

    python -m tilejit.calibrate --model default-model/all-MiniLM-L6-v2 --sparsity 0.5 --out OUT

1. calibration statistics of every linear layer from the dense model (H = X̃ᵀX̃, X̃ = [X, 1], float64,
   over the calibration sentences) → OUT/stats-dense.safetensors (format: docs/pruning-calibrated.md;
   needed by the profile and the one-shot prune only);
2. with --allocation measured: the profile. Each layer alone is rebuilt at densities j/16 by
   `tilejit prune --sweep-out` and the model's output (mean-pooled embedding) on held-out
   calibration sentences is compared with the dense one: loss = 1 − cosine → OUT/profile.json;
   with --latency, per-layer times at each density from `tilejit bench` go into the same table;
3. the prune itself, sequentially (default): block by block and stage by stage (query/key/value,
   attention output, intermediate, output), each stage's statistics are collected from the model
   with every earlier stage already pruned, together with the cross statistics X̃ᵀX̃_ref against the
   dense model's input of the same stage (--target dense, the default: the rebuild then matches the
   dense model's output, not the layer's own output on drifted inputs), and `tilejit prune`
   rebuilds that stage's layers
   (the allocation is computed over the whole profile every time, so it is the same for all
   stages) → OUT/pattern.json, OUT/pruned.safetensors;
4. with --evaluate N: the mean embedding cosine to the dense model on N evaluation sentences.

Sentences: Debian's `fortunes` package, split deterministically and disjointly (tilejit.bert.
corpus_split): evaluation, calibration statistics, allocation profile."""
import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time

import numpy as np

from . import bert, safetensors


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def find_tilejit(explicit=None):
    for c in (explicit, os.environ.get("TJ_TILEJIT"),
              os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "build", "cli",
                           "tilejit"), shutil.which("tilejit")):
        if c and os.path.exists(c):
            return c
    raise FileNotFoundError("tilejit not found: build it (scripts/build), or pass --tilejit / set TJ_TILEJIT")


def gram(x, chunk=2048):
    """X̃ᵀX̃ for X̃ = [x, 1] in float64 (float32 products per chunk of tokens, float64 sums)."""
    t, k = x.shape
    h = np.zeros((k + 1, k + 1))
    for s in range(0, t, chunk):
        xs = np.asarray(x[s:s + chunk], dtype=np.float32)
        h[:k, :k] += (xs.T @ xs).astype(np.float64)
        col = xs.astype(np.float64).sum(0)
        h[:k, k] += col
        h[k, :k] += col
    h[k, k] = t
    return (h + h.T) * 0.5


def cross_gram(x, xref, chunk=2048):
    """X̃ᵀX̃_ref for X̃ = [x, 1], X̃_ref = [xref, 1] (same tokens) in float64: rows follow x (the
    model being pruned), columns xref (the dense model)."""
    t, k = x.shape
    if xref.shape != x.shape:
        raise ValueError("cross statistics: inputs of shape %s and %s" % (x.shape, xref.shape))
    g = np.zeros((k + 1, k + 1))
    for s in range(0, t, chunk):
        xs = np.asarray(x[s:s + chunk], dtype=np.float32)
        rs = np.asarray(xref[s:s + chunk], dtype=np.float32)
        g[:k, :k] += (xs.T @ rs).astype(np.float64)
        g[:k, k] += xs.astype(np.float64).sum(0)
        g[k, :k] += rs.astype(np.float64).sum(0)
    g[k, k] = t
    return g


def resid_gram(x, dr, chunk=2048):
    """X̃ᵀ ΔR for X̃ = [x, 1] and ΔR [T × n] (the drift of the residual stream, dense − pruned) in
    float64: NAME.residual, so that the rebuild also makes up for that drift."""
    t, k = x.shape
    g = np.zeros((k + 1, dr.shape[1]))
    for s in range(0, t, chunk):
        xs = np.asarray(x[s:s + chunk], dtype=np.float32)
        ds = np.asarray(dr[s:s + chunk], dtype=np.float32)
        g[:k] += (xs.T @ ds).astype(np.float64)
        g[k] += ds.astype(np.float64).sum(0)
    return g


def refit_layer_norm(model, prefix, z, target):
    """Refits LayerNorm `prefix` (its weight and bias, per feature) so that LN(z) best matches the
    dense model's output `target` over the calibration tokens (least squares, 2 values per
    feature); sets them in `model` and returns {name: array}."""
    eps = model.c["layer_norm_eps"]
    z = z.astype(np.float64)
    mu = z.mean(-1, keepdims=True)
    nz = (z - mu) / np.sqrt(((z - mu) ** 2).mean(-1, keepdims=True) + eps)
    y = target.astype(np.float64)
    nm, ym = nz.mean(0), y.mean(0)
    var = ((nz - nm) ** 2).mean(0)
    cov = ((nz - nm) * (y - ym)).mean(0)
    w = np.where(var > 1e-12, cov / np.maximum(var, 1e-12), model.w[prefix + ".weight"])
    b = ym - w * nm
    upd = {prefix + ".weight": w.astype(np.float32), prefix + ".bias": b.astype(np.float32)}
    model.set_weights(upd)
    return upd


def stats_tensors(names, x, xref=None, dr=None):
    """The statistics file's tensors for layers sharing the input x; with xref (the dense model's
    input of the same layers for the same tokens) also NAME.cross, so that the rebuild targets the
    dense model's output."""
    h = gram(x)
    g = cross_gram(x, xref) if xref is not None else None
    rg = resid_gram(x, dr) if dr is not None else None
    out = {}
    for n in names:
        out[n + ".hessian"] = h
        out[n + ".tokens"] = np.array([x.shape[0]], dtype=np.int64)
        if g is not None:
            out[n + ".cross"] = g
        if rg is not None:
            out[n + ".residual"] = rg
    return out


def save_stats(path, tensors, model_name):
    safetensors.save(path, tensors, {"format": "tilejit-calibration", "version": "1", "model": model_name})


class Stages:
    """The inputs of each stage of each block for one set of sentences, on a given model."""

    def __init__(self, model, seqs):
        self.model, self.seqs = model, seqs
        self.x0, self.offs = model.embeddings(seqs)

    def inputs(self, i, x):
        """Block i's stage inputs from its input x: [x, ctx, h, f] and the block output."""
        return block_inputs(self.model, i, x, self.offs)


def block_inputs(m, i, x, offs):
    """Block i's stage inputs from its input x in model m: [x, ctx, h, f] and the block output."""
    ctx = m.attention(i, x, offs)
    h = m.attention_out(i, ctx, x)
    f = m.intermediate(i, h)
    return [x, ctx, h, f], m.output(i, f, h)


def run_from(model, i, stage, ins, offs):
    """The hidden states at the top, starting at block i's stage with its cached inputs."""
    x, ctx, h, f = ins
    if stage <= 0:
        ctx = model.attention(i, x, offs)
    if stage <= 1:
        h = model.attention_out(i, ctx, x)
    if stage <= 2:
        f = model.intermediate(i, h)
    y = model.output(i, f, h)
    for j in range(i + 1, model.c["num_hidden_layers"]):
        y = model.block(j, y, offs)
    return y


def mean_cos(e, ref):
    return float(np.mean(np.sum(e * ref, 1)))


def layer_regex(names):
    return "^(" + "|".join(re.escape(n) for n in names) + ")$"


def profile(tj, weights, stats_path, model, seqs, g, steps, tmp, layer_names, time_ms=None, measure=None):
    """{"densities": [...], "layers": [{"name", "n", "k", "loss": [...]}]}: each layer alone at
    densities j/steps (j = 0..steps), rebuilt by `tilejit prune --sweep-out`; loss = 1 − mean
    embedding cosine to the dense model on `seqs`. The model is run at the densities j in
    `measure` (default: all); at the others the loss is the layer's exact relative output error
    (from the sweep) times the loss/error ratio of the nearest measured densities, interpolated
    linearly in d (so measured points are exact and the shape between them is the layer's own)."""
    st = Stages(model, seqs)
    nblocks = model.c["num_hidden_layers"]
    x, cache = st.x0, []
    for i in range(nblocks):
        ins, x = st.inputs(i, x)
        cache.append(ins)
    ref = model.pool(x, st.offs)
    dens = [j / steps for j in range(steps + 1)]
    measure = sorted(set(measure if measure is not None else range(steps)))
    table = {"format": "tilejit-prune-profile", "version": 1, "densities": dens, "layers": [],
             "sentences": len(seqs), "tokens": int(st.offs[-1]), "measured": [dens[j] for j in measure]}
    t0 = time.time()
    # one tilejit call sweeps every layer (one process, the weights and statistics mapped once)
    sweep = os.path.join(tmp, "sweep.safetensors")
    subprocess.run([tj, "prune", "--weights", weights, "--calibration", stats_path, "--layers", layer_regex(layer_names),
                    "--g", str(g), "--sweep-out", sweep, "--sweep-steps", str(steps), "--quiet",
                    "--sweep-weights", ",".join(map(str, measure))], check=True, stdout=subprocess.DEVNULL)
    sw = safetensors.load(sweep)
    log("profile: sweeps of %d layers in %.0f s" % (len(layer_names), time.time() - t0))
    for li, name in enumerate(layer_names):
        i = int(name.split(".")[2])
        stage = next(s for s, names in enumerate(bert.STAGES) if name.endswith(tuple(names)))
        err = np.array(sw[name + ".error"], dtype=np.float64)
        w0, b0 = model.w[name + ".weight"], model.w[name + ".bias"]
        measured = {}
        for j in measure:
            model.set_weights({name + ".weight": np.array(sw["d%d/%s.weight" % (j, name)]),
                               name + ".bias": np.array(sw["d%d/%s.bias" % (j, name)])})
            e = model.pool(run_from(model, i, stage, cache[i], st.offs), st.offs)
            measured[j] = max(0.0, 1.0 - mean_cos(e, ref))
        model.set_weights({name + ".weight": w0, name + ".bias": b0})
        mj = sorted(measured)
        ratio = [measured[j] / err[j] if err[j] > 0 else 0.0 for j in mj]
        loss = []
        for j in range(steps):
            if j in measured:
                loss.append(measured[j])
            else:
                loss.append(min(2.0, float(err[j] * np.interp(j, mj, ratio))))  # 1 − cos ≤ 2
        # monotone: more density never costs more loss
        for j in range(steps - 2, -1, -1):
            loss[j] = max(loss[j], loss[j + 1])
        loss.append(0.0)
        entry = {"name": name, "n": int(w0.shape[0]), "k": int(w0.shape[1]), "loss": loss,
                 "output_error": [float(v) for v in err] + [0.0]}
        if time_ms is not None:
            entry["time_ms"] = time_ms[name]
        table["layers"].append(entry)
        log("profile: %2d/%d %-45s loss at d=1/4,1/2,3/4: %.4f %.4f %.4f  (%.0f s)"
            % (li + 1, len(layer_names), name, loss[steps // 4], loss[steps // 2], loss[3 * steps // 4], time.time() - t0))
    del sw
    os.remove(sweep)
    return table


def latency_table(tj, layer_names, shapes, steps, m, g, tmp, threads=None):
    """{layer: [ms at density j/steps, j = 0..steps]} from `tilejit bench --backend cpu --sweep`,
    once per distinct shape (a tile-wise layer's time depends on its shape and density, not on its
    values); density 0 costs nothing."""
    cache, out = {}, {}
    for name in layer_names:
        n, k = shapes[name]
        if (n, k) not in cache:
            sps = [1.0 - j / steps for j in range(1, steps + 1)]
            csv = os.path.join(tmp, "latency.csv")
            cmd = [tj, "bench", "--backend", "cpu", "--m", str(m), "--n", str(n), "--k", str(k), "--g", str(g),
                   "--sweep", ",".join("%g" % v for v in sps), "--csv", csv, "--min-time", "0.05"]
            if threads:
                cmd += ["--threads", str(threads)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            with open(csv) as f:
                lines = [l.strip().split(",") for l in f if l.strip()]
            col = lines[0].index("tilejit_ms")
            scol = lines[0].index("sparsity")
            by_s = {round(float(r[scol]), 4): float(r[col]) for r in lines[1:]}
            row = [0.0] + [by_s[round(v, 4)] for v in sps]
            cache[(n, k)] = row
            log("latency: %d x %d at M = %d: %s ms" % (n, k, m, " ".join("%.3f" % v for v in row)))
        out[name] = cache[(n, k)]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tilejit.calibrate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="a folder with config.json, model.safetensors, vocab.txt")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--sparsity", type=float, default=None, help="fraction of the linear layers' weights removed")
    ap.add_argument("--budget-ms", type=float, default=None, help="latency budget instead (needs --latency)")
    ap.add_argument("--mode", default="tw1", choices=["tw1", "tw2", "tew"])
    ap.add_argument("--ew", default=None, help="tew's residual fraction")
    ap.add_argument("--g", type=int, default=128)
    ap.add_argument("--allocation", default="measured", choices=["measured", "uniform", "global"])
    ap.add_argument("--steps", type=int, default=16, help="profile densities j/steps")
    ap.add_argument("--calib-sentences", type=int, default=1024)
    ap.add_argument("--target", default="dense", choices=["dense", "own"],
                    help="sequential rebuild target: the dense model's layer output (cross statistics, default) "
                         "or the layer's own output on the pruned model's inputs")
    ap.add_argument("--profile-sentences", type=int, default=64)
    ap.add_argument("--measure", default="2,4,8,12",
                    help="the j (of j/steps) at which the profile runs the model ('all': every one)")
    ap.add_argument("--evaluate", type=int, default=0, help="evaluation sentences (0: none)")
    ap.add_argument("--no-sequential", action="store_true", help="one prune from the dense model's statistics")
    ap.add_argument("--latency", default=None, metavar="M", help="measure per-layer times at M tokens for --budget-ms")
    ap.add_argument("--reuse-profile", action="store_true",
                    help="use OUT/stats-dense.safetensors and OUT/profile.json if they exist (same model and sentences)")
    ap.add_argument("--residual", action=argparse.BooleanOptionalAction, default=True,
                    help="with --target dense: the attention-output and output layers also make up for the "
                         "residual stream's drift (NAME.residual)")
    ap.add_argument("--ln-refit", action=argparse.BooleanOptionalAction, default=True,
                    help="with --target dense: refit each LayerNorm's weight and bias to the dense model's output")
    ap.add_argument("--damp", default=None)
    ap.add_argument("--tilejit", default=None)
    a = ap.parse_args(argv)
    if (a.sparsity is None) == (a.budget_ms is None):
        ap.error("give exactly one of --sparsity and --budget-ms")
    if a.budget_ms is not None and (a.allocation != "measured" or not a.latency):
        ap.error("--budget-ms needs --allocation measured and --latency M")
    tj = find_tilejit(a.tilejit)
    os.makedirs(a.out, exist_ok=True)
    t_all = time.time()
    cpu0 = cpu_seconds()
    model = bert.Bert.from_dir(a.model)
    wpath = os.path.join(a.model, "model.safetensors")
    tok = bert.WordPiece(os.path.join(a.model, "vocab.txt"))
    ev, cal, prof = bert.corpus_split(n_eval=max(a.evaluate, 600), n_calib=a.calib_sentences,
                                      n_profile=a.profile_sentences)
    cal_seqs = [tok.encode(s) for s in cal]
    names = bert.linear_names(model.c)
    nblocks = model.c["num_hidden_layers"]
    log("calibrate: %s, %d linear layers; %d calibration sentences (%d tokens), %d profile sentences; tilejit %s"
        % (os.path.basename(a.model.rstrip("/")), len(names), len(cal), sum(map(len, cal_seqs)), len(prof), tj))

    # 1. dense statistics
    t = time.time()
    stats_path = os.path.join(a.out, "stats-dense.safetensors")
    need_dense = a.allocation == "measured" or a.no_sequential or a.allocation == "global"
    if a.reuse_profile and os.path.exists(stats_path):
        log("calibrate: reusing %s" % stats_path)
    elif not need_dense:
        log("calibrate: no dense statistics needed (sequential %s prune)" % a.allocation)
    else:
        st = Stages(model, cal_seqs)
        x, tensors = st.x0, {}
        for i in range(nblocks):
            ins, x = st.inputs(i, x)
            for s, stage_names in enumerate(bert.STAGES):
                tensors.update(stats_tensors(["encoder.layer.%d.%s" % (i, n) for n in stage_names], ins[s]))
        save_stats(stats_path, tensors, os.path.basename(a.model.rstrip("/")))
        del tensors, st
    t_stats = time.time() - t
    log("calibrate: dense statistics in %.1f s -> %s" % (t_stats, stats_path))

    # 2. profile
    prof_path = os.path.join(a.out, "profile.json")
    t_prof = 0.0
    common = ["--g", str(a.g), "--mode", a.mode] + (["--ew", a.ew] if a.ew else []) + \
             (["--damp", a.damp] if a.damp else [])
    if a.allocation == "measured":
        if a.reuse_profile and os.path.exists(prof_path):
            log("calibrate: reusing %s" % prof_path)
        else:
            t = time.time()
            times = None
            if a.latency:
                shapes = {n: model.w[n + ".weight"].shape for n in names}
                times = latency_table(tj, names, shapes, a.steps, int(a.latency), a.g, a.out)
            measure = None if a.measure == "all" else [int(v) for v in a.measure.split(",")]
            table = profile(tj, wpath, stats_path, model, [tok.encode(s) for s in prof], a.g, a.steps, a.out, names,
                            times, measure)
            with open(prof_path, "w") as f:
                json.dump(table, f, indent=1)
            t_prof = time.time() - t
            log("calibrate: profile in %.1f s -> %s" % (t_prof, prof_path))
        common += ["--allocation", "measured", "--profile", prof_path]
    else:
        common += ["--allocation", a.allocation]
    common += ["--sparsity", str(a.sparsity)] if a.sparsity is not None else ["--budget-ms", str(a.budget_ms)]

    # 3. prune
    t = time.time()
    pattern = os.path.join(a.out, "pattern.json")
    pruned = os.path.join(a.out, "pruned.safetensors")
    if a.no_sequential or a.allocation == "global":
        subprocess.run([tj, "prune", "--weights", wpath, "--calibration", stats_path, "--layers", layer_regex(names),
                        "-o", pattern, "--pruned-weights", pruned, "--quiet"] + common, check=True,
                       stdout=subprocess.DEVNULL)
    else:
        cur = wpath
        st = Stages(model, cal_seqs)
        x, layers = st.x0, []
        dense = bert.Bert(model.w, model.c) if a.target == "dense" else None
        xd = st.x0
        tmp_w = [os.path.join(a.out, "tmp-a.safetensors"), os.path.join(a.out, "tmp-b.safetensors")]
        step = 0
        ln_updates = {}
        for i in range(nblocks):
            ins = [x, None, None, None]
            ins_d, xd_next = block_inputs(dense, i, xd, st.offs) if dense is not None else (None, None)
            for s, stage_names in enumerate(bert.STAGES):
                if s == 1:
                    ins[1] = model.attention(i, x, st.offs)
                elif s == 2:
                    if ins_d is not None and a.ln_refit:
                        p = "encoder.layer.%d.attention.output." % i
                        ln_updates.update(refit_layer_norm(model, p + "LayerNorm",
                                                           model.linear(p + "dense", ins[1]) + x, ins_d[2]))
                    ins[2] = model.attention_out(i, ins[1], x)
                elif s == 3:
                    ins[3] = model.intermediate(i, ins[2])
                group = ["encoder.layer.%d.%s" % (i, n) for n in stage_names]
                spath = os.path.join(a.out, "stats-stage.safetensors")
                dr = None
                if ins_d is not None and a.residual and s in (1, 3):
                    # attention.output.dense adds to the block input x, output.dense to h
                    r = 0 if s == 1 else 2
                    dr = ins_d[r] - ins[r]
                save_stats(spath, stats_tensors(group, ins[s], ins_d[s] if ins_d is not None else None, dr),
                           os.path.basename(a.model.rstrip("/")))
                out_w = tmp_w[step % 2]
                ppath = os.path.join(a.out, "pattern-stage.json")
                subprocess.run([tj, "prune", "--weights", cur, "--calibration", spath, "--layers", layer_regex(group),
                                "-o", ppath, "--pruned-weights", out_w, "--quiet"] + common, check=True,
                               stdout=subprocess.DEVNULL)
                with open(ppath) as f:
                    layers += json.load(f)["layers"]
                pw = safetensors.load(out_w)
                model.set_weights({k: np.array(pw[n + k[len(n):]]) for n in group for k in (n + ".weight", n + ".bias")})
                cur = out_w
                step += 1
            if dense is not None and a.ln_refit:
                p = "encoder.layer.%d.output." % i
                ln_updates.update(refit_layer_norm(model, p + "LayerNorm",
                                                   model.linear(p + "dense", ins[3]) + ins[2], xd_next))
            x = model.output(i, ins[3], ins[2])
            xd = xd_next
            log("calibrate: block %d/%d pruned (%.0f s)" % (i + 1, nblocks, time.time() - t))
        if ln_updates:
            pw = dict(safetensors.load(cur))
            pw.update(ln_updates)
            safetensors.save(pruned, pw, {"format": "pt"})
            del pw
            os.remove(cur)
        else:
            os.replace(cur, pruned)
        for p in tmp_w + [os.path.join(a.out, "stats-stage.safetensors"), os.path.join(a.out, "pattern-stage.json")]:
            if os.path.exists(p):
                os.remove(p)
        with open(pattern, "w") as f:
            json.dump({"format": "tilejit-pattern", "version": 1, "layers": layers}, f)
    t_prune = time.time() - t
    total = time.time() - t_all
    summary = {"model": os.path.basename(a.model.rstrip("/")), "mode": a.mode, "g": a.g, "allocation": a.allocation,
               "sparsity": a.sparsity, "budget_ms": a.budget_ms, "sequential": not (a.no_sequential or a.allocation == "global"),
               "target": a.target,
               "calibration_sentences": len(cal), "calibration_tokens": sum(map(len, cal_seqs)), "profile_sentences": len(prof) if a.allocation == "measured" else 0,
               "seconds": {"statistics": round(t_stats, 1), "profile": round(t_prof, 1), "prune": round(t_prune, 1),
                           "total": round(total, 1)},
               "cpu_seconds": round(cpu_seconds() - cpu0, 1)}
    # density actually reached
    with open(pattern) as f:
        pl = json.load(f)["layers"]
    kept = sum(kept_of(l) for l in pl)
    allw = sum(l["n"] * l["k"] for l in pl)
    summary["density"] = kept / allw
    log("calibrate: pruned to density %.4f in %.1f s, %.1f s of CPU (statistics %.1f, profile %.1f, prune %.1f) -> %s, %s"
        % (kept / allw, total, summary["cpu_seconds"], t_stats, t_prof, t_prune, pattern, pruned))

    # 4. evaluation
    if a.evaluate:
        t = time.time()
        ev_seqs = [tok.encode(s) for s in ev[:a.evaluate]]
        dense = bert.Bert.from_dir(a.model).embed_batch(ev_seqs)
        pw = safetensors.load(pruned)
        pm = bert.Bert(pw, model.c)
        e = pm.embed_batch(ev_seqs)
        summary["evaluation_sentences"] = len(ev_seqs)
        summary["embedding_cosine"] = mean_cos(e, dense)
        log("calibrate: mean embedding cosine to dense on %d evaluation sentences: %.4f (%.0f s)"
            % (len(ev_seqs), summary["embedding_cosine"], time.time() - t))
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(json.dumps(summary))
    return 0


def cpu_seconds():
    """user + system CPU time of this process and its finished children (tilejit prune)."""
    r = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    return sum(x.ru_utime + x.ru_stime for x in r)


def kept_of(layer):
    g, tiles = layer["g"], layer["tiles"]
    ncols = len(layer["cols"]) if "cols" in layer else layer["n"]
    kept = 0
    for t, rows in enumerate(tiles):
        kept += len(rows) * min(g, ncols - t * g)
    ew = layer.get("ew")
    return kept + (len(ew["indices"]) if ew else 0)


if __name__ == "__main__":
    sys.exit(main())
