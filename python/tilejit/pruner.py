"""libtilejit's calibrated pruner in this process (tilejit/prune.h through ctypes), for drivers that
hold the model and collect the statistics themselves: tilejit.torch.prune (any PyTorch model) and
python -m tilejit.calibrate. The maths runs in C, the same code as `tilejit prune --calibration`
and `--sweep-out`, given the weights and statistics as arrays instead of files
(docs/pruning-calibrated.md). Needs NumPy, not PyTorch."""
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from . import _lib


class Pruner:
    """tj_prune_calibrated_layers, tj_prune_calibrated_sweep_layer and tj_prune_allocate."""

    def __init__(self, g=128, mode="tw1", ew=None, damp=None, threads=0):
        self.lib = _lib.library()
        if not hasattr(self.lib, "tj_prune_calibrated_layers"):
            raise OSError("%s has no tj_prune_calibrated_layers: rebuild it (scripts/build)" % self.lib._tilejit_path)
        if mode not in _lib.PRUNE_MODES:
            raise ValueError("tilejit: mode %r: expected one of %s" % (mode, ", ".join(_lib.PRUNE_MODES)))
        o = self.lib.tj_prune_calibrated_options_default()
        o.prune.g = int(g)
        o.prune.mode = _lib.PRUNE_MODES[mode]
        if ew is not None:
            o.prune.ew_fraction = float(ew)
        if damp is not None:
            o.damp = float(damp)
        o.threads = int(threads)
        self.o = o
        self.mode = mode

    def _layer(self, name, w, b, h, cross, tokens, density, resid=None, *, keep):
        """The tj_prune_calibrated_layer of one layer; `keep` holds the arrays it points into."""
        L = _lib.CalibratedLayer()
        w = np.ascontiguousarray(w, dtype=np.float32)
        h = np.ascontiguousarray(h, dtype=np.float64)
        nm = name.encode()
        keep += [w, h, nm]
        L.layer.name = nm
        L.layer.n, L.layer.k = w.shape
        L.layer.w, L.layer.wdt = w.ctypes.data, _lib.TJ_F32
        if h.shape != (w.shape[1] + 1,) * 2:
            raise ValueError("%s: statistics of shape %s for a layer of shape %s" % (name, h.shape, w.shape))
        L.hessian, L.tokens, L.density = h.ctypes.data, int(tokens), float(density)
        if b is not None:
            b = np.ascontiguousarray(b, dtype=np.float32)
            keep.append(b)
            L.bias, L.bdt = b.ctypes.data, _lib.TJ_F32
        if cross is not None:
            cross = np.ascontiguousarray(cross, dtype=np.float64)
            if cross.shape != h.shape:
                raise ValueError("%s: cross statistics of shape %s, H %s" % (name, cross.shape, h.shape))
            keep.append(cross)
            L.cross = cross.ctypes.data
        if resid is not None:
            resid = np.ascontiguousarray(resid, dtype=np.float64)
            if resid.shape != (w.shape[1] + 1, w.shape[0]):
                raise ValueError("%s: residual statistics of shape %s for a layer of shape %s"
                                 % (name, resid.shape, w.shape))
            keep.append(resid)
            L.residual = resid.ctypes.data
        return L

    @staticmethod
    def _fail(what, err):
        raise RuntimeError("tilejit: %s: %s" % (what, err.msg.decode(errors="replace")))

    def prune(self, layers):
        """layers: [(name, w, b or None, H, cross or None, tokens, density[, residual])] → (the
        pattern's layer objects, in the order given; [(rebuilt weights, bias)] as float32 arrays)."""
        c, keep = ctypes, []
        arr = (_lib.CalibratedLayer * len(layers))(*[self._layer(*l, keep=keep) for l in layers])
        outs = [(np.empty(l[1].shape, np.float32), np.empty(l[1].shape[0], np.float32)) for l in layers]
        wp = (c.c_void_p * len(layers))(*[w.ctypes.data for w, _ in outs])
        bp = (c.c_void_p * len(layers))(*[b.ctypes.data for _, b in outs])
        pat, err = c.c_void_p(), _lib.Error()
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
        err = _lib.Error()
        if self.lib.tj_prune_calibrated_sweep_layer(c.byref(L), dens, steps, c.byref(self.o), wp, bp, errors,
                                                    c.byref(err)):
            self._fail("sweep of " + name, err)
        return np.array(errors[:], dtype=np.float64), outs

    def allocate(self, table, sparsity, budget_ms):
        """{layer: density} over a loss table (a dict in the tilejit-prune-profile format, or the
        path of one): the knapsack of `tilejit prune --allocation measured`; tew keeps at least
        its residual, as there."""
        c = ctypes
        path, tmp = table, None
        if isinstance(table, dict):
            fd, tmp = tempfile.mkstemp(suffix=".json", prefix="tilejit-profile-")
            with os.fdopen(fd, "w") as f:
                json.dump(table, f)
            path = tmp
        prof, err = c.POINTER(_lib.PruneProfile)(), _lib.Error()
        try:
            if self.lib.tj_prune_profile_load(path.encode(), c.byref(prof), c.byref(err)):
                self._fail("loss table", err)
        finally:
            if tmp:
                os.unlink(tmp)
        try:
            nl = prof.contents.nl
            dens = (c.c_double * nl)()
            if self.lib.tj_prune_allocate(prof, float(sparsity or 0), float(budget_ms or 0), dens, None, c.byref(err)):
                self._fail("allocation", err)
            names = [prof.contents.names[i].decode() for i in range(nl)]
        finally:
            self.lib.tj_prune_profile_destroy(prof)
        ew = self.o.prune.ew_fraction if self.mode == "tew" else 0.0
        return {n: max(d, ew) for n, d in zip(names, dens)}


