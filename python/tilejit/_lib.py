"""ctypes declarations of tilejit's public C API (include/tilejit.h) and how the library is found.

Search order for libtilejit.so: $TILEJIT_LIBRARY (a file path), then build/libtilejit.so of the
source tree this package sits in (when imported from python/ in a checkout) or of the current
directory, then the system's library path (ldconfig, LD_LIBRARY_PATH).
"""
import ctypes
import ctypes.util
import os

# --- DLPack (dlpack.h: DLTensor is the same in v0.6 and v1.x; v1 adds the versioned capsule) --
kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13
DLPACK_MAJOR, DLPACK_MINOR = 1, 0  # the newest DLPack ABI this binding reads
DLPACK_FLAG_READ_ONLY, DLPACK_FLAG_IS_COPIED = 1 << 0, 1 << 1
kDLInt, kDLUInt, kDLFloat, kDLBfloat = 0, 1, 2, 4


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))),
]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


DLManagedTensorVersioned._fields_ = [
    ("version", DLPackVersion),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", DLTensor),
]

# --- tilejit.h ---------------------------------------------------------------------------------
TJ_OK = 0
STATUS_NAMES = ["ok", "invalid argument", "I/O error", "bad file format", "not found", "out of memory",
                "unsupported", "compile error", "device error", "internal error"]
BACKENDS = {"auto": 0, "reference": 1, "cpu": 2, "cuda": 3}
THREADING = {"auto": 0, "pool": 1, "openmp": 2}  # tj_threading
PRECISIONS = {"auto": 0, "f32": 1, "bf16": 2}  # tj_precision (options); "f16" = 3 is only reported
ACTIVATIONS = ["none", "relu", "gelu"]
LAYOUT_ROW_MAJOR, LAYOUT_FEATURE_MAJOR = 0, 1


class Options(ctypes.Structure):
    _fields_ = [
        ("size", ctypes.c_size_t),  # set by tj_options_default
        ("backend", ctypes.c_int),
        ("threads", ctypes.c_int),
        ("cache_dir", ctypes.c_char_p),
        ("tuning_log", ctypes.c_char_p),
        ("device", ctypes.c_int),
        ("verbose", ctypes.c_int),
        ("threading", ctypes.c_int),
        ("precision", ctypes.c_int),  # tj_precision
    ]


class NamedTensor(ctypes.Structure):
    """tj_named_tensor (tilejit/tensors.h): a safetensors-style name and a borrowed DLTensor."""
    _fields_ = [("name", ctypes.c_char_p), ("tensor", ctypes.POINTER(DLTensor))]


class PruneParams(ctypes.Structure):
    """tj_prune_params (tilejit/tensors.h)."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("sparsity", ctypes.c_double),
        ("g", ctypes.c_int64),
        ("mode", ctypes.c_char_p),
        ("ew_fraction", ctypes.c_double),
    ]


class LayerInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("g", ctypes.c_int64),
        ("kept_cols", ctypes.c_int64),
        ("tiles", ctypes.c_int64),
        ("kept_weights", ctypes.c_int64),
        ("ew_nnz", ctypes.c_int64),
        ("activation", ctypes.c_int),
        ("has_bias", ctypes.c_int),
        ("pattern_hash", ctypes.c_uint64),
    ]


# --- tilejit/prune.h: the calibrated pruner in memory (docs/pruning-calibrated.md) --------------
TJ_F32, TJ_F16, TJ_BF16 = 0, 1, 2
PRUNE_MODES = {"tw1": 1, "tw2": 2, "tew": 3}


class Error(ctypes.Structure):
    """tj_error (tilejit.h)."""
    _fields_ = [("status", ctypes.c_int), ("msg", ctypes.c_char * 4096)]


class PruneOptions(ctypes.Structure):
    """tj_prune_options."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("sparsity", ctypes.c_double),
        ("g", ctypes.c_int64),
        ("mode", ctypes.c_int),
        ("tew_base", ctypes.c_int),
        ("ew_fraction", ctypes.c_double),
    ]


class CalibratedOptions(ctypes.Structure):
    """tj_prune_calibrated_options (set by tj_prune_calibrated_options_default)."""
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("prune", PruneOptions),
        ("calibration", ctypes.c_char_p),
        ("allocation", ctypes.c_int),
        ("profile", ctypes.c_char_p),
        ("budget_ms", ctypes.c_double),
        ("damp", ctypes.c_double),
        ("threads", ctypes.c_int),
        ("sweep_out", ctypes.c_char_p),
        ("sweep_steps", ctypes.c_int64),
        ("sweep_weights", ctypes.c_char_p),
        ("pattern_out", ctypes.c_char_p),
        ("pruned_out", ctypes.c_char_p),
        ("progress", ctypes.c_void_p),
        ("progress_user", ctypes.c_void_p),
    ]


class PruneLayerIn(ctypes.Structure):
    """tj_prune_layer_in."""
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("w", ctypes.c_void_p),
        ("wdt", ctypes.c_int),
        ("score", ctypes.c_void_p),
        ("sdt", ctypes.c_int),
    ]


class CalibratedLayer(ctypes.Structure):
    """tj_prune_calibrated_layer."""
    _fields_ = [
        ("layer", PruneLayerIn),
        ("bias", ctypes.c_void_p),
        ("bdt", ctypes.c_int),
        ("hessian", ctypes.c_void_p),
        ("cross", ctypes.c_void_p),
        ("tokens", ctypes.c_int64),
        ("density", ctypes.c_double),
        ("residual", ctypes.c_void_p),
    ]


