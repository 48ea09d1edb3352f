"""tilejit.torch: tilejit's tile-wise sparse kernels inside PyTorch models (optional: needs torch).

    import tilejit.torch as tjt
    report = tjt.sparsify(model, sparsity=0.75)        # or pattern="p.json"[, weights="w.safetensors"]
    print(report)                                      # which nn.Linear became a TWLinear, and how dense

- `torch.ops.tilejit.linear(x, handle)` is a torch.library custom operator with a CPU and a CUDA
  kernel and a fake (meta) kernel, so it runs in eager mode and under
  `torch.compile(fullgraph=True)`; `handle` names a layer bound by TWLinear / sparsify.
- `TWLinear` replaces an `nn.Linear`: y = act(x · (W ⊙ mask)ᵀ + b) with tilejit's kernel for the
  layer's pattern. With autograd (x requiring a gradient, or the layer made trainable with
  `trainable()`), the forward is the same tile-wise product computed in PyTorch from gathered
  inputs (tilejit.recover.TileLinear: the kept weights are the only parameters, so the pattern
  holds by construction), and autograd gives the gradients; the kernel serves inference, and is
  rebuilt from the trained weights at the next call without gradients.
- Weights come from memory (tilejit.Model.from_tensors): the module's own parameters are handed
  to tilejit by DLPack without a copy when they are compact float32/float16/bfloat16 CPU tensors.
  On a CUDA input the layer is compiled once more for that device (weights copied to the host
  first if needed; the CUDA backend uploads packed tiles). The CUDA path is compiled here but has
  not run on a GPU.

Per call: the layer is resolved once (a handle → compiled layer, found at construction), the
DLTensors are filled from the tensors' own pointers, shapes and strides (no __dlpack__ capsule
per call), the only allocation is the output (or none with `out=`), and on CUDA the caller's
current stream is passed to the kernel without a synchronisation.
"""
import contextlib
import ctypes
import itertools
import json
import re
import struct
import threading
import time
import weakref

import torch
from torch import nn

from . import Context, Model, TilejitError, backend_built, masks
from . import _lib as L

__all__ = ["TWLinear", "sparsify", "SparsifyReport", "linear", "layer_mask", "dense_copy", "prune", "PruneReport",
           "PruneError", "PruneInterrupted", "save_pruned", "pattern_of", "recover", "finetune", "TileLinear", "statistics"]

# --- bound layers --------------------------------------------------------------------------------


class _Group:
    """Layers loaded together (one pattern, one tilejit model per device, sharing a context), from
    host tensors {"NAME.weight": ..., "NAME.bias": ...} it keeps alive."""

    def __init__(self, pattern, tensors, backend="auto", threads=None, cache_dir=None, tuning_log=None, precision="auto"):
        self.pattern = pattern
        self.tensors = tensors
        self.backend = backend
        self.threads = threads
        self.options = dict(cache_dir=cache_dir, tuning_log=tuning_log, precision=precision)
        self.index = {l["name"]: i for i, l in enumerate(pattern["layers"])}
        self._models = {}
        self._contexts = {}
        self._lock = threading.Lock()

    def _backend_for(self, device):
        if device.type == "cuda":
            return "cuda"
        if self.backend in ("cpu", "reference"):
            return self.backend
        # auto on host tensors: the JIT backend, or the plain loops in a build without LLVM
        return "cpu" if backend_built("cpu") else "reference"

    def model(self, device):
        """The compiled model for a torch device, built on first use."""
        key = (device.type, device.index)
        m = self._models.get(key)
        if m is not None:
            return m
        with self._lock:
            m = self._models.get(key)
            if m is None:
                be = self._backend_for(device)
                ctx = Context(backend=be, device=device.index or 0, threads=self.threads or 0, **self.options)
                if self.threads is None and be == "cpu" and ctx.threading == "pool":
                    # no OpenMP runtime to share (threads 0 would follow it): torch's count now
                    ctx.close()
                    ctx = Context(backend=be, device=device.index or 0, threads=torch.get_num_threads(),
                                  **self.options)
                self._contexts[key] = ctx
                m = Model.from_tensors(self.pattern, self.tensors, context=ctx)
                self._models[key] = m
        return m

    def close(self):
        for m in self._models.values():
            m.close()
        for c in self._contexts.values():
            c.close()
        self._models.clear()
        self._contexts.clear()


