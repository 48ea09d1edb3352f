"""Calibrated tile-wise pruning of a BERT-family checkpoint: the driver that runs the model and
calls libtilejit's calibrated pruner (tilejit/prune.h; the maths runs in C, the same code as
`tilejit prune --calibration`, here in this process through ctypes, without files between them).

    python -m tilejit.calibrate --model default-model/all-MiniLM-L6-v2 --sparsity 0.5 --out OUT

1. calibration statistics of every linear layer from the dense model (H = X̃ᵀX̃, X̃ = [X, 1], float64
   sums of float32 products, over the calibration sentences), kept in memory and written to
   OUT/stats-dense.safetensors (format: docs/pruning-calibrated.md; for --reuse-profile and the
   one-shot prune). With the sequential dense-target prune, the dense model's input of every stage
   is kept too (about 1.5 GB for MiniLM and 1,024 sentences), so the dense model runs once;
2. with --allocation measured: the profile. Each layer alone is rebuilt at densities j/16 by the
   library's sweep (tj_prune_calibrated_sweep_layer; the next layer's sweep runs while the model
   runs for this one) and the model's output (mean-pooled embedding) on held-out calibration
   sentences is compared with the dense one: loss = 1 − cosine → OUT/profile.json. The model runs
   from the pruned layer's stage on, from cached dense inputs, all measured densities in one pass;
   with --latency, per-layer times at each density from `tilejit bench` go into the same table;
3. the prune itself, sequentially (default): block by block and stage by stage (query/key/value,
   attention output, intermediate, output), each stage's statistics are collected from the model
   with every earlier stage already pruned, together with the cross statistics X̃ᵀX̃_ref against the
   dense model's input of the same stage (--target dense, the default: the rebuild then matches the
   dense model's output, not the layer's own output on drifted inputs; the attention-output and
   output layers also get NAME.residual, the drift of the residual they are added to, and the
   LayerNorm after each is refitted to the dense model's output: --residual, --ln-refit), and the library
   (tj_prune_calibrated_layers) rebuilds that stage's layers at the densities allocated once over
   the whole profile (tj_prune_allocate) → OUT/pattern.json, OUT/pruned.safetensors. With
   --no-sequential or --allocation global: one `tilejit prune --calibration` call instead;
4. with --evaluate N: the mean embedding cosine to the dense model on N evaluation sentences.

Sentences: Debian's `fortunes` package, split deterministically and disjointly (tilejit.bert.
corpus_split): evaluation, calibration statistics, allocation profile."""
import argparse
import ctypes
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
        h[:k, :k] += xs.T @ xs  # float32 products, added in float64
        col = xs.sum(0, dtype=np.float64)
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
        g[:k, :k] += xs.T @ rs
        g[:k, k] += xs.sum(0, dtype=np.float64)
        g[k, :k] += rs.sum(0, dtype=np.float64)
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
        g[:k] += xs.T @ ds  # float32 products, added in float64
        g[k] += ds.sum(0, dtype=np.float64)
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


def stats_tensors(names, h, tokens, g=None):
    """The statistics file's tensors for layers sharing one input: H (gram), the token count and,
    with g (cross_gram against the dense model's input), NAME.cross, so that the rebuild targets
    the dense model's output."""
    out = {}
    for n in names:
        out[n + ".hessian"] = h
        out[n + ".tokens"] = np.array([tokens], dtype=np.int64)
        if g is not None:
            out[n + ".cross"] = g
    return out


def save_stats(path, tensors, model_name):
    safetensors.save(path, tensors, {"format": "tilejit-calibration", "version": "1", "model": model_name})


