"""Tests of tilejit.torch: the tilejit::linear operator (eager, fake tensors, opcheck,
torch.compile(fullgraph=True)), TWLinear, sparsify's matching and report, all against
masked dense weights in float64 on fresh random data. Exit 77 (skip) without PyTorch.
Run: python/tests/run-torch python/tests/test_torch.py (uses .venv from scripts/install-torch)."""
import json
import os
import sys
import time
import unittest

try:
    import torch
except ImportError:
    print("PyTorch is not installed: skipping (scripts/install-torch installs it into .venv)")
    sys.exit(77)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import tilejit.torch as tjt  # noqa: E402

BACKEND = os.environ.get("TJ_PY_BACKEND", "auto")  # the CPU kernels: "cpu" unless "reference"
COMPILE_BACKEND = os.environ.get("TJ_TORCH_COMPILE_BACKEND", "inductor")
SEED = int(os.environ.get("TJ_SEED", time.time_ns() % (1 << 31)))
print("seed", SEED)


def random_layer(gen, name, n, k, g, sparsity, cols_frac=1.0, ew=0.0):
    """A random pattern layer (dict) with its bool mask."""
    ncols = max(1, int(round(n * cols_frac)))
    cols = torch.sort(torch.randperm(n, generator=gen)[:ncols]).values if ncols < n else torch.arange(n)
    mask = torch.zeros((n, k), dtype=torch.bool)
    tiles = []
    for t in range(0, ncols, g):
        keep = int(round(k * (1 - sparsity)))
        rows = torch.sort(torch.randperm(k, generator=gen)[:keep]).values
        tiles.append(rows.tolist())
        mask[cols[t:t + g].unsqueeze(1), rows.unsqueeze(0)] = True
    layer = {"name": name, "n": n, "k": k, "g": g, "tiles": tiles}
    if ncols < n:
        layer["cols"] = cols.tolist()
    if ew > 0:
        free = (~mask).nonzero()
        pick = free[torch.randperm(len(free), generator=gen)[:int(ew * n * k)]]
        pick = pick[torch.argsort(pick[:, 0] * k + pick[:, 1])]
        counts = torch.bincount(pick[:, 0], minlength=n)
        layer["ew"] = {"indptr": [0] + torch.cumsum(counts, 0).tolist(), "indices": pick[:, 1].tolist()}
        mask[pick[:, 0], pick[:, 1]] = True
    return layer, mask