class _Bound:
    """What the operator needs for one layer: its group, index and shape. Registered under a
    handle (an int that torch.compile bakes into the graph as a constant)."""
    __slots__ = ("group", "index", "name", "n", "k", "cpu", "cuda", "handle", "__weakref__")

    def __init__(self, group, name, n, k):
        self.group, self.name, self.n, self.k = group, name, n, k
        self.index = group.index[name]
        self.cpu = None   # (entry point, model pointer, Model) once resolved
        self.cuda = {}    # the same per CUDA device index
        self.handle = next(_handles)
        _registry[self.handle] = self

    def bind_cpu(self):
        self.cpu = _bind_device(self, self.group.model(torch.device("cpu")))
        return self.cpu

    def bind_cuda(self, dev):
        r = self.cuda[dev.index] = _bind_device(self, self.group.model(dev))
        return r

    def __deepcopy__(self, memo):
        return self  # a copied TWLinear shares the compiled layer (and the weights it was built from)

    def __reduce__(self):
        raise TypeError("tilejit: a TWLinear's compiled layer cannot be pickled; save the state_dict "
                        "and the pattern, and sparsify again after loading")


_registry = weakref.WeakValueDictionary()  # handle -> _Bound, alive while its TWLinear is
_handles = itertools.count(1)
_DT = {torch.float32: (L.kDLFloat, 32), torch.float16: (L.kDLFloat, 16), torch.bfloat16: (L.kDLBfloat, 16)}


# A call's two DLTensors (x, y) and their shape and stride arrays, in one per-thread buffer
# written by a single struct.pack_into: 2 × 48 bytes of DLTensor (data; device type, id; ndim;
# dtype code, bits, lanes; shape and strides pointers; byte_offset) + 4 × 2 int64.
_PACK = struct.Struct("<QiiiBBHQQQ" "QiiiBBHQQQ" "qqqq" "qqqq")
assert _PACK.size == 2 * ctypes.sizeof(L.DLTensor) + 64


class _Scratch(threading.local):
    def __init__(self):
        self.buf = ctypes.create_string_buffer(_PACK.size)
        base = ctypes.addressof(self.buf)
        self.x, self.y = base, base + 48
        self.xs, self.xst, self.ys, self.yst = base + 96, base + 112, base + 128, base + 144


_scratch = _Scratch()
_CALL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_int, ctypes.c_void_p)


def _bind_device(b, model):
    """The raw entry point and model pointer a bound layer calls on a device (resolved once)."""
    lib = model._lib
    fn = _CALL(ctypes.cast(lib.tj_linear_ex, ctypes.c_void_p).value)  # int arguments, GIL released
    return fn, model._model.value, model


# dtype -> (DLPack code, bits, output dtype, its code, its bits)
_KIND = {torch.float32: (L.kDLFloat, 32, torch.float32, L.kDLFloat, 32),
         torch.float16: (L.kDLFloat, 16, torch.float16, L.kDLFloat, 16),
         torch.bfloat16: (L.kDLBfloat, 16, torch.float32, L.kDLFloat, 32)}


def _run(b, x, out=None):
    """The kernel call behind the operator and TWLinear: y = layer(x) for x [..., k]."""
    k, n = b.k, b.n
    shape = x.shape
    if shape[-1] != k:
        raise ValueError("tilejit: layer '%s' takes %d input features, x has shape %s" % (b.name, k, tuple(shape)))
    kind = _KIND.get(x.dtype)
    if kind is None:
        x = x.float()
        kind = _KIND[torch.float32]
    if x.is_contiguous():  # [..., k] read as rows of k in place: no reshape, and y made in its final shape
        x2, m, sx = x, x.numel() // k, (k, 1)
    else:
        x2 = x.reshape(-1, k)
        m, sx = x2.shape[0], x2.stride()
    if x2.is_cpu:
        fn, mp, model = b.cpu or b.bind_cpu()
        dev_type, dev_id, stream, dev = L.kDLCPU, 0, None, None
    elif x2.is_cuda:
        dev = x2.device
        fn, mp, model = b.cuda.get(dev.index) or b.bind_cuda(dev)
        dev_type, dev_id = L.kDLCUDA, dev.index or 0
        stream = torch.cuda.current_stream(dev).cuda_stream or None
    else:
        raise TilejitError(6, "tilejit: no kernel for device '%s' (cpu and cuda only)" % x2.device.type)
    if out is not None:
        if (out.dtype is not kind[2] or out.is_cpu != x2.is_cpu or out.shape[-1] != n or out.numel() != m * n
                or not out.is_contiguous() or (dev is not None and out.device != dev)):
            raise ValueError("tilejit: out must be a contiguous %s tensor of shape %s on %s"
                             % (kind[2], (*shape[:-1], n), x2.device))
        y = out
    elif dev is None:  # torch.empty(ints...) parses fastest; [M × n] is the common case
        y = torch.empty(m, n, dtype=kind[2]) if len(shape) == 2 else torch.empty(*shape[:-1], n, dtype=kind[2])
    else:
        y = torch.empty(*shape[:-1], n, dtype=kind[2], device=dev)
    if m:
        s = _scratch
        _PACK.pack_into(s.buf, 0,
                        x2.data_ptr(), dev_type, dev_id, 2, kind[0], kind[1], 1, s.xs, s.xst, 0,
                        y.data_ptr(), dev_type, dev_id, 2, kind[3], kind[4], 1, s.ys, s.yst, 0,
                        m, k, sx[0], sx[1], m, n, n, 1)
        st = fn(mp, b.index, s.x, s.y, 0, stream)
        if st:
            raise TilejitError(st, model._error())
    if out is not None:
        return out
    return y if kind[2] is x.dtype or x.dtype not in _KIND else y.to(x.dtype)


