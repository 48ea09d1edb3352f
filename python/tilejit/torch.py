"""tilejit.torch: tilejit's tile-wise sparse kernels inside PyTorch models (optional: needs torch).

    import tilejit.torch as tjt
    report = tjt.sparsify(model, sparsity=0.75)        # or pattern="p.json"[, weights="w.safetensors"]
    print(report)                                      # which nn.Linear became a TWLinear, and how dense

- `torch.ops.tilejit.linear(x, handle)` is a torch.library custom operator with a CPU and a CUDA
  kernel and a fake (meta) kernel, so it runs in eager mode and under
  `torch.compile(fullgraph=True)`; `handle` names a layer bound by TWLinear / sparsify.
- `TWLinear` replaces an `nn.Linear`: y = act(x · (W ⊙ mask)ᵀ + b) with tilejit's kernel for the
  layer's pattern. Inference only (no autograd formula).
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

__all__ = ["TWLinear", "sparsify", "SparsifyReport", "linear", "layer_mask", "dense_copy"]

# --- bound layers --------------------------------------------------------------------------------


class _Group:
    """Layers loaded together (one pattern, one tilejit model per device, sharing a context), from
    host tensors {"NAME.weight": ..., "NAME.bias": ...} it keeps alive."""

    def __init__(self, pattern, tensors, backend="auto", threads=0, cache_dir=None, tuning_log=None, precision="auto"):
        self.pattern = pattern
        self.tensors = tensors
        self.backend = backend
        self.options = dict(threads=threads, cache_dir=cache_dir, tuning_log=tuning_log, precision=precision)
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
                ctx = Context(backend=be, device=device.index or 0, **self.options)
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
    nd = x.ndim
    x2 = x if nd == 2 else x.reshape(-1, k)
    kind = _KIND.get(x2.dtype)
    if kind is None:
        x2 = x2.float()
        kind = _KIND[torch.float32]
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
    m = x2.shape[0]
    if out is not None:
        if (out.dtype is not kind[2] or out.is_cpu != x2.is_cpu or out.shape[-1] != n or out.numel() != m * n
                or not out.is_contiguous() or (dev is not None and out.device != dev)):
            raise ValueError("tilejit: out must be a contiguous %s tensor of shape %s on %s"
                             % (kind[2], (*shape[:-1], n), x2.device))
        y = out
    elif dev is None:
        y = torch.empty(m, n, dtype=kind[2])
    else:
        y = torch.empty(m, n, dtype=kind[2], device=dev)
    if m:
        s = _scratch
        sx = x2.stride()
        _PACK.pack_into(s.buf, 0,
                        x2.data_ptr(), dev_type, dev_id, 2, kind[0], kind[1], 1, s.xs, s.xst, 0,
                        y.data_ptr(), dev_type, dev_id, 2, kind[3], kind[4], 1, s.ys, s.yst, 0,
                        m, k, sx[0], sx[1], m, n, n, 1)
        st = fn(mp, b.index, s.x, s.y, 0, stream)
        if st:
            raise TilejitError(st, model._error())
    if out is not None:
        return out
    if nd != 2:
        y = y.view(*shape[:-1], n)
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
        return self.weight * self.mask().to(self.weight.device)

    @classmethod
    def from_linear(cls, linear, layer=None, *, sparsity=None, mode="tw1", g=128, ew=0.01, name="linear",
                    backend="auto", threads=0, cache_dir=None, tuning_log=None, precision="auto"):
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

    def forward(self, x, out=None):
        if out is not None or not torch.compiler.is_compiling() and not (x.requires_grad and torch.is_grad_enabled()):
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
    """What sparsify() did: .swapped [(module name, layer name, n, k, density)], .unmatched
    (pattern layers with no nn.Linear), .skipped [(module name, reason)], .seconds."""

    def __init__(self):
        self.swapped, self.unmatched, self.skipped = [], [], []
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
        for m, l, n, k, d in self.swapped:
            lines.append("  %-48s [%d x %d] density %.3f%s" % (m, n, k, d, "" if m == l else "  (layer %s)" % l))
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


def sparsify(model, pattern=None, weights=None, *, sparsity=None, mode="tw1", g=128, ew=0.01, layers=None,
             backend="auto", threads=0, cache_dir=None, tuning_log=None, precision="auto"):
    """Swaps the model's nn.Linear modules for TWLinear in place and returns a SparsifyReport.

    Either pattern= (a tilejit pattern: path, JSON text or dict) names the layers, matched to
    modules by their safetensors names (module names, up to a dotted prefix); weights= (a
    safetensors path or {name: tensor}) then optionally replaces their weights (e.g. the pruned
    weights `tilejit prune` wrote). Or sparsity= prunes the selected nn.Linear weights here
    (mode tw1|tw2|tew, tile width g, one global threshold as `tilejit prune`); layers= (a regular
    expression on module names, re.search) selects them, default: every nn.Linear.
    Every swapped layer is compiled once now on the CPU (backend "cpu", or "reference"), and on
    first use on each CUDA device. precision (CPU): "auto" computes in bf16 where the CPU has
    avx512_bf16 or AMX and the model's weights are bfloat16 (model.to(torch.bfloat16)), else
    fp32; "f32"; "bf16"."""
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
        sub = dict(pattern, layers=[by_layer[l] for _, l in chosen])
        group = _group(sub, tensors, backend, threads, cache_dir, tuning_log, precision)
        group.model(torch.device("cpu"))  # compile now: errors surface here, not at the first call
        rep.backend = group._backend_for(torch.device("cpu"))
        for mname, lname in chosen:
            w, b = tensors[lname]
            tw = TWLinear(_Bound(group, lname, w.shape[0], w.shape[1]), w, b, by_layer[lname].get("activation", "none"))
            parent, _, attr = mname.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, tw)
            rep.swapped.append((mname, lname, w.shape[0], w.shape[1], tw.density))
    rep.seconds = time.perf_counter() - t0
    return rep


def sentence_embeddings(model, batch):
    """Sentence embeddings of a Hugging Face encoder as sentence-transformers computes them: the
    last hidden state mean-pooled over the real tokens (attention mask), L2-normalised."""
    with torch.no_grad():
        h = model(**batch).last_hidden_state
    m = batch["attention_mask"].unsqueeze(-1).to(h.dtype)
    return nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1e-9), dim=1)


def dense_copy(model):
    """A deep copy of the model with every TWLinear back as an nn.Linear holding W ⊙ mask: the
    dense model that computes what the sparse one computes (to check it, or to compare speed)."""
    import copy
    m = copy.deepcopy(model)
    for name, mod in list(m.named_modules()):
        if isinstance(mod, TWLinear):
            lin = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None,
                            device=mod.weight.device, dtype=mod.weight.dtype)
            with torch.no_grad():
                lin.weight.copy_(mod.masked_weight())
                if mod.bias is not None:
                    lin.bias.copy_(mod.bias)
            parent, _, attr = name.rpartition(".")
            setattr(m.get_submodule(parent) if parent else m, attr, lin)
    return m