class PruneProfile(ctypes.Structure):
    """tj_prune_profile (the loss table)."""
    _fields_ = [
        ("nd", ctypes.c_int64),
        ("nl", ctypes.c_int64),
        ("densities", ctypes.POINTER(ctypes.c_double)),
        ("names", ctypes.POINTER(ctypes.c_char_p)),
        ("n", ctypes.POINTER(ctypes.c_int64)),
        ("k", ctypes.POINTER(ctypes.c_int64)),
        ("loss", ctypes.POINTER(ctypes.c_double)),
        ("time_ms", ctypes.POINTER(ctypes.c_double)),
    ]


def _candidates():
    env = os.environ.get("TILEJIT_LIBRARY")
    if env:
        yield env
        return  # an explicit choice is final: never silently load another build
    here = os.path.dirname(os.path.abspath(__file__))
    for root in (os.path.dirname(os.path.dirname(here)), os.getcwd()):
        yield os.path.join(root, "build", "libtilejit.so")  # scripts/build's folder only: other
        # build-* folders may hold sanitizer or debug builds that cannot be loaded into Python
    found = ctypes.util.find_library("tilejit")
    if found:
        yield found
    yield "libtilejit.so"
    yield "libtilejit.so.0"


def _declare(lib):
    c = ctypes
    P = c.POINTER
    sigs = {
        "tj_version": (c.c_char_p, []),
        "tj_status_string": (c.c_char_p, [c.c_int]),
        "tj_backend_name": (c.c_char_p, [c.c_int]),
        "tj_backend_built": (c.c_int, [c.c_int]),
        "tj_options_default": (Options, []),
        "tj_context_create": (c.c_int, [P(Options), P(c.c_void_p)]),
        "tj_context_destroy": (None, [c.c_void_p]),
        "tj_last_error": (c.c_char_p, []),
        "tj_context_error": (c.c_char_p, [c.c_void_p]),
        "tj_context_backend": (c.c_int, [c.c_void_p]),
        "tj_context_threading": (c.c_int, [c.c_void_p]),
        "tj_context_threads": (c.c_int, [c.c_void_p]),
        "tj_context_log": (c.c_char_p, [c.c_void_p]),
        "tj_model_load": (c.c_int, [c.c_void_p, c.c_char_p, c.c_char_p, P(c.c_void_p)]),
        "tj_model_destroy": (None, [c.c_void_p]),
        "tj_model_layer_count": (c.c_int64, [c.c_void_p]),
        "tj_model_find_layer": (c.c_int, [c.c_void_p, c.c_char_p, P(c.c_int64)]),
        "tj_model_layer_info": (c.c_int, [c.c_void_p, c.c_int64, P(LayerInfo)]),
        "tj_model_load_seconds": (c.c_double, [c.c_void_p]),
        "tj_linear_ex": (c.c_int, [c.c_void_p, c.c_int64, P(DLTensor), P(DLTensor), c.c_int, c.c_void_p]),
    }
    optional = {  # tilejit/tensors.h: absent from older libraries, checked where used
        "tj_model_load_tensors": (c.c_int, [c.c_void_p, c.c_char_p, c.c_size_t, P(NamedTensor), c.c_int64,
                                            P(c.c_void_p)]),
        "tj_model_copied_bytes": (c.c_int64, [c.c_void_p]),
        "tj_prune_tensors": (c.c_int, [c.c_void_p, P(NamedTensor), c.c_int64, P(PruneParams),
                                       P(c.c_void_p)]),
        "tj_free": (None, [c.c_void_p]),
        # tilejit/prune.h, tilejit/pattern.h: the calibrated pruner in memory
        "tj_prune_calibrated_options_default": (CalibratedOptions, []),
        "tj_prune_calibrated_layers": (c.c_int, [P(CalibratedLayer), c.c_int64, P(CalibratedOptions),
                                                 P(c.c_void_p), P(c.c_void_p), P(c.c_void_p), P(Error)]),
        "tj_prune_calibrated_sweep_layer": (c.c_int, [P(CalibratedLayer), P(c.c_double), c.c_int64,
                                                      P(CalibratedOptions), P(c.c_void_p), P(c.c_void_p),
                                                      P(c.c_double), P(Error)]),
        "tj_prune_profile_load": (c.c_int, [c.c_char_p, P(P(PruneProfile)), P(Error)]),
        "tj_prune_profile_destroy": (None, [P(PruneProfile)]),
        "tj_prune_allocate": (c.c_int, [P(PruneProfile), c.c_double, c.c_double, P(c.c_double), P(c.c_int64),
                                        P(Error)]),
        "tj_pattern_to_json": (c.c_void_p, [c.c_void_p]),
        "tj_model_layer_precision": (c.c_int, [c.c_void_p, c.c_int64, c.c_int64, P(c.c_int)]),
        "tj_precision_name": (c.c_char_p, [c.c_int]),
        "tj_pattern_destroy": (None, [c.c_void_p]),
        # tilejit.h: the path a layer takes per M (the kernel or the dense path)
        "tj_model_layer_path": (c.c_int, [c.c_void_p, c.c_int64, c.c_int64, P(c.c_int), P(c.c_char_p),
                                          P(c.c_char_p)]),
    }
    for name, sig in optional.items():
        if hasattr(lib, name):
            sigs[name] = sig
    for name, (res, args) in sigs.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args
    return lib


_lib = None


def library():
    """The loaded libtilejit (ctypes.CDLL), loaded on first use."""
    global _lib
    if _lib is not None:
        return _lib
    tried = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            _lib = _declare(ctypes.CDLL(path))
            _lib._tilejit_path = path
            return _lib
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise OSError("tilejit: cannot load libtilejit.so; set TILEJIT_LIBRARY to its path, build it with "
                  "scripts/build, or install it (meson install). Tried: " + "; ".join(tried))