# --- the operator ----------------------------------------------------------------------------------


@torch.library.custom_op("tilejit::linear", mutates_args=(), device_types="cpu")
def linear(x: torch.Tensor, handle: int) -> torch.Tensor:
    """y = act(x · (W ⊙ mask)ᵀ + b) for the tilejit layer `handle` (TWLinear.handle); x [..., k]."""
    return _run(_bound(handle), x)


@linear.register_kernel("cuda")
def _linear_cuda(x, handle):
    return _run(_bound(handle), x)


def _bound(handle):
    b = _registry.get(handle)
    if b is None:
        raise KeyError("tilejit: no layer with handle %d (its TWLinear was freed)" % handle)
    return b


@linear.register_fake
def _linear_fake(x, handle):
    b = _bound(handle)
    dt = x.dtype if x.dtype in _KIND else torch.float32
    return x.new_empty((*x.shape[:-1], b.n), dtype=dt)


# --- masks ---------------------------------------------------------------------------------------


def layer_mask(layer):
    """The dense boolean mask [n × k] of a pattern layer (a dict of the tilejit-pattern JSON) as a
    torch.bool tensor: True where a weight is kept (tilejit.masks.layer_mask)."""
    return torch.from_numpy(masks.layer_mask(layer))


# --- the module ----------------------------------------------------------------------------------


class TWLinear(nn.Module):
    """An nn.Linear whose product runs on tilejit's kernel for a tile-wise pattern.

    Build it with TWLinear.from_linear(linear, layer=pattern_layer) or
    TWLinear.from_linear(linear, sparsity=0.75), or let sparsify() swap a whole model. `weight`
    and `bias` stay as buffers under the nn.Linear names (state_dict keys are unchanged); the
    kernel uses them where the pattern keeps a weight and ignores the rest."""

    def __init__(self, bound, weight, bias, activation="none"):
        super().__init__()
        self._bound = bound
        self.in_features, self.out_features = bound.k, bound.n
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)
        self.activation = activation
        self.fused = False
        self._synced = None
        self._register_state_dict_hook(TWLinear._state_dict_hook)
        self.register_state_dict_pre_hook(TWLinear._state_dict_pre_hook)

    @property
    def handle(self):
        return self._bound.handle

    @property
    def layer(self):
        """The layer's pattern entry (a dict)."""
        return self._bound.group.pattern["layers"][self._bound.index]

    @property
    def density(self):
        l = self.layer
        kept = sum(len(r) * min(l["g"], len(l.get("cols", range(l["n"]))) - t * l["g"])
                   for t, r in enumerate(l["tiles"]))
        return (kept + len(l.get("ew", {}).get("indices", []))) / (l["n"] * l["k"])

    def mask(self):
        return layer_mask(self.layer)

    def masked_weight(self):
        """W ⊙ mask as a dense tensor: the weights the kernel computes with."""
        self._sync()
        return self.weight * self.mask().to(self.weight.device)

    @classmethod
    def from_linear(cls, linear, layer=None, *, sparsity=None, mode="tw1", g=128, ew=0.01, name="linear",
                    backend="auto", threads=None, cache_dir=None, tuning_log=None, precision="auto"):
        """A TWLinear for an nn.Linear, with the pattern layer given (a dict; its name is used)
        or made by pruning this layer alone at `sparsity`. precision: as tilejit.load()."""
        w = linear.weight.detach()
        b = linear.bias.detach() if linear.bias is not None else None
        if layer is None:
            if sparsity is None:
                raise ValueError("tilejit: TWLinear.from_linear needs layer= or sparsity=")
            with Context(backend="reference") as c:
                layer = c.prune({name: _host(w)}, sparsity, mode=mode, g=g, ew_fraction=ew)["layers"][0]
        if "layers" in layer:
            layer = layer["layers"][0]
        layer = dict(layer)
        group = _group({"format": "tilejit-pattern", "version": 1, "layers": [layer]}, {layer["name"]: (w, b)},
                       backend, threads, cache_dir, tuning_log, precision)
        return cls(_Bound(group, layer["name"], w.shape[0], w.shape[1]), w, b, layer.get("activation", "none"))

    def trainable(self, on=True):
        """Makes the layer's kept weights (and bias) trainable parameters (submodule `kept`, a
        TileLinear: per tile its rows × its kept input features) or, with on=False, drops them
        after writing them back. Returns the TileLinear (None when off). state_dict keeps the
        nn.Linear names: `weight` (zeros outside the pattern) and `bias`, synchronised first."""
        from .recover import TileLinear
        if on and "kept" not in self._modules:
            self.kept = TileLinear(dict(self.layer, name=self._bound.name), self.weight.detach().float(),
                                   self.bias.detach().float() if self.bias is not None else None)
            self.kept.to(self.weight.device)
            self._synced = self._kept_version()
        elif not on and "kept" in self._modules:
            self._sync()
            del self._modules["kept"]
        return self._modules.get("kept")

    def _kept_version(self):
        k = self._modules.get("kept")
        return None if k is None else sum(p._version for p in k.parameters())

    def _sync(self):
        """Writes trained kept weights into `weight`/`bias` and rebinds the kernel to them."""
        k = self._modules.get("kept")
        if k is None or self._kept_version() == self._synced:
            return
        with torch.no_grad():  # new tensors: the old ones may be a read-only mapping of a weights file
            keep = self.mask().to(self.weight.device)
            # the kept positions only: what lies outside the mask is ignored, and kept as it was
            self.weight = torch.where(keep, k.dense_weight().to(self.weight.dtype), self.weight)
            if self.bias is not None and k.bias is not None:
                self.bias = k.bias.detach().to(self.bias.dtype).clone()
        b = self._bound
        group = _group({"format": "tilejit-pattern", "version": 1, "layers": [dict(self.layer, name=b.name)]},
                       {b.name: (self.weight, self.bias)}, b.group.backend, b.group.threads,
                       b.group.options["cache_dir"], b.group.options["tuning_log"])
        group.model(torch.device("cpu"))
        self._bound = _Bound(group, b.name, b.n, b.k)
        self._synced = self._kept_version()

    @staticmethod
    def _state_dict_pre_hook(module, prefix, keep_vars):
        module._sync()

    @staticmethod
    def _state_dict_hook(module, state, prefix, local_metadata):
        for key in [k for k in state if k.startswith(prefix + "kept.")]:
            del state[key]
        return state

    def _tiles_for_grad(self):
        k = self._modules.get("kept")
        if k is not None:
            return k
        t = getattr(self, "_frozen", None)
        if t is None:  # x needs a gradient, the weights do not: the same tile-wise product, frozen
            from .recover import TileLinear
            t = TileLinear(dict(self.layer, name=self._bound.name), self.weight.detach(),
                           self.bias.detach() if self.bias is not None else None, train_bias=False)
            t.to(self.weight.device)
            for p in t.parameters():
                p.requires_grad_(False)
            object.__setattr__(self, "_frozen", t)
        return t

    def forward(self, x, out=None):
        grad = torch.is_grad_enabled() and (x.requires_grad or (
            "kept" in self._modules and any(p.requires_grad for p in self._modules["kept"].parameters())))
        if grad:
            return self._tiles_for_grad()(x)
        compiling = torch.compiler.is_compiling()
        if "kept" in self._modules and not compiling:
            self._sync()  # (under torch.compile: synchronised by the eager call or state_dict before)
        if out is not None or not compiling:
            return _run(self._bound, x, out)  # eager fast path: the same kernel, no dispatcher
        return torch.ops.tilejit.linear(x, self._bound.handle)

    def extra_repr(self):
        return "in_features=%d, out_features=%d, density=%.3f, layer='%s'" % (
            self.in_features, self.out_features, self.density, self._bound.name)