class Pruner:
    """libtilejit's calibrated pruner in this process: tj_prune_calibrated_layers and
    tj_prune_calibrated_sweep_layer (tilejit/prune.h), the code behind `tilejit prune
    --calibration` and `--sweep-out`, given the weights and statistics as arrays instead of files."""

    def __init__(self, g, mode="tw1", ew=None, damp=None, threads=0):
        from . import _lib
        self.lib = _lib.library()
        if not hasattr(self.lib, "tj_prune_calibrated_layers"):
            raise OSError("%s has no tj_prune_calibrated_layers: rebuild it (scripts/build)" % self.lib._tilejit_path)
        self._lib = _lib
        o = self.lib.tj_prune_calibrated_options_default()
        o.prune.g = int(g)
        o.prune.mode = _lib.PRUNE_MODES[mode]
        if ew is not None:
            o.prune.ew_fraction = float(ew)
        if damp is not None:
            o.damp = float(damp)
        o.threads = int(threads)
        self.o = o

    def _layer(self, name, w, b, h, cross, tokens, density, resid=None, *, keep):
        """The tj_prune_calibrated_layer of one layer; `keep` holds the arrays it points into."""
        L = self._lib.CalibratedLayer()
        w = np.ascontiguousarray(w, dtype=np.float32)
        h = np.ascontiguousarray(h, dtype=np.float64)
        nm = name.encode()
        keep += [w, h, nm]
        L.layer.name = nm
        L.layer.n, L.layer.k = w.shape
        L.layer.w, L.layer.wdt = w.ctypes.data, self._lib.TJ_F32
        if h.shape != (w.shape[1] + 1,) * 2:
            raise ValueError("%s: statistics of shape %s for a layer of shape %s" % (name, h.shape, w.shape))
        L.hessian, L.tokens, L.density = h.ctypes.data, int(tokens), float(density)
        if b is not None:
            b = np.ascontiguousarray(b, dtype=np.float32)
            keep.append(b)
            L.bias, L.bdt = b.ctypes.data, self._lib.TJ_F32
        if cross is not None:
            cross = np.ascontiguousarray(cross, dtype=np.float64)
            if cross.shape != h.shape:
                raise ValueError("%s: cross statistics of shape %s, H %s" % (name, cross.shape, h.shape))
            keep.append(cross)
            L.cross = cross.ctypes.data
        if resid is not None:
            resid = np.ascontiguousarray(resid, dtype=np.float64)
            if resid.shape != (w.shape[1] + 1, w.shape[0]):
                raise ValueError("%s: residual statistics of shape %s for a layer of shape %s" % (name, resid.shape, w.shape))
            keep.append(resid)
            L.residual = resid.ctypes.data
        return L

    def _fail(self, what, err):
        raise RuntimeError("tilejit: %s: %s" % (what, err.msg.decode(errors="replace")))

    def prune(self, layers):
        """layers: [(name, w, b or None, H, cross or None, tokens, density[, residual])] → (the
        pattern's layer objects, in the order given; [(rebuilt weights, bias)] as float32 arrays)."""
        c, keep = ctypes, []
        arr = (self._lib.CalibratedLayer * len(layers))(*[self._layer(*l, keep=keep) for l in layers])
        outs = [(np.empty(l[1].shape, np.float32), np.empty(l[1].shape[0], np.float32)) for l in layers]
        wp = (c.c_void_p * len(layers))(*[w.ctypes.data for w, _ in outs])
        bp = (c.c_void_p * len(layers))(*[b.ctypes.data for _, b in outs])
        pat, err = c.c_void_p(), self._lib.Error()
        if self.lib.tj_prune_calibrated_layers(arr, len(layers), c.byref(self.o), c.byref(pat), wp, bp, c.byref(err)):
            self._fail("prune", err)
        text = self.lib.tj_pattern_to_json(pat)
        try:
            if not text:
                raise MemoryError("tilejit: out of memory serialising the pattern")
            doc = json.loads(c.string_at(text).decode())
        finally:
            self.lib.tj_free(text)
            self.lib.tj_pattern_destroy(pat)
        return doc["layers"], outs

    def sweep(self, name, w, b, h, tokens, steps, which):
        """The layer rebuilt at densities j/steps (j = 0 .. steps − 1): (its relative output error at
        each, {j: (weights, bias)} for the j in `which`)."""
        c, keep = ctypes, []
        L = self._layer(name, w, b, h, None, tokens, 1.0, keep=keep)
        n, k = L.layer.n, L.layer.k
        outs = {j: (np.empty((n, k), np.float32), np.empty(n, np.float32)) for j in which}
        wp = (c.c_void_p * steps)(*[outs[j][0].ctypes.data if j in outs else None for j in range(steps)])
        bp = (c.c_void_p * steps)(*[outs[j][1].ctypes.data if j in outs else None for j in range(steps)])
        dens = (c.c_double * steps)(*[j / steps for j in range(steps)])
        errors = (c.c_double * steps)()
        err = self._lib.Error()
        if self.lib.tj_prune_calibrated_sweep_layer(c.byref(L), dens, steps, c.byref(self.o), wp, bp, errors,
                                                    c.byref(err)):
            self._fail("sweep of " + name, err)
        return np.array(errors[:], dtype=np.float64), outs

    def allocate(self, profile_path, sparsity, budget_ms):
        """{layer: density} over the loss table (the knapsack of `tilejit prune --allocation
        measured`; tew keeps at least its residual, as there)."""
        c = ctypes
        prof, err = c.POINTER(self._lib.PruneProfile)(), self._lib.Error()
        if self.lib.tj_prune_profile_load(profile_path.encode(), c.byref(prof), c.byref(err)):
            self._fail(profile_path, err)
        try:
            nl = prof.contents.nl
            dens = (c.c_double * nl)()
            if self.lib.tj_prune_allocate(prof, float(sparsity or 0), float(budget_ms or 0), dens, None, c.byref(err)):
                self._fail("allocation", err)
            names = [prof.contents.names[i].decode() for i in range(nl)]
        finally:
            self.lib.tj_prune_profile_destroy(prof)
        ew = self.o.prune.ew_fraction if self.o.prune.mode == self._lib.PRUNE_MODES["tew"] else 0.0
        return {n: max(d, ew) for n, d in zip(names, dens)}


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


