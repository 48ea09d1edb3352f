"""Dense masks of tile-wise patterns, with NumPy alone: True where a layer keeps a weight (the mask
of docs/architecture.md). tilejit.torch (TWLinear.mask) and scripts/quality both use these."""
import json

import numpy as np


def layer_mask(layer):
    """The boolean mask [n × k] of one pattern layer (a dict of the tilejit-pattern JSON): tile t's
    kept input features over its output features (the kept columns `cols`, or all n, g at a time),
    plus the ew residual."""
    n, k, g = layer["n"], layer["k"], layer["g"]
    cols = np.asarray(layer.get("cols", range(n)), dtype=np.int64)
    mask = np.zeros((n, k), dtype=bool)
    for t, rows in enumerate(layer["tiles"]):
        c = cols[t * g:(t + 1) * g]
        if len(rows) and len(c):
            mask[np.ix_(c, np.asarray(rows, dtype=np.int64))] = True
    ew = layer.get("ew")
    if ew:
        rows = np.repeat(np.arange(n), np.diff(np.asarray(ew["indptr"], dtype=np.int64)))
        mask[rows, np.asarray(ew["indices"], dtype=np.int64)] = True
    return mask


def pattern_masks(path):
    """{layer name: layer_mask} of every layer of a tilejit-pattern file."""
    with open(path) as f:
        pattern = json.load(f)
    return {l["name"]: layer_mask(l) for l in pattern["layers"]}