def _host(t):
    """A host tensor tilejit can borrow: t itself when it is a CPU float32/float16/bfloat16
    tensor (compact or not: the C side copies strided ones), else a CPU copy."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype not in _DT:
        t = t.float()
    return t


def _group(pattern, weights, backend, threads, cache_dir, tuning_log, precision="auto"):
    tensors = {}
    for name, (w, b) in weights.items():
        tensors[name + ".weight"] = _host(w)
        if b is not None:
            tensors[name + ".bias"] = _host(b)
    return _Group(pattern, tensors, backend=backend, threads=threads, cache_dir=cache_dir, tuning_log=tuning_log,
                  precision=precision)


# --- sparsify --------------------------------------------------------------------------------------


class SparsifyReport:
    """What sparsify() did: .swapped [(module name, layer name, n, k, density)], .fused
    [(module name, activation module now nn.Identity, activation)], .unmatched (pattern layers with
    no nn.Linear), .skipped [(module name, reason)], .loaded (tensors of the weights file other than
    the pattern layers' copied into the model), .seconds."""

    def __init__(self):
        self.swapped, self.unmatched, self.skipped = [], [], []
        self.fused = []  # (module name, activation module name, "gelu" | "relu")
        self.loaded = 0
        self.seconds = 0.0
        self.backend = ""

    def __len__(self):
        return len(self.swapped)

    def __str__(self):
        lines = ["tilejit.sparsify: %d nn.Linear swapped for TWLinear in %.2f s (backend %s)"
                 % (len(self.swapped), self.seconds, self.backend)]
        if self.swapped:
            kept = sum(d * n * k for _, _, n, k, d in self.swapped)
            total = sum(n * k for _, _, n, k, _ in self.swapped)
            lines.append("  weights kept: %.1f %% of %d" % (100 * kept / max(total, 1), total))
        if self.loaded:
            lines.append("  other tensors loaded from the weights file: %d" % self.loaded)
        for m, l, n, k, d in self.swapped:
            lines.append("  %-48s [%d x %d] density %.3f%s" % (m, n, k, d, "" if m == l else "  (layer %s)" % l))
        for m, a, act in self.fused:
            lines.append("  %s applies %s: %s is now nn.Identity" % (m, act, a))
        for m, why in self.skipped:
            lines.append("  skipped %s: %s" % (m, why))
        for l in self.unmatched:
            lines.append("  pattern layer without an nn.Linear: %s" % l)
        return "\n".join(lines)

    __repr__ = __str__


def _match(names, layer_names):
    """{module name: layer name}: equal names, or one a dotted suffix of the other (a checkpoint
    saved from a wrapper has a 'bert.' or 'model.' prefix the bare model lacks). Ambiguity is an
    error."""
    out = {}
    for l in layer_names:
        hits = [m for m in names if m == l] or [m for m in names if l.endswith("." + m) or m.endswith("." + l)]
        if len(hits) > 1:
            raise ValueError("tilejit: pattern layer '%s' matches several modules: %s" % (l, ", ".join(hits)))
        if hits:
            if hits[0] in out:
                raise ValueError("tilejit: module '%s' matches layers '%s' and '%s'" % (hits[0], out[hits[0]], l))
            out[hits[0]] = l
    return out


def _load_weights(weights):
    if weights is None:
        return {}
    if isinstance(weights, dict):
        return weights
    from . import safetensors
    return {k: torch.from_numpy(v) for k, v in safetensors.load(weights).items()}


def _activation_of(mod):
    """The activation tilejit's kernels apply that `mod` computes ("gelu": exact erf form,
    "relu"), or None."""
    if isinstance(mod, nn.ReLU):
        return "relu"
    if isinstance(mod, nn.GELU):
        return "gelu" if mod.approximate == "none" else None
    # transformers' GELUActivation (BERT's "gelu"): F.gelu, or its Python erf twin
    act = getattr(mod, "act", None)
    if type(mod).__name__ == "GELUActivation" and (act is nn.functional.gelu
                                                   or getattr(act, "__name__", "") == "_gelu_python"):
        return "gelu"
    return None


def _fusable(model, names):
    """{module name of a linear in `names`: (activation, name of the activation module)} where the
    linear's parent module sends the linear's output only into one activation child called once
    (the parent's forward traced by torch.fx with every child a leaf)."""
    import torch.fx
    out = {}
    by_parent = {}
    for n in names:
        parent, _, attr = n.rpartition(".")
        by_parent.setdefault(parent, []).append(attr)

    class Leaves(torch.fx.Tracer):
        def is_leaf_module(self, m, qualname):
            return True
    for parent, attrs in by_parent.items():
        pm = model.get_submodule(parent) if parent else model
        acts = {c: a for c, m in pm.named_children() if (a := _activation_of(m))}
        if not acts:
            continue
        try:
            graph = Leaves().trace(pm)
        except Exception:  # noqa: BLE001 — a parent fx cannot trace keeps its activation
            continue
        calls = {}
        for node in graph.nodes:
            if node.op == "call_module":
                calls.setdefault(node.target, []).append(node)
        for attr in attrs:
            lin = calls.get(attr, [])
            if len(lin) != 1 or len(lin[0].users) != 1:
                continue
            user = next(iter(lin[0].users))
            if user.op == "call_module" and user.target in acts and len(calls[user.target]) == 1 \
                    and user.args == (lin[0],) and not user.kwargs:
                out[(parent + "." if parent else "") + attr] = (acts[user.target],
                                                                 (parent + "." if parent else "") + user.target)
    return out


def sparsify(model, pattern=None, weights=None, *, sparsity=None, mode="tw1", g=128, ew=0.01, layers=None,
             backend="auto", threads=None, cache_dir=None, tuning_log=None, fuse_activations=True, precision="auto"):
    """Swaps the model's nn.Linear modules for TWLinear in place and returns a SparsifyReport.

    Either pattern= (a tilejit pattern: path, JSON text or dict) names the layers, matched to
    modules by their safetensors names (module names, up to a dotted prefix); weights= (a
    safetensors path or {name: tensor}) then optionally replaces their weights, and every other
    tensor of it replaces the model's tensor of that name (the pruned weights `tilejit prune` or
    save_pruned wrote, with the norms prune() refitted). Or sparsity= prunes the selected nn.Linear weights here
    (mode tw1|tw2|tew, tile width g, one global threshold as `tilejit prune`); layers= (a regular
    expression on module names, re.search) selects them, default: every nn.Linear.
    Every swapped layer is compiled once now on the CPU (backend "cpu", or "reference"), and on
    first use on each CUDA device.
    threads=None (default): the CPU kernels follow torch.get_num_threads() of the calling thread at
    each call, running on PyTorch's own OpenMP threads (docs/threads.md); threads=N: N threads.
    fuse_activations: where a swapped layer's output goes only into an activation module that
    tilejit's kernels apply themselves (exact GELU, ReLU), the kernel applies it and the module is
    replaced by nn.Identity (found by tracing the layer's parent module with torch.fx; parents that
    do not trace are left alone). The report lists them in .fused.
    precision (CPU): "auto" computes in bf16 where the CPU has avx512_bf16 or AMX and the model's
    weights are bfloat16 (model.to(torch.bfloat16)), else fp32; "f32"; "bf16"."""
    t0 = time.perf_counter()
    rep = SparsifyReport()
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    if (pattern is None) == (sparsity is None):
        raise ValueError("tilejit.sparsify: give pattern= or sparsity=, not both or neither")
    if pattern is None:
        sel = {n: m for n, m in linears.items() if layers is None or re.search(layers, n)}
        if not sel:
            raise ValueError("tilejit.sparsify: no nn.Linear matches layers=%r" % (layers,))
        with Context(backend="reference") as c:
            pattern = c.prune({n: _host(m.weight) for n, m in sel.items()}, sparsity, mode=mode, g=g, ew_fraction=ew)
    else:
        from . import _pattern_text
        pattern = json.loads(_pattern_text(pattern))
    lnames = [l["name"] for l in pattern["layers"]]
    match = _match(list(linears), lnames)
    rep.unmatched = [l for l in lnames if l not in match.values()]
    extra = _load_weights(weights)
    by_layer = {l["name"]: l for l in pattern["layers"]}
    # the file's other tensors (e.g. norms prune() refitted) replace the model's of the same name
    own = {l + s for l in lnames for s in (".weight", ".bias")}
    other = [k for k in extra if k not in own]
    if other:
        sd = model.state_dict(keep_vars=True)
        for key, name in _match(list(sd), other).items():
            t, v = sd[key], extra[name]
            if tuple(t.shape) != tuple(v.shape):
                rep.skipped.append((key, "tensor shape %s, weights file %s" % (tuple(t.shape), tuple(v.shape))))
                continue
            with torch.no_grad():
                t.copy_(v.detach().to(t.device, t.dtype))
            rep.loaded += 1
    chosen, tensors = [], {}
    for mname, lname in match.items():
        lin, l = linears[mname], by_layer[lname]
        w = extra.get(lname + ".weight", lin.weight)
        b = extra.get(lname + ".bias", lin.bias)
        if tuple(w.shape) != (l["n"], l["k"]):
            rep.skipped.append((mname, "weight shape %s, pattern [%d, %d]" % (tuple(w.shape), l["n"], l["k"])))
            continue
        w = w.detach().to(lin.weight.device, lin.weight.dtype)
        b = b.detach().to(lin.weight.device, lin.weight.dtype) if b is not None else None
        tensors[lname] = (w, b)
        chosen.append((mname, lname))
    if chosen:
        fused = _fusable(model, [m for m, _ in chosen]) if fuse_activations else {}
        for mname, lname in chosen:
            act = fused.get(mname)
            if act and by_layer[lname].get("activation", "none") in ("none", act[0]):
                by_layer[lname] = dict(by_layer[lname], activation=act[0])
                rep.fused.append((mname, act[1], act[0]))
            else:
                fused.pop(mname, None)
        sub = dict(pattern, layers=[by_layer[l] for _, l in chosen])
        group = _group(sub, tensors, backend, threads, cache_dir, tuning_log, precision)
        group.model(torch.device("cpu"))  # compile now: errors surface here, not at the first call
        rep.backend = group._backend_for(torch.device("cpu"))
        for mname, lname in chosen:
            w, b = tensors[lname]
            tw = TWLinear(_Bound(group, lname, w.shape[0], w.shape[1]), w, b, by_layer[lname].get("activation", "none"))
            tw.fused = mname in fused  # its activation module became nn.Identity (pattern_of says "none")
            parent, _, attr = mname.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, tw)
            rep.swapped.append((mname, lname, w.shape[0], w.shape[1], tw.density))
        for _, act_name, _ in rep.fused:
            parent, _, attr = act_name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, nn.Identity())
    rep.seconds = time.perf_counter() - t0
    return rep