def kept_of(layer):
    """Weights a pattern layer (a dict of the tilejit-pattern JSON) keeps."""
    g, tiles = layer["g"], layer["tiles"]
    ncols = len(layer["cols"]) if "cols" in layer else layer["n"]
    kept = sum(len(rows) * min(g, ncols - t * g) for t, rows in enumerate(tiles))
    ew = layer.get("ew")
    return kept + (len(ew["indices"]) if ew else 0)


def find_tilejit(explicit=None):
    """The tilejit command: explicit, $TJ_TILEJIT, the source tree's build/, or PATH."""
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for c in (explicit, os.environ.get("TJ_TILEJIT"), os.path.join(here, "build", "cli", "tilejit"),
              shutil.which("tilejit")):
        if c and os.path.exists(c):
            return c
    raise FileNotFoundError("tilejit not found: build it (scripts/build), or pass --tilejit / set TJ_TILEJIT")


def latency_table(shapes, steps, m, g, threads=None, tilejit=None, log=None):
    """{layer: [ms at density j/steps, j = 0..steps]} for {layer: (n, k)}: the time the runtime
    takes for such a layer at M tokens, from `tilejit bench --backend cpu --sweep` (column
    `run_ms` where the command reports the path the runtime would run, else `tilejit_ms`), once
    per distinct shape (a tile-wise layer's time depends on its shape and density, not on its
    values); density 0 costs nothing."""
    tj = find_tilejit(tilejit)
    cache, out = {}, {}
    with tempfile.TemporaryDirectory(prefix="tilejit-latency-") as tmp:
        for name, (n, k) in shapes.items():
            if (n, k) not in cache:
                sps = [1.0 - j / steps for j in range(1, steps + 1)]
                csv = os.path.join(tmp, "latency.csv")
                cmd = [tj, "bench", "--backend", "cpu", "--m", str(m), "--n", str(n), "--k", str(k), "--g", str(g),
                       "--sweep", ",".join("%g" % v for v in sps), "--csv", csv, "--min-time", "0.05"]
                if threads:
                    cmd += ["--threads", str(threads)]
                r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                if r.returncode != 0:
                    raise RuntimeError("tilejit: timing %d x %d failed: %s" % (n, k, r.stderr.strip()))
                with open(csv) as f:
                    lines = [l.strip().split(",") for l in f if l.strip()]
                col = lines[0].index("run_ms") if "run_ms" in lines[0] else lines[0].index("tilejit_ms")
                scol = lines[0].index("sparsity")
                by_s = {round(float(r[scol]), 4): float(r[col]) for r in lines[1:]}
                cache[(n, k)] = [0.0] + [by_s[round(v, 4)] for v in sps]
                if log:
                    log("latency: %d x %d at M = %d: %s ms" % (n, k, m, " ".join("%.3f" % v for v in cache[(n, k)])))
            out[name] = cache[(n, k)]
    return out


def log_stderr(msg):
    print(msg, file=sys.stderr, flush=True)
