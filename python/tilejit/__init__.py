"""tilejit: tile-wise sparse linear layers, generated per layer and JIT-compiled (Python binding).

    import numpy as np, tilejit
    model = tilejit.load("model.pattern.json", "model.safetensors", backend="cpu")
    for layer in model.layers:
        print(layer.name, layer.n, layer.k, layer.density)
    y = model.linear("encoder.layer.0.intermediate.dense", np.random.rand(128, 384).astype(np.float32))

`model.linear(layer, x)` computes Y = act(X · (W ⊙ mask)ᵀ + bias) for one layer. x is a 2-D
NumPy array (float32 or float16; other float dtypes are converted to float32) or any object with
`__dlpack__` (PyTorch, CuPy, JAX, NumPy ≥ 1.22). The result is float32 [M × n] of the same kind:
NumPy in, NumPy out; another producer's tensor comes back through that producer's own
`from_dlpack` (its array-API namespace or its top-level module), else as a NumPy array. Device
tensors (CUDA) get a device output allocated by the producer and need the cuda backend.

The library is a thin ctypes layer over libtilejit.so (see tilejit._lib for how it is found:
$TILEJIT_LIBRARY, a meson build folder, or the system library path). Failures raise
TilejitError carrying the C status and tj_context_error's message.
"""
import ctypes
import sys
from collections import namedtuple

from . import _lib as L
from ._lib import library

__all__ = ["load", "Model", "Context", "Layer", "TilejitError", "version", "library"]


class TilejitError(RuntimeError):
    """A tilejit call failed. .status is the tj_status code, .status_name its name."""

    def __init__(self, status, message):
        self.status = int(status)
        self.status_name = L.STATUS_NAMES[status] if 0 <= status < len(L.STATUS_NAMES) else "status %d" % status
        super().__init__(message or self.status_name)


Layer = namedtuple("Layer", "index name n k g kept_cols tiles kept_weights ew_nnz activation has_bias "
                            "pattern_hash density")


def version():
    return library().tj_version().decode()


def backend_built(backend):
    """Whether this libtilejit has a backend: "cpu" needs LLVM at build time, "cuda" the CUDA
    toolkit; "reference" is always there."""
    if backend not in L.BACKENDS:
        raise ValueError("tilejit: unknown backend %r (expected one of %s)" % (backend, ", ".join(L.BACKENDS)))
    return bool(library().tj_backend_built(L.BACKENDS[backend]))


def load(pattern, weights, backend="auto", tuning_log=None, threads=0, cache_dir=None, device=0,
         verbose=False, context=None, threading="auto", precision="auto"):
    """Loads a pattern (JSON) and its weights (safetensors) and prepares every layer on a backend
    ("auto", "cpu", "cuda" or "reference"), or on `context` (a Context) when given. Returns a
    Model. threads, threading, precision: as Context."""
    return Model(pattern, weights, backend=backend, tuning_log=tuning_log, threads=threads,
                 cache_dir=cache_dir, device=device, verbose=verbose, context=context, threading=threading,
                 precision=precision)


def _enc(s):
    return None if s is None else str(s).encode()


class _Tensor:
    """A DLTensor plus whatever keeps its memory and shape arrays alive during a call."""

    def __init__(self, t, keep, device_type):
        self.t, self.keep, self.device_type = t, keep, device_type


def _numpy():
    import numpy
    return numpy


def _is_numpy(a):
    np = sys.modules.get("numpy")
    return np is not None and isinstance(a, np.ndarray)