def sentence_embeddings(model, batch):
    """Sentence embeddings of a Hugging Face encoder as sentence-transformers computes them: the
    last hidden state mean-pooled over the real tokens (attention mask), L2-normalised."""
    with torch.no_grad():
        h = model(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
    return nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=1)


class _DenseLinear(nn.Linear):
    """nn.Linear followed by the activation a TWLinear applies in its kernel (sparsify's fusion)."""
    activation = "none"

    def forward(self, x):
        y = super().forward(x)
        if self.activation == "gelu":
            return nn.functional.gelu(y)
        return nn.functional.relu(y) if self.activation == "relu" else y


def dense_copy(model):
    """A deep copy of the model with every TWLinear back as an nn.Linear holding W ⊙ mask (and
    applying the activation sparsify fused into the kernel, if any): the dense model that computes
    what the sparse one computes (to check it, or to compare speed)."""
    import copy
    m = copy.deepcopy(model)
    for name, mod in list(m.named_modules()):
        if isinstance(mod, TWLinear):
            lin = _DenseLinear(mod.in_features, mod.out_features, bias=mod.bias is not None,
                               device=mod.weight.device, dtype=mod.weight.dtype)
            lin.activation = mod.activation
            with torch.no_grad():
                lin.weight.copy_(mod.masked_weight())
                if mod.bias is not None:
                    lin.bias.copy_(mod.bias)
            parent, _, attr = name.rpartition(".")
            setattr(m.get_submodule(parent) if parent else m, attr, lin)
    return m


