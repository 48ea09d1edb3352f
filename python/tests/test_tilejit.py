"""Tests of the Python binding: layers, linear() on NumPy arrays and DLPack producers against a
float64 NumPy computation of the semantics of docs/architecture.md, errors as exceptions. Exit 77 (skip)
without NumPy. Run: TILEJIT_LIBRARY=build/libtilejit.so python3 python/tests/test_tilejit.py"""
import json
import math
import os
import sys
import tempfile
import threading
import unittest

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipping (scripts/install-deps installs it)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tilejit  # noqa: E402
from tilejit import safetensors  # noqa: E402

BACKEND = os.environ.get("TJ_PY_BACKEND", "auto")


def random_layer(rng, name, n, k, g, sparsity, cols_frac=1.0, ew=0.0, act="none"):
    """A random TW pattern entry and its dense mask."""
    ncols = max(1, int(round(n * cols_frac)))
    cols = np.sort(rng.choice(n, ncols, replace=False)) if ncols < n else np.arange(n)
    mask = np.zeros((n, k), dtype=bool)
    tiles = []
    for t in range(0, ncols, g):
        keep = max(0, int(round(k * (1 - sparsity))))
        rows = np.sort(rng.choice(k, keep, replace=False))
        tiles.append(rows.tolist())
        for c in cols[t:t + g]:
            mask[c, rows] = True
    entry = {"name": name, "n": n, "k": k, "g": g, "tiles": tiles, "activation": act}
    if ncols < n:
        entry["cols"] = cols.tolist()
    if ew > 0:
        free = np.argwhere(~mask)
        pick = free[rng.choice(len(free), int(ew * n * k), replace=False)]
        pick = pick[np.lexsort((pick[:, 1], pick[:, 0]))]
        indptr = np.zeros(n + 1, dtype=np.int64)
        for r, _ in pick:
            indptr[r + 1] += 1
        entry["ew"] = {"indptr": np.cumsum(indptr).tolist(), "indices": pick[:, 1].tolist()}
        mask[pick[:, 0], pick[:, 1]] = True
    return entry, mask


def expected(x, w, mask, bias, act):
    y = x.astype(np.float64) @ (w.astype(np.float64) * mask).T
    if bias is not None:
        y += bias.astype(np.float64)
    if act == "relu":
        y = np.maximum(y, 0)
    elif act == "gelu":
        y = 0.5 * y * (1 + np.vectorize(math.erf)(y / math.sqrt(2)))
    return y


def relerr(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-30))