def relerr(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


class TorchOp(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.gen = torch.Generator().manual_seed(SEED)
        cls.layer, cls.mask = random_layer(cls.gen, "blk.fc", 300, 160, 128, 0.6, cols_frac=0.8, ew=0.02)
        cls.lin = torch.nn.Linear(160, 300)
        with torch.no_grad():
            cls.lin.weight.normal_(generator=cls.gen)
            cls.lin.bias.normal_(generator=cls.gen)
        cls.tw = tjt.TWLinear.from_linear(cls.lin, layer=cls.layer, backend=BACKEND)

    def ref(self, x):
        w = self.lin.weight.detach().double() * self.mask
        return torch.nn.functional.linear(x.double(), w, self.lin.bias.detach().double())

    def test_mask_matches(self):
        self.assertTrue(torch.equal(tjt.layer_mask(self.layer), self.mask))
        self.assertAlmostEqual(self.tw.density, float(self.mask.float().mean()), places=6)

    def test_eager_shapes_and_dtypes(self):
        with torch.no_grad():
            for shape in [(1, 160), (7, 160), (2, 3, 160), (0, 160)]:
                x = torch.randn(*shape, generator=self.gen)
                y = self.tw(x)
                self.assertEqual(y.shape, (*shape[:-1], 300))
                self.assertEqual(y.dtype, torch.float32)
                if x.numel():
                    self.assertLess(relerr(y, self.ref(x)), 1e-5)
                    y2 = torch.ops.tilejit.linear(x, self.tw.handle)  # through the dispatcher
                    self.assertTrue(torch.equal(y, y2))
            x = torch.randn(5, 160, generator=self.gen)
            for dt, tol in ((torch.float16, 2e-3), (torch.bfloat16, 1e-2)):
                y = self.tw(x.to(dt))
                self.assertEqual(y.dtype, dt)
                self.assertLess(relerr(y, self.ref(x.to(dt))), tol)
            xt = torch.randn(160, 6, generator=self.gen).t()  # strided input
            self.assertLess(relerr(self.tw(xt), self.ref(xt)), 1e-5)
            out = torch.full((4, 300), float("nan"))
            x = torch.randn(4, 160, generator=self.gen)
            self.assertIs(self.tw(x, out=out), out)
            self.assertLess(relerr(out, self.ref(x)), 1e-5)

    def test_weights_borrowed(self):
        # compact float32 CPU parameters reach tilejit without a copy
        self.assertEqual(self.tw._bound.group.model(torch.device("cpu")).copied_bytes, 0)
        self.assertEqual(self.tw.weight.data_ptr(), self.lin.weight.data_ptr())

    def test_errors(self):
        with torch.no_grad():
            with self.assertRaises(ValueError):
                self.tw(torch.randn(3, 161))
            with self.assertRaises(ValueError):
                self.tw(torch.randn(3, 160), out=torch.empty(3, 299))
        x = torch.randn(2, 160, requires_grad=True)  # inference only: autograd says so
        with self.assertRaises(RuntimeError):
            self.tw(x).sum().backward()

    def test_freed_layer(self):
        import gc
        tw = tjt.TWLinear.from_linear(torch.nn.Linear(16, 8), sparsity=0.5, backend=BACKEND)
        h = tw.handle
        with torch.no_grad():
            torch.ops.tilejit.linear(torch.randn(2, 16), h)
        del tw
        gc.collect()
        with self.assertRaises(Exception) as cm:  # the compiled layer went with its module
            torch.ops.tilejit.linear(torch.randn(2, 16), h)
        self.assertIn("freed", str(cm.exception))

    def test_fake_and_opcheck(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            x = torch.empty(2, 9, 160)
            y = torch.ops.tilejit.linear(x, self.tw.handle)
            self.assertEqual(tuple(y.shape), (2, 9, 300))
        for key in ("CPU", "CUDA"):  # both kernels are registered (the CUDA one is unverified on hardware)
            self.assertTrue(torch._C._dispatch_has_kernel_for_dispatch_key("tilejit::linear", key), key)
        self.assertFalse(torch._C._dispatch_has_kernel_for_dispatch_key("tilejit::linear", "XLA"))
        x = torch.randn(3, 160, generator=self.gen)
        torch.library.opcheck(torch.ops.tilejit.linear.default, (x, self.tw.handle),
                              test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_static"))

    def test_threads(self):
        import threading
        xs = [torch.randn(3 + i, 160, generator=self.gen) for i in range(4)]
        res, errs = [None] * 4, []

        def work(i):
            try:
                with torch.no_grad():
                    for _ in range(20):
                        res[i] = self.tw(xs[i])
            except Exception as e:  # noqa: BLE001
                errs.append(e)
        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errs, [])
        for i in range(4):
            self.assertLess(relerr(res[i], self.ref(xs[i])), 1e-5)


    @unittest.skipIf(BACKEND == "reference", "the reference backend runs on the calling thread")
    def test_follows_torch_threads(self):
        # PyTorch runs an OpenMP runtime: tilejit's loops run on it, as many threads as
        # torch.get_num_threads() says at each call; an explicit threads= stays fixed
        fixed = tjt.TWLinear.from_linear(self.lin, layer=self.layer, backend=BACKEND, threads=1)
        for m in (self.tw, fixed):
            m._bound.group.model(torch.device("cpu"))
        ctx, fixed_ctx = (m._bound.group._contexts[("cpu", None)] for m in (self.tw, fixed))
        self.assertEqual(ctx.threading, "openmp")
        x = torch.randn(300, 160, generator=self.gen)  # enough work to be shared out
        old = torch.get_num_threads()
        ys = []
        try:
            for t in (1, 3, 2):
                torch.set_num_threads(t)
                self.assertEqual(ctx.threads, t)
                self.assertEqual(fixed_ctx.threads, 1)
                with torch.no_grad():
                    ys.append(self.tw(x))
        finally:
            torch.set_num_threads(old)
        self.assertLess(relerr(ys[0], self.ref(x)), 1e-5)
        for y in ys[1:]:  # the split never changes a result
            self.assertTrue(torch.equal(y, ys[0]))


class Block(torch.nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, h)
        self.down = torch.nn.Linear(h, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(128, 256) for _ in range(2)])
        self.head = torch.nn.Linear(128, 10)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class Mlp(torch.nn.Module):
    """Activation modules after linears: fusable (up → act, fc → relu), and not (side's output
    also goes elsewhere; gate's activation is approximate; shared called twice)."""

    def __init__(self, d, h):
        super().__init__()
        self.up, self.act, self.down = torch.nn.Linear(d, h), torch.nn.GELU(), torch.nn.Linear(h, d)
        self.fc, self.relu = torch.nn.Linear(d, d), torch.nn.ReLU()
        self.side, self.side_act = torch.nn.Linear(d, d), torch.nn.GELU()
        self.gate, self.tanh_gelu = torch.nn.Linear(d, d), torch.nn.GELU(approximate="tanh")
        self.a, self.b, self.shared = torch.nn.Linear(d, d), torch.nn.Linear(d, d), torch.nn.ReLU()

    def forward(self, x):
        s = self.side(x)
        y = self.down(self.act(self.up(x))) + self.relu(self.fc(x)) + self.side_act(s) + s
        return y + self.tanh_gelu(self.gate(x)) + self.shared(self.a(x)) + self.shared(self.b(x))


masked_dense = tjt.dense_copy


class Sparsify(unittest.TestCase):
    def test_fused_activations(self):
        torch.manual_seed(SEED)
        model = torch.nn.Sequential(Mlp(64, 128), torch.nn.Linear(64, 64), torch.nn.GELU()).eval()
        x = torch.randn(3, 9, 64)
        rep = tjt.sparsify(model, sparsity=0.5, g=32, backend=BACKEND)
        self.assertEqual(sorted(rep.fused), [("0.fc", "0.relu", "relu"), ("0.up", "0.act", "gelu"),
                                             ("1", "2", "gelu")])
        for name in ("0.act", "0.relu", "2"):
            self.assertIsInstance(model.get_submodule(name), torch.nn.Identity)
        for name in ("0.side_act", "0.tanh_gelu", "0.shared"):
            self.assertNotIsInstance(model.get_submodule(name), torch.nn.Identity)
        self.assertEqual(model[0].up.activation, "gelu")
        self.assertEqual(model[0].side.activation, "none")
        self.assertIn("0.up applies gelu: 0.act is now nn.Identity", str(rep))
        ref = masked_dense(model)  # the dense copy applies the fused activations itself
        with torch.no_grad():
            self.assertLess(relerr(model(x), ref(x)), 1e-5)
        plain = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU())
        rep = tjt.sparsify(plain, sparsity=0.5, g=32, backend=BACKEND, fuse_activations=False)
        self.assertEqual(rep.fused, [])
        self.assertIsInstance(plain[1], torch.nn.GELU)

    def test_sparsity_and_report(self):
        torch.manual_seed(SEED)
        model = Model().eval()
        rep = tjt.sparsify(model, sparsity=0.5, g=64, layers=r"^blocks\.", backend=BACKEND)
        self.assertEqual([s[0] for s in rep.swapped], ["blocks.0.up", "blocks.0.down", "blocks.1.up", "blocks.1.down"])
        self.assertIsInstance(model.head, torch.nn.Linear)
        kept = sum(d * n * k for _, _, n, k, d in rep.swapped) / sum(n * k for _, _, n, k, _ in rep.swapped)
        self.assertAlmostEqual(kept, 0.5, delta=0.05)
        self.assertIn("4 nn.Linear swapped", str(rep))
        ref = masked_dense(model)
        x = torch.randn(3, 5, 128)
        with torch.no_grad():
            self.assertLess(relerr(model(x), ref(x)), 1e-5)
        self.assertIn("blocks.0.up.weight", model.state_dict())

    def test_pattern_matching(self):
        torch.manual_seed(SEED)
        model = Model().eval()
        gen = torch.Generator().manual_seed(SEED)
        l1, _ = random_layer(gen, "net.blocks.1.up", 256, 128, 64, 0.7)  # a checkpoint prefix
        l2, _ = random_layer(gen, "head", 10, 128, 10, 0.5)
        l3, _ = random_layer(gen, "net.missing", 8, 8, 8, 0.5)
        l4, _ = random_layer(gen, "blocks.0.down", 100, 256, 64, 0.5)  # wrong shape: skipped
        pat = {"format": "tilejit-pattern", "version": 1, "layers": [l1, l2, l3, l4]}
        w = torch.randn(256, 128)
        rep = tjt.sparsify(model, json.dumps(pat), weights={"net.blocks.1.up.weight": w}, backend=BACKEND)
        self.assertEqual(sorted((m, l) for m, l, *_ in rep.swapped),
                         [("blocks.1.up", "net.blocks.1.up"), ("head", "head")])
        self.assertEqual(rep.unmatched, ["net.missing"])
        self.assertEqual([m for m, _ in rep.skipped], ["blocks.0.down"])
        self.assertTrue(torch.equal(model.blocks[1].up.weight, w))  # weights= replaced them
        ref = masked_dense(model)
        x = torch.randn(4, 128)
        with torch.no_grad():
            self.assertLess(relerr(model(x), ref(x)), 1e-5)
        with self.assertRaises(ValueError):
            tjt.sparsify(model)


class Compile(unittest.TestCase):
    def test_fullgraph(self):
        torch.manual_seed(SEED)
        model = Model().eval()
        tjt.sparsify(model, sparsity=0.6, g=64, backend=BACKEND)
        ref = masked_dense(model)
        t0 = time.perf_counter()
        cm = torch.compile(model, fullgraph=True, backend=COMPILE_BACKEND)
        with torch.no_grad():
            for shape in [(2, 7, 128), (1, 128)]:
                x = torch.randn(*shape)
                y = cm(x)
                self.assertLess(relerr(y, ref(x)), 1e-5)
                self.assertLess(relerr(y, model(x)), 1e-5)
        print("torch.compile(fullgraph=True, backend=%r): compiled and ran in %.1f s"
              % (COMPILE_BACKEND, time.perf_counter() - t0))


if __name__ == "__main__":
    only = os.environ.get("TJ_TORCH_TESTS")  # e.g. "Compile" (meson runs it as its own test)
    argv = sys.argv[:1] + (only.split(",") if only else [])
    if not only:
        argv += ["TorchOp", "Sparsify"]
    unittest.main(argv=argv, verbosity=2)