# --- calibrated pruning of any model (tilejit.sequential) ------------------------------------------

from .sequential import DEFAULT_IGNORE, PruneError, PruneInterrupted, PruneReport, statistics  # noqa: E402
from .recover import TileLinear, finetune, recover  # noqa: E402


def prune(model, data, *, sparsity=None, budget_ms=None, mode="tw1", g=128, layers=None, ignore=DEFAULT_IGNORE,
          num_samples=512, max_seq_len=None, allocation="measured", sequential=True, target="dense", residual=True,
          norm_refit=None, loss=None, sequential_targets=None, profile_data=None, profile_samples=64, steps=16,
          measure=None, latency_m=128, threads=None, damp=None, ew=None, tilejit=None, progress=True,
          recover=None, recover_steps=200, recover_lr=1e-4):
    """Prunes a model's nn.Linear layers tile-wise in place, calibrated on the user's data, and
    returns a PruneReport (per layer: density, relative output error against the dense model's
    layer output, seconds; totals; peak memory; .pattern). docs/pruning-torch.md has the method.

    data: an iterable of batches, e.g. a DataLoader: a dict is fed as model(**batch), a tuple or
      list as model(*batch), a tensor as model(batch). The first num_samples samples (first
      dimension) are used, each tensor's second dimension cut to max_seq_len when given; tokens
      where the batch's attention_mask is 0 are left out of the statistics. With
      allocation="measured" the next profile_samples samples (or profile_data) measure the loss.
    sparsity: the fraction of the selected layers' weights removed; or budget_ms: a latency budget
      (the summed time of the layers at latency_m tokens, measured by tilejit's runtime).
    mode "tw1" | "tw2" | "tew" (ew: its residual fraction), g: the tile width.
    layers / ignore: regular expressions on module names (re.search): which nn.Linear are pruned
      (default: all) and which not (default: output heads: lm_head, classifier, pooler, score,
      qa_outputs, cls; layers tied to an embedding are never pruned).
    allocation: "measured" (each layer's density chosen by a knapsack over a measured loss table:
      the model's own output with one layer pruned at a time, `loss(output, dense_output, batch)`
      or by default KL of the logits / 1 − cosine of the mean-pooled last hidden state),
      "uniform" (every layer at 1 − sparsity) or "global" (the magnitude pruner's threshold).
    sequential: each group of layers (those that read one input, as Q/K/V, in the order their
      forward hooks fire) is pruned on inputs that come through the already pruned groups;
      target "dense": rebuilt to reproduce the dense model's output (else its own); residual:
      layers whose output is added to a residual also make up for its drift; norm_refit: the
      norm after such a sum is refitted to the dense model's output (None, the default: only in
      post-norm blocks, whose output is a norm's, as BERT's; True: always; False: never).
    sequential_targets: the blocks (a regex on module or class names, or a list of names);
      default: the entries of the model's first nn.ModuleList of 2+ entries with a selected layer.
    progress: True (lines on stderr), False, or a callable taking each line.
    recover: "block" trains each block after it is pruned (block-local reconstruction: Adam on its
      kept weights, biases and norms against the dense block's outputs, recover_steps steps at
      recover_lr, early stopping on held-out calibration batches; tilejit.recover).

    Errors (PruneError, one message naming the layer or batch) and interrupts (PruneInterrupted)
    leave the model as it was. The pattern is kept on the model for save_pruned()."""
    from . import sequential as seq
    return seq.prune(model, data, sparsity=sparsity, budget_ms=budget_ms, mode=mode, g=g, layers=layers,
                     ignore=ignore, num_samples=num_samples, max_seq_len=max_seq_len, allocation=allocation,
                     sequential=sequential, target=target, residual=residual, norm_refit=norm_refit, loss=loss,
                     sequential_targets=sequential_targets, profile_data=profile_data,
                     profile_samples=profile_samples, steps=steps, measure=measure, latency_m=latency_m,
                     threads=threads, damp=damp, ew=ew, tilejit=tilejit, progress=progress, recover=recover,
                     recover_steps=recover_steps, recover_lr=recover_lr)