def offs_repeated(offs, copies):
    """Sentence offsets of `copies` copies of a token stream one after the other."""
    t = offs[-1]
    return np.concatenate([offs[:-1] + c * t for c in range(copies)] + [[copies * t]])


def run_from_variants(model, i, stage, ins, offs, name, variants):
    """run_from for several versions of one layer at once: the cached inputs repeated once per
    (weight, bias) in `variants`, copy c computed with variants[c] for layer `name`; the hidden
    states of all copies one after the other."""
    t = offs[-1]
    need = ((0,), (0, 1), (2,), (2, 3))[stage]  # the cached inputs run_from reads from this stage on
    reps = [np.concatenate([a] * len(variants)) if s in need else None for s, a in enumerate(ins)]
    wts = [(np.ascontiguousarray(np.asarray(w, dtype=model.dtype).T), np.asarray(b, dtype=model.dtype))
           for w, b in variants]
    base = model.linear

    def linear(n, x):
        if n != name:
            return base(n, x)
        y = np.empty((x.shape[0], wts[0][0].shape[1]), dtype=x.dtype)
        for c, (wt, b) in enumerate(wts):  # as Bert._linear does: x @ Wᵀ, then + b
            np.matmul(x[c * t:(c + 1) * t], wt, out=y[c * t:(c + 1) * t])
            y[c * t:(c + 1) * t] += b
        return y
    model.linear = linear
    try:
        return run_from(model, i, stage, reps, offs_repeated(offs, len(variants)))
    finally:
        model.linear = base


def mean_cos(e, ref):
    return float(np.mean(np.sum(e * ref, 1)))


def layer_regex(names):
    return "^(" + "|".join(re.escape(n) for n in names) + ")$"