def _from_numpy(a, writable, ndim=2):
    np = _numpy()
    if ndim is not None and a.ndim != ndim:
        raise ValueError("tilejit: expected a %d-D array, got %d-D" % (ndim, a.ndim))
    if a.dtype not in (np.float32, np.float16) or not a.dtype.isnative:
        if writable:
            raise TypeError("tilejit: output must be a native float32 or float16 array, got %s" % a.dtype)
        a = np.ascontiguousarray(a, dtype=np.float32)
    if writable and not a.flags.writeable:
        raise ValueError("tilejit: output array is read-only")
    item = a.itemsize
    if any(s % item for s in a.strides):
        a = np.ascontiguousarray(a)
    shape = (ctypes.c_int64 * max(1, a.ndim))(*a.shape)
    strides = (ctypes.c_int64 * max(1, a.ndim))(*(s // item for s in a.strides))
    t = L.DLTensor()
    t.data = a.ctypes.data if a.size else (a.ctypes.data or 1)
    t.device = L.DLDevice(L.kDLCPU, 0)
    t.ndim = a.ndim
    t.dtype = L.DLDataType(L.kDLFloat, 8 * item, 1)
    t.shape = shape
    t.strides = strides
    t.byte_offset = 0
    return _Tensor(t, (a, shape, strides), L.kDLCPU)


_capsule_get = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_get.restype = ctypes.c_void_p
_capsule_get.argtypes = [ctypes.py_object, ctypes.c_char_p]
_capsule_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_valid.restype = ctypes.c_int
_capsule_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack_capsule(obj, stream=None):
    """obj.__dlpack__, asking for DLPack 1.x first (max_version) and falling back to the legacy
    call on TypeError (producers that predate the keyword)."""
    kw = {} if stream is None else {"stream": stream}
    try:
        return obj.__dlpack__(max_version=(L.DLPACK_MAJOR, L.DLPACK_MINOR), **kw)
    except TypeError:
        pass
    try:
        return obj.__dlpack__(**kw)
    except TypeError:
        if not kw:
            raise
        return obj.__dlpack__()


def _dltensor_of(cap, writable):
    """The DLTensor inside a DLPack capsule (versioned or legacy) and whether it is read-only.
    Refuses a versioned capsule of an ABI major version this binding does not know, and a
    read-only tensor where tilejit would write."""
    if _capsule_valid(cap, b"dltensor_versioned"):
        mt = L.DLManagedTensorVersioned.from_address(_capsule_get(cap, b"dltensor_versioned"))
        if mt.version.major != L.DLPACK_MAJOR:
            raise TypeError("tilejit: DLPack tensor of ABI version %d.%d; this binding reads %d.x"
                            % (mt.version.major, mt.version.minor, L.DLPACK_MAJOR))
        read_only = bool(mt.flags & L.DLPACK_FLAG_READ_ONLY)
        if writable and read_only:
            raise ValueError("tilejit: output tensor is read-only (DLPack flag)")
        return mt.dl_tensor, read_only
    if _capsule_valid(cap, b"dltensor"):
        return L.DLManagedTensor.from_address(_capsule_get(cap, b"dltensor")).dl_tensor, False
    raise TypeError("tilejit: __dlpack__ returned neither a 'dltensor_versioned' nor a 'dltensor' capsule")


def _from_dlpack(obj, stream=None, writable=False, ndim=2):
    """Borrows obj's memory through its DLPack capsule. The capsule is not consumed: it stays
    alive for the call and its destructor runs the producer's deleter afterwards."""
    cap = _dlpack_capsule(obj, stream)
    t, _ = _dltensor_of(cap, writable)
    if ndim is not None and t.ndim != ndim:
        raise ValueError("tilejit: expected a %d-D tensor, got %d-D" % (ndim, t.ndim))
    return _Tensor(t, (cap, obj), t.device.device_type)


def _producer_module(obj):
    return sys.modules.get(type(obj).__module__.split(".")[0])


def _same_kind(like, y_np):
    """Hands a NumPy result back as the kind of array `like` is."""
    ns = getattr(like, "__array_namespace__", None)
    if ns is not None:
        try:
            mod = ns()
            if hasattr(mod, "from_dlpack"):
                return mod.from_dlpack(y_np)
        except Exception:
            pass
    mod = _producer_module(like)
    for f in (getattr(mod, "from_dlpack", None), getattr(getattr(mod, "dlpack", None), "from_dlpack", None)):
        if f is not None:
            try:
                return f(y_np)
            except Exception:
                pass
    return y_np


def _device_empty(like, rows, cols):
    """A float32 [rows × cols] array on like's device, made by like's own library."""
    ns = getattr(like, "__array_namespace__", None)
    mod = ns() if ns is not None else _producer_module(like)
    if mod is None or not hasattr(mod, "empty"):
        raise TypeError("tilejit: cannot allocate a device output like %s; pass out=" % type(like).__name__)
    try:
        return mod.empty((rows, cols), dtype=mod.float32, device=like.device)
    except TypeError:
        return mod.empty((rows, cols), dtype=mod.float32)


class Context:
    """A tilejit context: the backend ("auto", "cpu", "cuda" or "reference"), CPU threads and where
    they come from, kernel cache and tuning log. Models loaded on one context share its threads and
    JIT; close() (or `with`) frees it once its models are closed.

    threading: "auto" (the process's OpenMP runtime when one is loaded, as in a process that
    imported torch; else tilejit's own worker threads), "pool" or "openmp" (docs/threads.md).
    threads: CPU threads per call; 0: with OpenMP the calling thread's OpenMP thread count at each
    call (torch.set_num_threads), with the own pool all cores.
    precision (CPU backend): "auto" computes in bf16 where the CPU has avx512_bf16 or AMX and a
    layer's weights are bfloat16, else fp32; "f32"; "bf16" (x and weights rounded to bf16, fp32
    accumulation and output). Model.precision(layer, m) says which ran."""

    def __init__(self, backend="auto", tuning_log=None, threads=0, cache_dir=None, device=0, verbose=False,
                 threading="auto", precision="auto"):
        lib = library()
        self._lib = lib
        self._ctx = ctypes.c_void_p()
        if backend not in L.BACKENDS:
            raise ValueError("tilejit: unknown backend %r (expected one of %s)" % (backend, ", ".join(L.BACKENDS)))
        if precision not in L.PRECISIONS:
            raise ValueError("tilejit: unknown precision %r (expected one of %s)" % (precision, ", ".join(L.PRECISIONS)))
        opt = lib.tj_options_default()
        opt.backend = L.BACKENDS[backend]
        opt.precision = L.PRECISIONS[precision]
        if threading not in L.THREADING:
            raise ValueError("tilejit: unknown threading %r (expected one of %s)" % (threading, ", ".join(L.THREADING)))
        opt.threads = int(threads)
        opt.threading = L.THREADING[threading]
        opt.device = int(device)
        opt.verbose = 1 if verbose else 0
        keep = (_enc(cache_dir), _enc(tuning_log))
        opt.cache_dir, opt.tuning_log = keep
        s = lib.tj_context_create(ctypes.byref(opt), ctypes.byref(self._ctx))
        if s != L.TJ_OK:
            self._ctx = None
            raise TilejitError(s, lib.tj_last_error().decode(errors="replace"))

    def close(self):
        if getattr(self, "_ctx", None):
            self._lib.tj_context_destroy(self._ctx)
            self._ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def backend(self):
        return self._lib.tj_backend_name(self._lib.tj_context_backend(self._ctx)).decode()

    @property
    def threading(self):
        """Where the CPU backend's parallel loops run: "pool" or "openmp"."""
        t = self._lib.tj_context_threading(self._ctx)
        return next(k for k, v in L.THREADING.items() if v == t)

    @property
    def threads(self):
        """The CPU threads a call made now from this thread would use (tj_context_threads)."""
        return self._lib.tj_context_threads(self._ctx)

    @property
    def log(self):
        return self._lib.tj_context_log(self._ctx).decode(errors="replace")

    def error(self):
        return self._lib.tj_context_error(self._ctx).decode(errors="replace")

    def prune(self, tensors, sparsity, mode="tw1", g=128, ew_fraction=0.01):
        """Tile-wise pruning of in-memory weights, one global threshold across the layers (as
        `tilejit prune`). tensors: {layer name: weight [n × k]} (host, float32/float16/bfloat16,
        NumPy or any DLPack producer). Returns the pattern as a dict (tilejit-pattern JSON)."""
        import json
        fn = getattr(self._lib, "tj_prune_tensors", None)
        if fn is None:
            raise TilejitError(6, "this libtilejit has no tj_prune_tensors (too old)")
        arr, keep = _named_tensors({"%s.weight" % k: v for k, v in tensors.items()})
        par = L.PruneParams(ctypes.sizeof(L.PruneParams), float(sparsity), int(g), _enc(mode), float(ew_fraction))
        out = ctypes.c_void_p()
        s = fn(self._ctx, arr, len(keep), ctypes.byref(par), ctypes.byref(out))
        if s != L.TJ_OK:
            raise TilejitError(s, self.error())
        try:
            return json.loads(ctypes.string_at(out.value).decode())
        finally:
            self._lib.tj_free(out)


def _named_tensors(tensors):
    """A tj_named_tensor array over {name: array}, and what keeps each tensor's memory alive."""
    items = list(tensors.items())
    arr = (L.NamedTensor * max(1, len(items)))()
    keep = []
    for i, (name, a) in enumerate(items):
        if _is_numpy(a) or not hasattr(a, "__dlpack__"):
            np = _numpy()
            a = np.asarray(a)
            if a.dtype not in (np.float32, np.float16):
                a = a.astype(np.float32)
            t = _from_numpy(a, writable=False, ndim=None)
        else:
            t = _from_dlpack(a, ndim=None)
        nm = _enc(name)
        arr[i].name = nm
        arr[i].tensor = ctypes.pointer(t.t)
        keep.append((nm, t))
    return arr, keep


def _pattern_text(pattern):
    """Pattern JSON text from a dict, JSON text, or a file path."""
    import json
    if isinstance(pattern, dict):
        return json.dumps(pattern)
    if isinstance(pattern, bytes):
        pattern = pattern.decode()
    if isinstance(pattern, str) and pattern.lstrip().startswith("{"):
        return pattern
    with open(pattern) as f:
        return f.read()


class Model:
    """A loaded model: its layers, on a context (its own unless one is given). Thread-safe for
    concurrent linear() calls; close() (or `with`) frees it."""

    def __init__(self, pattern, weights, backend="auto", tuning_log=None, threads=0, cache_dir=None,
                 device=0, verbose=False, context=None, threading="auto", precision="auto"):
        self._setup(context, dict(backend=backend, tuning_log=tuning_log, threads=threads,
                                  cache_dir=cache_dir, device=device, verbose=verbose, threading=threading,
                                  precision=precision))
        s = self._lib.tj_model_load(self._ctx, _enc(pattern), _enc(weights), ctypes.byref(self._model))
        self._finish(s)

    @classmethod
    def from_tensors(cls, pattern, tensors, context=None, **options):
        """Loads a model from memory: pattern (a dict, JSON text or a path) and tensors
        {"NAME.weight": [n × k], "NAME.bias": [n]} as NumPy arrays or DLPack producers (PyTorch
        ...), named as in a safetensors checkpoint. Compact row-major host tensors are used in
        place, without a copy (the model keeps them alive); others are copied once
        (model.copied_bytes says how much). options: as load() (when no context is given)."""
        self = cls.__new__(cls)
        self._setup(context, options)
        fn = getattr(self._lib, "tj_model_load_tensors", None)
        if fn is None:
            self.close()
            raise TilejitError(6, "this libtilejit has no tj_model_load_tensors (too old)")
        text = _enc(_pattern_text(pattern))
        arr, keep = _named_tensors(tensors)
        self._keep = (arr, keep)
        self._finish(fn(self._ctx, text, len(text), arr, len(keep), ctypes.byref(self._model)))
        return self

    def _setup(self, context, options):
        self._model = ctypes.c_void_p()
        self._ctx = None
        self._own_context = context is None
        self._context = context if context is not None else Context(**options)
        self._lib = self._context._lib
        self._ctx = self._context._ctx

    def _finish(self, s):
        lib = self._lib
        if s != L.TJ_OK:
            err = TilejitError(s, self._error())
            self.close()
            raise err
        self._layers = []
        for i in range(lib.tj_model_layer_count(self._model)):
            li = L.LayerInfo()
            self._check(lib.tj_model_layer_info(self._model, i, ctypes.byref(li)))
            self._layers.append(Layer(i, li.name.decode(), li.n, li.k, li.g, li.kept_cols, li.tiles,
                                      li.kept_weights, li.ew_nnz, L.ACTIVATIONS[li.activation],
                                      bool(li.has_bias), li.pattern_hash, li.kept_weights / max(1, li.n * li.k)))
        self._index = {l.name: l.index for l in self._layers}

    # --- lifetime ---
    def close(self):
        if getattr(self, "_model", None):
            self._lib.tj_model_destroy(self._model)
            self._model = None
        if getattr(self, "_own_context", False) and getattr(self, "_context", None) is not None:
            self._context.close()
        self._context = None
        self._ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    @property
    def context(self):
        return self._context

    @property
    def copied_bytes(self):
        """Bytes of weights tilejit copied when loading from tensors (0: all used in place)."""
        fn = getattr(self._lib, "tj_model_copied_bytes", None)
        return fn(self._model) if fn is not None else 0

    # --- facts ---
    @property
    def backend(self):
        return self._lib.tj_backend_name(self._lib.tj_context_backend(self._ctx)).decode()

    @property
    def load_seconds(self):
        return self._lib.tj_model_load_seconds(self._model)

    @property
    def log(self):
        return self._lib.tj_context_log(self._ctx).decode(errors="replace")

    @property
    def layers(self):
        """Every layer, in pattern order, as Layer tuples."""
        return list(self._layers)

    def layer(self, key):
        return self._layers[self._resolve(key)]

    def layer_path(self, layer, m):
        """Which way layer (name or index) runs at batch size m, as (path, library, why): path
        "kernel" (the generated kernel) or "dense" (a dense library on the masked weights, where it
        is faster: docs/dense-path.md); library names it; why says what decided."""
        if not hasattr(self._lib, "tj_model_layer_path"):
            raise TilejitError(6, "this libtilejit has no tj_model_layer_path (older than issue 25)")
        c = ctypes
        path, lib, why = c.c_int(0), c.c_char_p(), c.c_char_p()
        self._check(self._lib.tj_model_layer_path(self._model, self._resolve(layer), int(m), c.byref(path),
                                                  c.byref(lib), c.byref(why)))
        return ("dense" if path.value == 1 else "kernel", lib.value.decode(), why.value.decode())

    def __len__(self):
        return len(self._layers)

    def __repr__(self):
        return "<tilejit.Model %d layers on %s>" % (len(self._layers), self.backend if self._ctx else "closed")

    # --- running ---
    def _error(self):
        return self._lib.tj_context_error(self._ctx).decode(errors="replace")

    def _check(self, s):
        if s != L.TJ_OK:
            raise TilejitError(s, self._error())

    def _resolve(self, key):
        if isinstance(key, str):
            if key not in self._index:
                raise TilejitError(4, "no layer named '%s' in the model" % key)
            return self._index[key]
        i = int(key)
        if not -len(self._layers) <= i < len(self._layers):
            raise TilejitError(4, "layer index %d out of range [0, %d)" % (i, len(self._layers)))
        return i % len(self._layers)

    def precision(self, layer, m=128):
        """The precision ("f32", "bf16", "f16") a layer (name or index) computes in at batch m."""
        fn = getattr(self._lib, "tj_model_layer_precision", None)
        if fn is None:
            raise TilejitError(6, "this libtilejit has no tj_model_layer_precision (too old)")
        p = ctypes.c_int()
        self._check(fn(self._model, self._resolve(layer), int(m), ctypes.byref(p)))
        return self._lib.tj_precision_name(p.value).decode()

    def linear(self, layer, x, out=None, stream=None):
        """Y = act(X · (W ⊙ mask)ᵀ + bias) for one layer (by name or index), row-major.
        x: [M × k]; returns float32 [M × n] of x's kind (or writes into `out` and returns it)."""
        if not self._model:
            raise ValueError("tilejit: model is closed")
        idx = self._resolve(layer)
        info = self._layers[idx]
        is_np = _is_numpy(x) or not hasattr(x, "__dlpack__")
        if is_np:
            np = _numpy()
            xt = _from_numpy(np.asarray(x), writable=False)
        else:
            xt = _from_dlpack(x, stream)
        m = xt.t.shape[0]
        if xt.t.shape[1] != info.k:
            raise TilejitError(1, "layer '%s': x has %d columns, the layer has k = %d input features"
                               % (info.name, xt.t.shape[1], info.k))
        ret = None
        if out is not None:
            yt = _from_numpy(out, writable=True) if _is_numpy(out) else _from_dlpack(out, stream, writable=True)
            ret = out
        elif xt.device_type in (L.kDLCPU, L.kDLCUDAHost):
            np = _numpy()
            y = np.empty((m, info.n), dtype=np.float32)
            yt = _from_numpy(y, writable=True)
            ret = y if is_np else None
        else:
            dev = _device_empty(x, m, info.n)
            yt = _from_dlpack(dev, stream, writable=True)
            ret = dev
        s = self._lib.tj_linear_ex(self._model, idx, ctypes.byref(xt.t), ctypes.byref(yt.t),
                                   L.LAYOUT_ROW_MAJOR, ctypes.c_void_p(stream) if stream else None)
        self._check(s)
        if ret is None:  # host result for a non-NumPy producer: hand it back as that kind
            ret = _same_kind(x, y)
        return ret

    __call__ = linear
