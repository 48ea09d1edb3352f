"""Minimal safetensors reading and writing with NumPy (F32, F16, BF16 as float32, I64, ...), for
tests, the quality script and model conversion. Reads are memory-mapped."""
import json
import struct

_DT = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
       "U8": "u1", "BOOL": "?"}


def load(path):
    """{name: numpy array} for every tensor of a safetensors file (BF16 is widened to float32)."""
    import numpy as np
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    base = 8 + n
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = mm[base + b:base + e]
        if t["dtype"] == "BF16":
            a = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            a = raw.view(_DT[t["dtype"]])
        out[name] = a.reshape(t["shape"])
    return out


def save(path, tensors, metadata=None, dtypes=None):
    """Writes {name: numpy array} (float32, float16, int64, ...) as a safetensors file. dtypes:
    {name: "BF16"} for tensors given as their raw uint16 bits."""
    import numpy as np
    rev = {np.dtype(v).str: k for k, v in _DT.items()}
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        a = a.astype(a.dtype.newbyteorder("<")) if a.dtype.byteorder == ">" else a
        key = a.dtype.str if a.dtype.str in rev else "<" + a.dtype.str[1:]
        dt = (dtypes or {}).get(name) or rev[key]
        if dt == "BF16" and a.dtype != np.uint16:
            raise ValueError("%s: BF16 needs the raw bits as uint16" % name)
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        blobs.append(a)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for a in blobs:
            f.write(a.tobytes())