def profile(pruner, stats, model, seqs, steps, layer_names, time_ms=None, measure=None):
    """{"densities": [...], "layers": [{"name", "n", "k", "loss": [...]}]}: each layer alone at
    densities j/steps (j = 0..steps), rebuilt by the library's sweep (Pruner.sweep, from the dense
    statistics `stats`: {layer: (H, tokens)}); loss = 1 − mean embedding cosine to the dense model
    on `seqs`. The model is run at the densities j in `measure` (default: all), from the pruned
    layer's stage on (the dense inputs of every stage are cached); at the others the loss is the
    layer's exact relative output error (from the sweep) times the loss/error ratio of the nearest
    measured densities, interpolated linearly in d (so measured points are exact and the shape
    between them is the layer's own)."""
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
    # the library sweeps the next layer (in C, the GIL released) while this one runs the model
    from concurrent.futures import ThreadPoolExecutor
    pool = ThreadPoolExecutor(1)

    def sweep(name):
        return pruner.sweep(name, model.w[name + ".weight"], model.w[name + ".bias"], stats[name][0], stats[name][1],
                            steps, measure)
    pending = pool.submit(sweep, layer_names[0]) if layer_names else None
    for li, name in enumerate(layer_names):
        i = int(name.split(".")[2])
        stage = next(s for s, names in enumerate(bert.STAGES) if name.endswith(tuple(names)))
        w0 = model.w[name + ".weight"]
        err, sw = pending.result()
        pending = pool.submit(sweep, layer_names[li + 1]) if li + 1 < len(layer_names) else None
        # every measured density in one run of the model: the cached inputs repeated, the layer's
        # weights chosen per copy (rows are independent outside attention, which is per sentence)
        e = model.pool(run_from_variants(model, i, stage, cache[i], st.offs, name, [sw[j] for j in measure]),
                       offs_repeated(st.offs, len(measure)))
        nseq = len(seqs)
        measured = {j: max(0.0, 1.0 - mean_cos(e[c * nseq:(c + 1) * nseq], ref)) for c, j in enumerate(measure)}
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
    pool.shutdown()
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


def sequential_prune(pruner, model, seqs, names, a, prof_path, dense_ins=None):
    """Block by block and stage by stage: each stage's statistics from the model with every
    earlier stage already pruned (with --target dense also X̃ᵀX̃_ref against the dense model's
    input of the stage: `dense_ins` per block when the statistics pass kept them, else the dense
    model runs in lockstep), then that stage's layers pruned and rebuilt in this process at their
    allocated densities. Updates `model`'s weights; returns the pattern's layers."""
    if a.allocation == "measured":
        density = pruner.allocate(prof_path, a.sparsity, a.budget_ms)
        missing = [n for n in names if n not in density]
        if missing:
            raise ValueError("%s: no entry for layer '%s' (a loss table for another model?)" % (prof_path, missing[0]))
    else:
        density = {n: 1.0 - a.sparsity for n in names}
    t = time.time()
    st = Stages(model, seqs)
    x, xd, layers = st.x0, st.x0, []
    dense = bert.Bert(model.w, model.c) if a.target == "dense" and dense_ins is None else None
    for i in range(model.c["num_hidden_layers"]):
        ins = [x, None, None, None]
        ins_d = None
        if a.target == "dense":
            if dense_ins is not None:
                ins_d, dense_ins[i] = dense_ins[i], None  # each block's dense inputs are used once
                if i == 0:
                    # the first block's input is the embeddings in both models: the same array
                    # then, as in lockstep (X̃ᵀX̃_ref of one array is NumPy's syrk, bit for bit H)
                    ins_d = [x] + ins_d[1:]
            else:
                ins_d, xd = block_inputs(dense, i, xd, st.offs)
        for s, stage_names in enumerate(bert.STAGES):
            if s == 1:
                ins[1] = model.attention(i, x, st.offs)
            elif s == 2:
                if ins_d is not None and a.ln_refit:
                    p = "encoder.layer.%d.attention.output." % i
                    refit_layer_norm(model, p + "LayerNorm", model.linear(p + "dense", ins[1]) + x, ins_d[2])
                ins[2] = model.attention_out(i, ins[1], x)
            elif s == 3:
                ins[3] = model.intermediate(i, ins[2])
            # sorted: the order `tilejit prune` gives a stage's layers (natural name order)
            group = sorted("encoder.layer.%d.%s" % (i, n) for n in stage_names)
            h = gram(ins[s])
            g = cross_gram(ins[s], ins_d[s]) if ins_d is not None else None
            # attention.output.dense's output is added to the block input x, output.dense's to h:
            # with the dense inputs at hand their drift joins the target (NAME.residual)
            rg = None
            if ins_d is not None and a.residual and s in (1, 3):
                r = 0 if s == 1 else 2
                rg = resid_gram(ins[s], ins_d[r] - ins[r])
            got, rebuilt = pruner.prune([(n, model.w[n + ".weight"], model.w.get(n + ".bias"), h, g, ins[s].shape[0],
                                          density[n], rg) for n in group])
            layers += got
            model.set_weights({k: v for n, (w, b) in zip(group, rebuilt) for k, v in ((n + ".weight", w),
                                                                                    (n + ".bias", b))})
        if ins_d is not None and a.ln_refit:
            # the block's dense output: the next block's dense input (or the lockstep's)
            yd = dense_ins[i + 1][0] if dense_ins is not None else xd
            p = "encoder.layer.%d.output." % i
            refit_layer_norm(model, p + "LayerNorm", model.linear(p + "dense", ins[3]) + ins[2], yd)
        x = model.output(i, ins[3], ins[2])
        log("calibrate: block %d/%d pruned (%.0f s)" % (i + 1, model.c["num_hidden_layers"], time.time() - t))
    return layers