def pattern_of(model):
    """The tile-wise pattern of a model (a tilejit-pattern dict): the one prune() left on it, else
    its TWLinear layers' (as sparsify() bound them, under their module names), else None."""
    p = getattr(model, "_tilejit_pattern", None)
    if p is not None:
        return p
    layers = []
    for name, mod in model.named_modules():
        if isinstance(mod, TWLinear):
            # an activation sparsify fused is the model's own module again once saved and reloaded
            layers.append(dict(mod.layer, name=name, **({"activation": "none"} if mod.fused else {})))
    return {"format": "tilejit-pattern", "version": 1, "layers": layers} if layers else None


def save_pruned(model, directory, *, pattern=None, tokenizer=None):
    """Writes a pruned model to `directory`: pattern.json and its weights, dense, with exact zeros
    outside the pattern (norms refitted by prune() included), under the model's own state_dict
    names, so that the original model's from_pretrained(directory) loads the pruned model (a
    Hugging Face model is written with its save_pretrained: config.json, model.safetensors; any
    other module as model.safetensors). `tokenizer` (optional) is saved beside it. Everything is
    written to a temporary folder first and moved into place at the end, so an interrupted save
    leaves `directory` as it was. Returns the directory."""
    import os
    import shutil
    import tempfile
    pattern = pattern if pattern is not None else pattern_of(model)
    if pattern is None:
        raise ValueError("tilejit.save_pruned: the model has no tile-wise pattern (prune or sparsify it first, "
                         "or pass pattern=)")
    if not isinstance(pattern, dict):
        from . import _pattern_text
        pattern = json.loads(_pattern_text(pattern))
    mods = dict(model.named_modules())
    for l in pattern["layers"]:  # the weights must hold the pattern's zeros exactly
        m = mods.get(l["name"])
        if m is None or not hasattr(m, "weight"):
            raise ValueError("tilejit.save_pruned: pattern layer '%s' is not a module of the model" % l["name"])
        keep = layer_mask(l)
        if tuple(keep.shape) != tuple(m.weight.shape):
            raise ValueError("tilejit.save_pruned: layer '%s' has weights %s, the pattern [%d, %d]"
                             % (l["name"], tuple(m.weight.shape), l["n"], l["k"]))
        if isinstance(m, TWLinear):
            continue  # the kernel ignores what lies outside the mask; it is zeroed when written
        if bool((m.weight.detach().cpu()[~keep] != 0).any()):
            raise ValueError("tilejit.save_pruned: layer '%s' has nonzero weights outside its pattern" % l["name"])
    directory = os.path.abspath(directory)
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="." + os.path.basename(directory) + ".tmp-", dir=parent)
    try:
        _write_weights(model, pattern, tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        with open(os.path.join(tmp, "pattern.json"), "w") as f:
            json.dump(pattern, f)
        old = None
        if os.path.exists(directory):
            old = tempfile.mkdtemp(prefix="." + os.path.basename(directory) + ".old-", dir=parent)
            os.rmdir(old)
            os.rename(directory, old)
        os.rename(tmp, directory)
        if old:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return directory


@contextlib.contextmanager
def _dequantized(model):
    """A model transformers loaded from GGUF holds dense float weights (dequantised at load), but
    keeps the GGUF quantizer, which refuses save_pretrained; the model is saved as the dense
    model it is (config without quantization_config). Other quantizers are left to transformers."""
    q = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(q, "quantization_config", None), "quant_method", None)
    if q is None or str(getattr(method, "value", method)) != "gguf":
        yield
        return
    cfg = model.config
    had = hasattr(cfg, "quantization_config")
    qc = getattr(cfg, "quantization_config", None)
    flag = getattr(model, "is_quantized", None)
    model.hf_quantizer = None
    if had:
        del cfg.quantization_config
    if flag is not None:
        model.is_quantized = False
    try:
        yield
    finally:
        model.hf_quantizer = q
        if had:
            cfg.quantization_config = qc
        if flag is not None:
            model.is_quantized = flag


def _write_weights(model, pattern, d):
    """The model's weights into folder d, TWLinear weights with their mask applied."""
    import os
    masked = {}
    mods = dict(model.named_modules())
    for l in pattern["layers"]:
        m = mods[l["name"]]
        if isinstance(m, TWLinear):
            masked[l["name"] + ".weight"] = m.masked_weight().detach()
    if hasattr(model, "save_pretrained"):
        sd = model.state_dict()
        sd.update(masked)
        with _dequantized(model):
            model.save_pretrained(d, state_dict=sd, safe_serialization=True)
        return
    from . import safetensors
    out = {}
    for k, v in model.state_dict().items():
        v = masked.get(k, v).detach().cpu()
        out[k] = v.float().numpy() if v.dtype == torch.bfloat16 else v.numpy()
    safetensors.save(os.path.join(d, "model.safetensors"), out, {"format": "pt"})