class Producer:
    """A DLPack producer that is not NumPy: only __dlpack__ / __dlpack_device__."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, stream=None):
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class Producer1x:
    """A DLPack 1.x producer that records how it was asked and which capsule it gave."""

    def __init__(self, a):
        self.a, self.asked, self.versioned = a, [], None

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        import ctypes
        self.asked.append(max_version)
        cap = self.a.__dlpack__(max_version=max_version) if max_version else self.a.__dlpack__()
        valid = ctypes.pythonapi.PyCapsule_IsValid
        valid.restype, valid.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
        self.versioned = bool(valid(cap, b"dltensor_versioned"))
        return cap

    def __dlpack_device__(self):
        return self.a.__dlpack_device__()


class Wrapped(Producer):
    """A producer with an array-API namespace whose from_dlpack makes another Wrapped."""

    def __array_namespace__(self):
        return WrappedNamespace


class WrappedNamespace:
    @staticmethod
    def from_dlpack(obj):
        return Wrapped(np.from_dlpack(obj))


class Binding(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        rng = np.random.default_rng(7)
        specs = [
            ("enc.q", 96, 64, 32, 0.5, 1.0, 0.0, "none", True, "F32"),
            ("enc.ffn_in", 160, 64, 32, 0.75, 0.5, 0.0, "gelu", True, "F32"),
            ("enc.ffn_out", 64, 160, 16, 0.6, 1.0, 0.02, "relu", False, "F16"),
            ("enc.empty", 40, 24, 16, 1.0, 1.0, 0.0, "none", True, "F32"),
        ]
        layers, tensors, cls.ref = [], {}, {}
        for name, n, k, g, s, cf, ew, act, has_bias, dt in specs:
            entry, mask = random_layer(rng, name, n, k, g, s, cf, ew, act)
            layers.append(entry)
            w = rng.standard_normal((n, k)).astype(np.float32)
            b = rng.standard_normal(n).astype(np.float32) if has_bias else None
            tensors[name + ".weight"] = w.astype(np.float16) if dt == "F16" else w
            if b is not None:
                tensors[name + ".bias"] = b
            cls.ref[name] = (tensors[name + ".weight"].astype(np.float32), mask, b, act)
        tensors["embeddings.position_ids"] = np.arange(8, dtype=np.int64).reshape(1, 8)
        cls.tensors, cls.layers = tensors, layers
        cls.pattern = os.path.join(cls.tmp.name, "p.json")
        cls.weights = os.path.join(cls.tmp.name, "w.safetensors")
        with open(cls.pattern, "w") as f:
            json.dump({"format": "tilejit-pattern", "version": 1, "layers": layers}, f)
        safetensors.save(cls.weights, tensors)
        cls.model = tilejit.load(cls.pattern, cls.weights, backend=BACKEND,
                                 cache_dir=os.path.join(cls.tmp.name, "cache"))
        cls.bound = 2e-3 if cls.model.backend == "cuda" else 1e-5

    @classmethod
    def tearDownClass(cls):
        cls.model.close()
        cls.tmp.cleanup()

    def check(self, name, x, y):
        w, mask, b, act = self.ref[name]
        want = expected(np.asarray(x, np.float32), w, mask, b, act)
        self.assertEqual(np.asarray(y).shape, want.shape)
        self.assertTrue(np.all(np.isfinite(np.asarray(y))))
        self.assertLessEqual(relerr(y, want), self.bound, name)

    def test_layers(self):
        m = self.model
        self.assertEqual(len(m), 4)
        self.assertEqual([l.name for l in m.layers], ["enc.q", "enc.ffn_in", "enc.ffn_out", "enc.empty"])
        l = m.layer("enc.ffn_in")
        self.assertEqual((l.index, l.n, l.k, l.g, l.kept_cols, l.tiles, l.activation, l.has_bias),
                         (1, 160, 64, 32, 80, 3, "gelu", True))
        self.assertEqual(l.kept_weights, int(self.ref["enc.ffn_in"][1].sum()))
        self.assertAlmostEqual(l.density, self.ref["enc.ffn_in"][1].mean())
        self.assertGreater(m.layer(2).ew_nnz, 0)
        self.assertFalse(m.layer(2).has_bias)
        self.assertEqual(m.layer(-1).name, "enc.empty")
        self.assertIn(m.backend, ("reference", "cpu", "cuda"))
        self.assertGreaterEqual(m.load_seconds, 0)
        self.assertTrue(tilejit.version())

    def test_numpy_all_layers(self):
        rng = np.random.default_rng(1)
        for l in self.model.layers:
            for mm in (1, 7, 33):
                x = rng.uniform(-1, 1, (mm, l.k)).astype(np.float32)
                y = self.model.linear(l.name, x)
                self.assertIsInstance(y, np.ndarray)
                self.assertEqual(y.dtype, np.float32)
                self.check(l.name, x, y)
                y2 = self.model.linear(l.index, x)
                np.testing.assert_array_equal(y, y2)

    def test_pruned_output_is_bias(self):
        x = np.random.default_rng(2).uniform(-1, 1, (5, 24)).astype(np.float32)
        y = self.model.linear("enc.empty", x)
        np.testing.assert_allclose(y, np.broadcast_to(self.ref["enc.empty"][2], y.shape), rtol=0, atol=0)

    def test_dtypes_and_strides(self):
        rng = np.random.default_rng(3)
        base = rng.uniform(-1, 1, (64, 30)).astype(np.float32)
        xt = base.T  # [30 × 64] non-contiguous view
        self.check("enc.q", xt, self.model.linear("enc.q", xt))
        x16 = rng.uniform(-1, 1, (9, 64)).astype(np.float16)
        self.check("enc.q", x16.astype(np.float32), self.model.linear("enc.q", x16))
        x64 = rng.uniform(-1, 1, (9, 64))
        self.check("enc.q", x64.astype(np.float32), self.model.linear("enc.q", x64))
        xs = rng.uniform(-1, 1, (20, 128)).astype(np.float32)[::2, ::2]  # both strides > 1
        self.check("enc.q", xs, self.model.linear("enc.q", xs))

    def test_out_argument(self):
        x = np.random.default_rng(4).uniform(-1, 1, (6, 64)).astype(np.float32)
        out = np.full((6, 96), np.nan, dtype=np.float32)
        r = self.model.linear("enc.q", x, out=out)
        self.assertIs(r, out)
        self.check("enc.q", x, out)
        with self.assertRaises(tilejit.TilejitError) as cm:
            self.model.linear("enc.q", x, out=np.empty((6, 95), np.float32))
        self.assertEqual(cm.exception.status_name, "invalid argument")
        self.assertIn("shape", str(cm.exception))

    def test_dlpack_producer(self):
        x = np.random.default_rng(5).uniform(-1, 1, (11, 64)).astype(np.float32)
        y = self.model.linear("enc.ffn_in", Producer(x))  # no namespace: NumPy comes back
        self.assertIsInstance(y, np.ndarray)
        self.check("enc.ffn_in", x, y)
        w = self.model.linear("enc.ffn_in", Wrapped(x))  # same kind as the input
        self.assertIsInstance(w, Wrapped)
        self.check("enc.ffn_in", x, w.a)
        xt = np.ascontiguousarray(x.T).T  # a strided tensor through the capsule
        self.check("enc.ffn_in", x, self.model.linear("enc.ffn_in", Producer(xt)))
        out = np.empty((11, 160), np.float32)
        self.model.linear("enc.ffn_in", Producer(x), out=Producer(out))
        self.check("enc.ffn_in", x, out)

    def test_dlpack_versioned(self):
        if not hasattr(np, "from_dlpack") or tuple(int(v) for v in np.__version__.split(".")[:2]) < (2, 1):
            self.skipTest("NumPy < 2.1 exports no DLPack 1.x capsules")
        rng = np.random.default_rng(10)
        x = rng.uniform(-1, 1, (5, 64)).astype(np.float32)
        x.flags.writeable = False  # read-only input: fine, tilejit only reads it
        px, po = Producer1x(x), Producer1x(np.full((5, 96), np.nan, np.float32))
        self.model.linear("enc.q", px, out=po)
        self.assertEqual(px.asked, [(1, 0)])
        self.assertTrue(px.versioned and po.versioned)
        self.check("enc.q", x, po.a)
        ro = np.zeros((5, 96), np.float32)
        ro.flags.writeable = False
        with self.assertRaises(ValueError) as cm:  # the read-only flag of a versioned capsule
            self.model.linear("enc.q", x, out=Producer1x(ro))
        self.assertIn("read-only", str(cm.exception))
        self.assertTrue(np.all(ro == 0))

    def test_dlpack_legacy_fallback(self):
        x = np.random.default_rng(11).uniform(-1, 1, (3, 64)).astype(np.float32)

        class Legacy:  # predates max_version: TypeError, then the legacy call
            calls = 0

            def __dlpack__(self, stream=None):
                Legacy.calls += 1
                return x.__dlpack__()

            def __dlpack_device__(self):
                return x.__dlpack_device__()
        self.check("enc.q", x, self.model.linear("enc.q", Legacy()))
        self.assertEqual(Legacy.calls, 1)

    def test_from_tensors(self):
        pat = {"format": "tilejit-pattern", "version": 1, "layers": self.layers}
        x = np.random.default_rng(12).uniform(-1, 1, (7, 160)).astype(np.float32)
        with tilejit.Model.from_tensors(pat, self.tensors, backend=BACKEND) as m:
            self.assertEqual(m.copied_bytes, 0)  # compact NumPy arrays are used in place
            self.assertEqual([l.name for l in m.layers], [l.name for l in self.model.layers])
            self.check("enc.ffn_out", x, m.linear("enc.ffn_out", x))
            np.testing.assert_array_equal(m.linear("enc.ffn_out", x), self.model.linear("enc.ffn_out", x))
        strided = dict(self.tensors)
        w = self.tensors["enc.ffn_out.weight"]
        strided["enc.ffn_out.weight"] = Producer(np.asfortranarray(w))  # a strided DLPack tensor
        with tilejit.Context(backend=BACKEND) as ctx:
            m = tilejit.Model.from_tensors(json.dumps(pat), strided, context=ctx)
            self.assertEqual(m.copied_bytes, w.nbytes)
            self.check("enc.ffn_out", x, m.linear("enc.ffn_out", x))
            m.close()
        missing = {k: v for k, v in self.tensors.items() if k != "enc.q.weight"}
        with self.assertRaises(tilejit.TilejitError) as cm:
            tilejit.Model.from_tensors(pat, missing, backend="reference")
        self.assertEqual(cm.exception.status_name, "not found")
        self.assertIn("enc.q.weight", str(cm.exception))

    def test_prune_in_memory(self):
        with tilejit.Context(backend="reference") as ctx:
            p = ctx.prune({"a": self.tensors["enc.ffn_in.weight"], "b": self.tensors["enc.q.weight"]}, 0.5, g=32)
            self.assertEqual([l["name"] for l in p["layers"]], ["a", "b"])
            with self.assertRaises(tilejit.TilejitError):
                ctx.prune({"a": self.tensors["enc.q.weight"]}, 0.5, mode="bogus")

    def test_dlpack_roundtrip_numpy(self):
        x = np.random.default_rng(6).uniform(-1, 1, (4, 160)).astype(np.float32)
        y = np.from_dlpack(self.model.linear("enc.ffn_out", Producer(x)))
        self.check("enc.ffn_out", x, y)

    def test_threads(self):
        rng = np.random.default_rng(8)
        xs = [rng.uniform(-1, 1, (17, 64)).astype(np.float32) for _ in range(8)]
        ys = [None] * len(xs)

        def work(i):
            for _ in range(5):
                ys[i] = self.model.linear("enc.ffn_in", xs[i])

        th = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
        for t in th:
            t.start()
        for t in th:
            t.join()
        for x, y in zip(xs, ys):
            self.check("enc.ffn_in", x, y)

    def test_threading(self):
        # AUTO picks OpenMP exactly when asking for it succeeds (a runtime is loaded in this
        # process); the own pool always works; every kind gives the same result, bit for bit
        x = np.random.default_rng(9).uniform(-1, 1, (200, 64)).astype(np.float32)
        want = self.model.linear("enc.ffn_in", x)
        with tilejit.Context(threads=2) as auto:
            auto_kind = auto.threading
        self.assertIn(auto_kind, ("pool", "openmp"))
        kinds = ["pool"]
        try:
            tilejit.Context(threading="openmp").close()
            kinds.append("openmp")
            self.assertEqual(auto_kind, "openmp")
        except tilejit.TilejitError as e:
            self.assertEqual(e.status_name, "unsupported")
            self.assertEqual(auto_kind, "pool")
        for kind in kinds:
            with tilejit.load(self.pattern, self.weights, backend=BACKEND, threads=2, threading=kind,
                              cache_dir=os.path.join(self.tmp.name, "cache")) as m:
                self.assertEqual(m._context.threading, kind)
                self.assertEqual(m._context.threads, 2)
                self.assertTrue(np.array_equal(m.linear("enc.ffn_in", x), want), kind)
        with self.assertRaises(ValueError):
            tilejit.Context(threading="fibers")

    def test_errors(self):
        m = self.model
        with self.assertRaises(tilejit.TilejitError) as cm:
            m.linear("no.such.layer", np.zeros((2, 64), np.float32))
        self.assertEqual(cm.exception.status_name, "not found")
        with self.assertRaises(tilejit.TilejitError) as cm:
            m.linear("enc.q", np.zeros((2, 63), np.float32))
        self.assertIn("k = 64", str(cm.exception))
        with self.assertRaises(ValueError):
            m.linear("enc.q", np.zeros((2, 3, 64), np.float32))
        with self.assertRaises(tilejit.TilejitError):
            m.linear(99, np.zeros((2, 64), np.float32))
        with self.assertRaises(tilejit.TilejitError) as cm:
            tilejit.load(self.pattern + ".missing", self.weights, backend="reference")
        self.assertIn(".missing", str(cm.exception))
        bad = os.path.join(self.tmp.name, "bad.json")
        with open(bad, "w") as f:
            f.write('{"format": "tilejit-pattern", "version": 1, "layers": [{"name": "x"}]}')
        with self.assertRaises(tilejit.TilejitError) as cm:
            tilejit.load(bad, self.weights, backend="reference")
        self.assertEqual(cm.exception.status_name, "bad file format")
        with self.assertRaises(ValueError):
            tilejit.load(self.pattern, self.weights, backend="tpu")

    def test_reference_backend_agrees(self):
        with tilejit.load(self.pattern, self.weights, backend="reference") as ref:
            self.assertEqual(ref.backend, "reference")
            x = np.random.default_rng(9).uniform(-1, 1, (13, 160)).astype(np.float32)
            self.check("enc.ffn_out", x, ref.linear("enc.ffn_out", x))
            np.testing.assert_allclose(ref.linear("enc.ffn_out", x), self.model.linear("enc.ffn_out", x),
                                       rtol=0, atol=1e-4 if self.model.backend != "cuda" else 5e-2)


def run_tool(args):
    import subprocess
    return subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)


@unittest.skipUnless(os.environ.get("TJ_TILEJIT"), "TJ_TILEJIT (the tilejit command) not set")
class ModelCommand(unittest.TestCase):
    """`tilejit model` on the test model: every layer checked and timed, and bad input."""

    @classmethod
    def setUpClass(cls):
        Binding.setUpClass()
        cls.b = Binding

    @classmethod
    def tearDownClass(cls):
        Binding.tearDownClass()

    def test_table(self):
        tj = os.environ["TJ_TILEJIT"]
        for backend in ("reference", BACKEND):
            r = run_tool([tj, "model", self.b.pattern, "--weights", self.b.weights, "--backend", backend,
                          "--m", "5", "--min-time", "0.001", "--threads", "1"])
            self.assertEqual(r.returncode, 0, r.stderr)
            lines = r.stdout.splitlines()
            for name in ("enc.q", "enc.ffn_in", "enc.ffn_out", "enc.empty"):
                row = [l for l in lines if l.startswith(name + " ")]
                self.assertEqual(len(row), 1, r.stdout)
                err = float(row[0].split()[4].rstrip("!"))
                self.assertLessEqual(err, 2e-3, row[0])
            self.assertTrue(any(l.startswith("total ") for l in lines), r.stdout)
            self.assertIn("load: cold", r.stdout)
            self.assertIn("all 4 layers within", r.stdout)

    def test_bad_input(self):
        tj = os.environ["TJ_TILEJIT"]
        cases = [([self.b.pattern], "--weights is required"),
                 ([self.b.pattern, "--weights", self.b.weights, "--backend", "tpu"], "unknown backend"),
                 ([self.b.pattern, "--weights", self.b.weights, "--m", "0"], "--m"),
                 ([self.b.pattern + ".missing", "--weights", self.b.weights], ".missing"),
                 ([self.b.pattern, "--weights", self.b.pattern], "p.json"),
                 ([], "expected one PATTERN")]
        for args, frag in cases:
            r = run_tool([tj, "model"] + args)
            self.assertEqual(r.returncode, 1, (args, r.stderr))
            self.assertIn(frag, r.stderr, args)
        r = run_tool([tj, "model", "--help"])
        self.assertEqual(r.returncode, 0)
        self.assertIn("usage: tilejit model", r.stdout)


@unittest.skipUnless(os.environ.get("TJ_BERT_BLOCK"), "TJ_BERT_BLOCK (examples/bert_block) not set")
class BertBlockExample(unittest.TestCase):
    """examples/bert_block on a small BERT-shaped model: chained GEMMs agree with the reference."""

    def test_block(self):
        rng = np.random.default_rng(11)
        h, inter = 64, 128
        layers, tensors = [], {}
        for suffix, n, k, act in [("attention.self.query", h, h, "none"), ("attention.self.key", h, h, "none"),
                                  ("attention.self.value", h, h, "none"),
                                  ("attention.output.dense", h, h, "none"),
                                  ("intermediate.dense", inter, h, "gelu"), ("output.dense", h, inter, "none")]:
            name = "encoder.layer.0." + suffix
            entry, _ = random_layer(rng, name, n, k, 32, 0.5, 1.0, 0.0, act)
            layers.append(entry)
            tensors[name + ".weight"] = (0.2 * rng.standard_normal((n, k))).astype(np.float32)
            tensors[name + ".bias"] = (0.1 * rng.standard_normal(n)).astype(np.float32)
        with tempfile.TemporaryDirectory() as tmp:
            p, w = os.path.join(tmp, "b.json"), os.path.join(tmp, "b.safetensors")
            with open(p, "w") as f:
                json.dump({"format": "tilejit-pattern", "version": 1, "layers": layers}, f)
            safetensors.save(w, tensors)
            r = run_tool([os.environ["TJ_BERT_BLOCK"], p, w, "--m", "16", "--heads", "4", "--repeat", "2",
                          "--backend", BACKEND, "--threads", "1"])
            self.assertEqual(r.returncode, 0, r.stderr + r.stdout)
            err = float(r.stdout.split("relative error ")[1].split()[0])
            self.assertLessEqual(err, 1e-4)
            r = run_tool([os.environ["TJ_BERT_BLOCK"], p, w, "--prefix", "encoder.layer.1."])
            self.assertEqual(r.returncode, 1)
            self.assertIn("encoder.layer.1.attention.self.query", r.stderr)


class Masks(unittest.TestCase):
    """tilejit.masks (NumPy only; tilejit.torch.layer_mask and scripts/quality use it)."""

    def test_layer_mask(self):
        from tilejit import masks
        rng = np.random.default_rng(5)
        # full and kept columns, g dividing n or not, ew residual, tiles with no rows
        for n, k, g, s, cf, ew in [(96, 40, 32, 0.5, 1.0, 0.0), (100, 33, 16, 0.7, 0.6, 0.03),
                                   (64, 24, 128, 0.25, 1.0, 0.05), (50, 20, 8, 1.0, 0.5, 0.02)]:
            entry, want = random_layer(rng, "l", n, k, g, s, cf, ew)
            got = masks.layer_mask(entry)
            self.assertEqual((got.dtype, got.shape), (np.dtype(bool), (n, k)))
            np.testing.assert_array_equal(got, want, err_msg=str((n, k, g, s, cf, ew)))

    @unittest.skipUnless(os.environ.get("TJ_TILEJIT"), "TJ_TILEJIT (the tilejit command) not set")
    def test_pattern_masks_are_the_pruned_weights(self):
        """The masks of a pattern `tilejit prune` wrote are where its --pruned-weights are nonzero."""
        from tilejit import masks
        rng = np.random.default_rng(6)
        tensors = {"a.weight": rng.standard_normal((96, 48)).astype(np.float32),
                   "b.weight": rng.standard_normal((40, 64)).astype(np.float32)}
        with tempfile.TemporaryDirectory() as tmp:
            w, p, pw = (os.path.join(tmp, f) for f in ("w.safetensors", "p.json", "pw.safetensors"))
            safetensors.save(w, tensors)
            for mode in (["tw1"], ["tw2"], ["tew", "--tew-base", "tw2", "--ew", "0.02"]):
                r = run_tool([os.environ["TJ_TILEJIT"], "prune", "--weights", w, "--sparsity", "0.6", "--g", "16",
                              "--mode"] + mode + ["-o", p, "--pruned-weights", pw])
                self.assertEqual(r.returncode, 0, r.stderr)
                got, pruned = masks.pattern_masks(p), safetensors.load(pw)
                self.assertEqual(sorted(got), ["a", "b"])
                for name, m in got.items():
                    np.testing.assert_array_equal(m, pruned[name + ".weight"] != 0, err_msg=str((mode, name)))
                kept = sum(int(m.sum()) for m in got.values()) / sum(m.size for m in got.values())
                self.assertAlmostEqual(kept, 0.4, delta=0.02, msg=mode)


@unittest.skipUnless(os.environ.get("TJ_TILEJIT"), "TJ_TILEJIT (the tilejit command) not set")
class QualityScript(unittest.TestCase):
    """scripts/quality's pruning step without torch: one `tilejit prune` per layer (per-layer
    scope) selects exactly that layer (tilejit.calibrate.layer_regex), masks from tilejit.masks."""

    def test_tw_prune(self):
        import importlib.machinery
        import importlib.util
        from tilejit import masks
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "quality")
        saved = sys.modules.get("torch", False)
        sys.modules["torch"] = None  # any `import torch` below fails
        try:
            loader = importlib.machinery.SourceFileLoader("tj_quality", path)
            quality = importlib.util.module_from_spec(importlib.util.spec_from_loader("tj_quality", loader))
            loader.exec_module(quality)
            self.assertIs(quality.pattern_masks, masks.pattern_masks)
            rng = np.random.default_rng(7)
            # names one regex could confuse: a suffix of another, and "." matching any character
            names = ["enc.output.dense", "enc.attention.output.dense", "blk.a", "blkxa"]
            with tempfile.TemporaryDirectory() as tmp:
                w = os.path.join(tmp, "w.safetensors")
                safetensors.save(w, {n + ".weight": rng.standard_normal((64, 32)).astype(np.float32) for n in names})
                got, paths = quality.tw_prune(os.environ["TJ_TILEJIT"], w, names, 0.5, "tw1", "per-layer", "0.01",
                                              os.path.join(tmp, "q.json"))
                self.assertEqual(len(paths), len(names))
                for name, pth in zip(names, paths):
                    with open(pth) as f:
                        self.assertEqual([l["name"] for l in json.load(f)["layers"]], [name])
                    self.assertEqual(got[name].mean(), 0.5, name)  # one tile of 64, 16 of 32 rows kept
                got, paths = quality.tw_prune(os.environ["TJ_TILEJIT"], w, names, 0.5, "tw1", "global", "0.01",
                                              os.path.join(tmp, "g.json"))
                self.assertEqual((sorted(got), len(paths)), (sorted(names), 1))
                self.assertEqual(sum(int(m.sum()) for m in got.values()), len(names) * 64 * 16)
        finally:
            if saved is False:
                del sys.modules["torch"]
            else:
                sys.modules["torch"] = saved


if __name__ == "__main__":
    unittest.main(verbosity=2)