def save_pruned(path, weights_path, model, layer_names):
    """The pruned weights file, as `tilejit prune --pruned-weights` writes it: every tensor of the
    checkpoint (same names, dtypes and metadata) with the model's current values, i.e. the rebuilt
    layers' weights and biases (a bias the checkpoint lacked is added as F32)."""
    import struct
    with open(weights_path, "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    meta = header.pop("__metadata__", None)
    out, dtypes = {}, {}
    for n, t in header.items():
        v = model.w[n]
        if t["dtype"] == "F16":
            v = np.asarray(v, dtype=np.float16)
        elif t["dtype"] == "BF16":
            v, dtypes[n] = _to_bf16(v), "BF16"
        out[n] = v
    for n in layer_names:
        if n + ".bias" not in out:
            out[n + ".bias"] = np.asarray(model.w[n + ".bias"], dtype=np.float32)
    tmp = path + ".tmp%d" % os.getpid()
    safetensors.save(tmp, out, meta, dtypes)
    os.replace(tmp, path)


def _to_bf16(v):
    """float32 → bfloat16 bits, rounded to nearest even (NaN stays NaN), as the library does."""
    u = np.ascontiguousarray(v, dtype=np.float32).view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    r[nan] = ((u[nan] >> 16) | np.uint32(0x40)).astype(np.uint16)
    return r


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

    # 1. dense statistics (kept in memory; the file is for --reuse-profile and the one-shot prune)
    t = time.time()
    stats_path = os.path.join(a.out, "stats-dense.safetensors")
    sequential = not (a.no_sequential or a.allocation == "global")
    need_dense = a.allocation == "measured" or not sequential
    dense_stats, dense_ins = {}, None
    if a.reuse_profile and os.path.exists(stats_path):
        log("calibrate: reusing %s" % stats_path)
        sf = safetensors.load(stats_path)
        dense_stats = {n: (sf[n + ".hessian"], int(sf[n + ".tokens"][0])) for n in names if n + ".hessian" in sf}
        del sf
    elif not need_dense:
        log("calibrate: no dense statistics needed (sequential %s prune)" % a.allocation)
    else:
        st = Stages(model, cal_seqs)
        x, tensors = st.x0, {}
        # the sequential prune's dense target needs the dense model's input of every stage again
        # for the same sentences: keep them rather than run the dense model a second time
        dense_ins = [] if sequential and a.target == "dense" else None
        for i in range(nblocks):
            ins, x = st.inputs(i, x)
            for s, stage_names in enumerate(bert.STAGES):
                group = ["encoder.layer.%d.%s" % (i, n) for n in stage_names]
                h = gram(ins[s])
                for n in group:
                    dense_stats[n] = (h, ins[s].shape[0])
                tensors.update(stats_tensors(group, h, ins[s].shape[0]))
            if dense_ins is not None:
                dense_ins.append(ins)
        if dense_ins is not None:
            dense_ins.append([x])  # the last block's output: its output LayerNorm's refit target
        save_stats(stats_path, tensors, os.path.basename(a.model.rstrip("/")))
        del tensors, st
    t_stats = time.time() - t
    cpu_stats = cpu_seconds() - cpu0
    log("calibrate: dense statistics in %.1f s (%.1f s of CPU) -> %s" % (t_stats, cpu_stats, stats_path))

    # 2. profile
    prof_path = os.path.join(a.out, "profile.json")
    t_prof = 0.0
    cpu_t = cpu_seconds()
    pruner = Pruner(a.g, a.mode, a.ew, a.damp)
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
            table = profile(pruner, dense_stats, model, [tok.encode(s) for s in prof], a.steps, names, times, measure)
            with open(prof_path, "w") as f:
                json.dump(table, f, indent=1)
            t_prof = time.time() - t
            log("calibrate: profile in %.1f s (%.1f s of CPU) -> %s" % (t_prof, cpu_seconds() - cpu_t, prof_path))
        common += ["--allocation", "measured", "--profile", prof_path]
    else:
        common += ["--allocation", a.allocation]
    common += ["--sparsity", str(a.sparsity)] if a.sparsity is not None else ["--budget-ms", str(a.budget_ms)]
    del dense_stats

    cpu_prof = cpu_seconds() - cpu_t

    # 3. prune
    t = time.time()
    cpu_t = cpu_seconds()
    pattern = os.path.join(a.out, "pattern.json")
    pruned = os.path.join(a.out, "pruned.safetensors")
    if not sequential:
        subprocess.run([tj, "prune", "--weights", wpath, "--calibration", stats_path, "--layers", layer_regex(names),
                        "-o", pattern, "--pruned-weights", pruned, "--quiet"] + common, check=True,
                       stdout=subprocess.DEVNULL)
    else:
        layers = sequential_prune(pruner, model, cal_seqs, names, a, prof_path, dense_ins)
        dense_ins = None
        save_pruned(pruned, wpath, model, names)
        with open(pattern, "w") as f:
            json.dump({"format": "tilejit-pattern", "version": 1, "layers": layers}, f)
    t_prune = time.time() - t
    cpu_prune = cpu_seconds() - cpu_t
    total = time.time() - t_all
    summary = {"model": os.path.basename(a.model.rstrip("/")), "mode": a.mode, "g": a.g, "allocation": a.allocation,
               "sparsity": a.sparsity, "budget_ms": a.budget_ms, "sequential": not (a.no_sequential or a.allocation == "global"),
               "target": a.target,
               "calibration_sentences": len(cal), "calibration_tokens": sum(map(len, cal_seqs)), "profile_sentences": len(prof) if a.allocation == "measured" else 0,
               "seconds": {"statistics": round(t_stats, 1), "profile": round(t_prof, 1), "prune": round(t_prune, 1),
                           "total": round(total, 1)},
               "cpu_seconds": round(cpu_seconds() - cpu0, 1),
               "cpu_seconds_per_phase": {"statistics": round(cpu_stats, 1), "profile": round(cpu_prof, 1),
                                         "prune": round(cpu_prune, 1)}}
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
