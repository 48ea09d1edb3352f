"""Calibrated tile-wise pruning of any PyTorch model on its user's data: the engine behind
tilejit.torch.prune and python -m tilejit.calibrate (docs/pruning-torch.md).

    data ─ batches (num_samples, max_seq_len) ─ catch the first block's inputs (one pass)
      │  allocation "measured": profile, block by block: dense statistics → the library's sweep
      │     of each layer → the model's own output with that layer alone pruned → loss table
      │     → knapsack (tj_prune_allocate)
      ▼  sequential prune, block by block: one pass of the dense block (targets), then group by
         group in the order the layers' forward hooks fire: statistics from the partially pruned
         block → the library's OBS selection and rebuild (tj_prune_calibrated_layers) → the norm
         after a residual add refitted to the dense output

Nothing here knows an architecture. Blocks are the entries of the model's first long
nn.ModuleList (or what `sequential_targets` names); the inputs of the first block are caught with a
forward pre-hook and replayed, so no block runs on anything but what the model itself passed it.
Groups (layers that read one tensor, as Q/K/V) come from hook order; residual connections and the
norms after them are found by perturbing a layer's output and watching what changes by exactly
that much. The C library does the maths (tilejit/prune.h)."""
import copy
import json
import math
import re
import resource
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
from torch import nn

from .pruner import Pruner, kept_of, latency_table

# Output heads are not pruned unless asked: they are small next to the blocks, and what the
# model's quality rests on.
DEFAULT_IGNORE = r"(^|\.)(lm_head|classifier|pooler|score|qa_outputs|cls)(\.|$)"
NORM_TYPES = (nn.LayerNorm, nn.GroupNorm) + ((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ())


class PruneError(ValueError):
    """Bad input to tilejit.torch.prune (the message names the layer or batch); the model is left
    as it was."""


class PruneInterrupted(KeyboardInterrupt):
    """An interrupt during tilejit.torch.prune; the model is left as it was."""


class _Stop(Exception):
    """Raised by a hook to end a forward pass early (what was needed has been recorded)."""


# ---- data ----------------------------------------------------------------------------------------

def call_model(model, batch):
    """model(**b) for a dict (or Mapping, e.g. BatchEncoding), model(*b) for a tuple or list,
    model(b) for anything else."""
    if hasattr(batch, "keys") and hasattr(batch, "__getitem__"):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


def _tensors_of(batch):
    if hasattr(batch, "keys") and hasattr(batch, "__getitem__"):
        return [batch[k] for k in batch.keys() if torch.is_tensor(batch[k])]
    if isinstance(batch, (tuple, list)):
        return [t for t in batch if torch.is_tensor(t)]
    return [batch] if torch.is_tensor(batch) else []


def _map_batch(batch, fn):
    """The batch with fn applied to each tensor (same container type)."""
    if hasattr(batch, "keys") and hasattr(batch, "__getitem__"):
        return {k: fn(v) if torch.is_tensor(v) else v for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(fn(v) if torch.is_tensor(v) else v for v in batch)
    return fn(batch) if torch.is_tensor(batch) else batch


def batch_size(batch):
    """Samples in a batch: the first dimension of its first tensor with one."""
    for t in _tensors_of(batch):
        if t.ndim >= 1:
            return int(t.shape[0])
    return 1


def token_mask(batch):
    """The batch's attention_mask as a [batch, tokens] bool tensor, or None."""
    if hasattr(batch, "keys") and hasattr(batch, "__getitem__") and "attention_mask" in batch.keys():
        m = batch["attention_mask"]
        if torch.is_tensor(m) and m.ndim == 2:
            return m != 0
    return None


def take_batches(data, num_samples, max_seq_len=None, device=None, what="data"):
    """The batches of `data` (an iterable of batches, e.g. a DataLoader) holding the first
    num_samples samples (the last batch cut to fit), with every tensor of 2+ dimensions whose
    second dimension is the sequence length cut to max_seq_len tokens, moved to `device`.
    Returns (batches, samples)."""
    if data is None:
        raise PruneError("%s: no data given (an iterable of batches: dicts, tuples or tensors)" % what)
    if isinstance(data, (dict, torch.Tensor)) or (hasattr(data, "keys") and hasattr(data, "__getitem__")):
        data = [data]  # one batch given as is
    try:
        it = iter(data)
    except TypeError:
        raise PruneError("%s: %s is not an iterable of batches" % (what, type(data).__name__)) from None
    out, n = [], 0
    for i, b in enumerate(it):
        if num_samples is not None and n >= num_samples:
            break
        if b is None or not _tensors_of(b):
            raise PruneError("%s: batch %d holds no tensor (%s)" % (what, i, type(b).__name__))
        bs = batch_size(b)
        if num_samples is not None and n + bs > num_samples:
            keep = num_samples - n
            b = _map_batch(b, lambda t: t[:keep] if t.ndim >= 1 and t.shape[0] == bs else t)
            bs = keep
        if max_seq_len:
            seq = next((t.shape[1] for t in _tensors_of(b) if t.ndim >= 2), None)
            if seq is not None and seq > max_seq_len:
                b = _map_batch(b, lambda t: t[:, :max_seq_len] if t.ndim >= 2 and t.shape[1] == seq else t)
        if device is not None:
            b = _map_batch(b, lambda t: t.to(device))
        out.append(b)
        n += bs
    if not out:
        raise PruneError("%s yielded no batch" % what)
    return out, n


def _rows(t, mask):
    """A layer's input or output [..., features] as float32 rows [tokens, features], padding left
    out when the token mask matches its leading dimensions."""
    t = t.detach()
    if mask is not None and t.shape[:-1] == mask.shape:
        t = t[mask]
    return t.reshape(-1, t.shape[-1]).float()


def token_errors(out, ref, mask):
    """Each real token's relative squared error ‖out − ref‖² / ‖ref‖² over the features, float32
    and differentiable in `out`: the measure of a block's output error, so that a few tokens with
    massive activations (a decoder's attention sinks, thousands of times the others' norm) do not
    stand for all of them, as they would in one global ratio. Padding is left out when the token
    mask matches the leading dimensions."""
    d, r = (out - ref).float(), ref.detach().float()
    if mask is not None and d.shape[:-1] == mask.shape:
        d, r = d[mask], r[mask]
    d, r = d.reshape(-1, d.shape[-1]), r.reshape(-1, r.shape[-1])
    rn = (r * r).sum(1)
    return (d * d).sum(1) / rn.clamp(min=1e-12 * float(rn.mean()) + 1e-30)


# ---- statistics (float64 sums of float32 products, as docs/pruning-calibrated.md) -------------

_CHUNK = 4096


def gram_add(h, x):
    """H += X̃ᵀX̃ for X̃ = [x, 1]; h float64 [k+1, k+1]."""
    k = x.shape[1]
    for s in range(0, x.shape[0], _CHUNK):
        xs = x[s:s + _CHUNK]
        h[:k, :k] += (xs.T @ xs).double().cpu()
        col = xs.sum(0, dtype=torch.float64).cpu()
        h[:k, k] += col
        h[k, :k] += col
        h[k, k] += xs.shape[0]


def cross_add(g, x, xref):
    """G += X̃ᵀX̃_ref (rows: the model being pruned, columns: the dense model; same tokens)."""
    k = x.shape[1]
    for s in range(0, x.shape[0], _CHUNK):
        xs, rs = x[s:s + _CHUNK], xref[s:s + _CHUNK]
        g[:k, :k] += (xs.T @ rs).double().cpu()
        g[:k, k] += xs.sum(0, dtype=torch.float64).cpu()
        g[k, :k] += rs.sum(0, dtype=torch.float64).cpu()
        g[k, k] += xs.shape[0]


def resid_add(d, x, dr):
    """D += X̃ᵀΔR (ΔR the residual stream's drift, dense minus pruned)."""
    k = x.shape[1]
    for s in range(0, x.shape[0], _CHUNK):
        xs, ds = x[s:s + _CHUNK], dr[s:s + _CHUNK]
        d[:k] += (xs.T @ ds).double().cpu()
        d[k] += ds.sum(0, dtype=torch.float64).cpu()


def _no_bias(m):
    """Statistics for a layer without a bias: the bias column decoupled from the features (zero
    but for [k][k]), so that the library's rebuild keeps the bias at exactly 0 and fits the
    weights to the uncentred problem (docs/pruning-torch.md)."""
    if m is None:
        return None
    m = m.clone()
    k = m.shape[0] - 1
    if m.shape[1] == m.shape[0]:
        m[:k, k] = 0
        m[k, :k] = 0
    else:  # residual [k+1, n]
        m[k] = 0
    return m


# ---- model structure -------------------------------------------------------------------------

def _tied_to_embedding(model):
    emb = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    emb |= {m.weight.data_ptr() for m in model.modules() if isinstance(m, nn.Embedding)}
    return {n for n, m in model.named_modules() if isinstance(m, nn.Linear)
            and (id(m.weight) in emb or m.weight.data_ptr() in emb)}


def select_layers(model, layers=None, ignore=DEFAULT_IGNORE):
    """{name: nn.Linear} to prune, in module order: every nn.Linear matching `layers` (a regular
    expression, re.search on module names; None: all) and not `ignore` (default: output heads),
    nor tied to an embedding."""
    linears = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    if not linears:
        raise PruneError("the model (%s) has no nn.Linear layer" % type(model).__name__)
    for what, rx in (("layers", layers), ("ignore", ignore)):
        if rx is not None:
            try:
                re.compile(rx)
            except re.error as e:
                raise PruneError("%s=%r is not a valid regular expression: %s" % (what, rx, e)) from None
    sel = {n: m for n, m in linears.items() if layers is None or re.search(layers, n)}
    if not sel:
        raise PruneError("layers=%r matches no nn.Linear (the model has %d, e.g. %s)"
                         % (layers, len(linears), ", ".join(list(linears)[:3])))
    if ignore is not None and ignore != DEFAULT_IGNORE and not any(re.search(ignore, n) for n in linears):
        raise PruneError("ignore=%r matches no nn.Linear" % (ignore,))
    tied = _tied_to_embedding(model)
    out = {n: m for n, m in sel.items() if n not in tied and not (ignore and re.search(ignore, n))}
    if not out:
        raise PruneError("every nn.Linear selected by layers=%r is ignored (ignore=%r, or tied to an embedding)"
                         % (layers, ignore))
    return out


def find_blocks(model, selected, sequential_targets=None):
    """[(name, module)]: the blocks pruned one after the other. sequential_targets: a regular
    expression on module names or class names, or a list of names; default: the entries of the
    first nn.ModuleList with at least two entries that holds a selected layer. [] when there is
    none (the whole model is then one block)."""
    if sequential_targets is not None:
        if isinstance(sequential_targets, str):
            rx = re.compile(sequential_targets)
            cand = [(n, m) for n, m in model.named_modules()
                    if n and (rx.fullmatch(n) or rx.fullmatch(type(m).__name__))]
        else:
            mods = dict(model.named_modules())
            missing = [n for n in sequential_targets if n not in mods]
            if missing:
                raise PruneError("sequential_targets: no module named '%s'" % missing[0])
            cand = [(n, mods[n]) for n in sequential_targets]
        # outermost only
        cand = [(n, m) for n, m in cand if not any(n.startswith(o + ".") for o, _ in cand)]
        if not cand:
            raise PruneError("sequential_targets=%r matches no module" % (sequential_targets,))
        return cand
    for name, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) >= 2:
            prefix = name + "." if name else ""
            if any(l.startswith(prefix) for l in selected):
                return [(prefix + str(i), b) for i, b in enumerate(mod)]
    return []


def _is_norm(m):
    if isinstance(m, NORM_TYPES):
        return True
    w = getattr(m, "weight", None)
    return ("norm" in type(m).__name__.lower() and isinstance(w, torch.Tensor) and w.ndim == 1
            and not isinstance(m, nn.Linear))


# ---- running blocks -------------------------------------------------------------------------

def _hidden_of(out):
    if torch.is_tensor(out):
        return out
    if isinstance(out, (tuple, list)) and out and torch.is_tensor(out[0]):
        return out[0]
    if hasattr(out, "keys") and hasattr(out, "__getitem__"):
        v = out[list(out.keys())[0]]
        if torch.is_tensor(v):
            return v
    raise PruneError("a block returned %s: expected a tensor or a tuple starting with one" % type(out).__name__)


class _Inputs:
    """One block's caught call for one batch: args, kwargs and where the hidden state is."""
    __slots__ = ("args", "kwargs", "slot", "mask")

    def __init__(self, args, kwargs, mask):
        self.args, self.kwargs, self.mask = tuple(args), dict(kwargs), mask
        if self.args and torch.is_tensor(self.args[0]):
            self.slot = 0
        elif torch.is_tensor(self.kwargs.get("hidden_states")):
            self.slot = "hidden_states"
        else:
            self.slot = next((k for k, v in self.kwargs.items() if torch.is_tensor(v)), None)
        if self.slot is None:
            raise PruneError("the first block was called without a tensor argument: cannot tell its input")

    def hidden(self):
        return self.args[self.slot] if isinstance(self.slot, int) else self.kwargs[self.slot]

    def call(self, block, hidden=None):
        args, kwargs = self.args, self.kwargs
        if hidden is not None:
            if isinstance(self.slot, int):
                args = args[:self.slot] + (hidden,) + args[self.slot + 1:]
            else:
                kwargs = dict(kwargs)
                kwargs[self.slot] = hidden
        return block(*args, **kwargs)


class _WholeModel:
    """The model itself as the one block (no nn.ModuleList): its inputs are the batches."""
    __slots__ = ("batch", "mask")

    def __init__(self, batch):
        self.batch, self.mask = batch, token_mask(batch)

    def hidden(self):
        return None

    def call(self, model, hidden=None):
        return call_model(model, self.batch)


def catch_inputs(model, block, batches):
    """[_Inputs] of `block` for each batch: the model runs until the block's forward pre-hook."""
    got = []

    def hook(mod, args, kwargs):
        got.append((args, kwargs))
        raise _Stop

    h = block.register_forward_pre_hook(hook, with_kwargs=True)
    out = []
    try:
        for i, b in enumerate(batches):
            got.clear()
            try:
                call_model(model, b)
            except _Stop:
                pass
            except PruneError:
                raise
            except Exception as e:
                raise PruneError("batch %d: the model rejected it: %s: %s" % (i, type(e).__name__, e)) from e
            if not got:
                raise PruneError("batch %d: the model never called its first block" % i)
            out.append(_Inputs(got[0][0], got[0][1], token_mask(b)))
    finally:
        h.remove()
    return out


class _Hooks:
    """Forward hooks for one run of a block: records inputs (`inputs`: names) and outputs
    (`outputs`) of named modules as rows, optionally adds `edit[name]` to a module's output, and
    stops the run (raising _Stop) at the pre-hook of `stop`."""

    def __init__(self, mods, inputs=(), outputs=(), stop=None, edit=None, order=None):
        self.rec = {}
        self.handles = []
        self.mask = None
        want_in, want_out = set(inputs), set(outputs)
        edit = edit or {}
        for name, m in mods.items():
            if name in want_in or name == stop or order is not None:
                self.handles.append(m.register_forward_pre_hook(self._pre(name, name in want_in, name == stop, order)))
            if name in want_out or name in edit or order is not None:
                self.handles.append(m.register_forward_hook(self._post(name, name in want_out, edit.get(name), order)))

    def _pre(self, name, record, stop, order):
        def hook(mod, args):
            if order is not None:
                x = args[0] if args else None
                order.append(("in", name, x))
            if record and ("in", name) not in self.rec:
                self.rec[("in", name)] = _rows(args[0], self.mask)
            if stop:
                raise _Stop
        return hook

    def _post(self, name, record, delta, order):
        def hook(mod, args, out):
            if delta is not None:
                out = out + delta
            if order is not None:
                order.append(("out", name, out))
            if record and ("out", name) not in self.rec:
                self.rec[("out", name)] = _rows(out, self.mask)
            return out if delta is not None else None
        return hook

    def run(self, inp, block, hidden=None):
        """Runs the block on one batch's inputs; returns its output (None when stopped)."""
        self.rec = {}
        self.mask = inp.mask
        try:
            return inp.call(block, hidden)
        except _Stop:
            return None

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def _check_finite(stat, what, batch):
    """Statistics accumulated so far (a gram): a NaN or Inf in any input row shows on its diagonal
    (Σ x², per feature), so one look per batch at O(k) values names the batch."""
    if not bool(torch.isfinite(stat.diagonal()).all()):
        raise PruneError("%s: NaN or Inf on batch %d" % (what, batch))


# ---- the norm refit -------------------------------------------------------------------------

def refit_norm(norm, z, target):
    """Refits a norm module's per-feature weight (and bias) so that norm(z) best matches `target`
    over the rows of z (least squares, per feature). The module's output is assumed affine in its
    weight and bias per feature (LayerNorm, RMSNorm, and forms like Gemma's 1 + weight); that is
    checked on the data and the refit is skipped (False returned) when it does not hold."""
    w = norm.weight
    b = getattr(norm, "bias", None)
    b = b if isinstance(b, torch.Tensor) else None
    if w is None or w.ndim != 1 or z.shape[-1] != w.shape[0]:
        return False
    w0, b0 = w.detach().clone(), b.detach().clone() if b is not None else None
    zin = z.to(w.dtype)
    with torch.no_grad():
        def out_at(wv, bv):
            w.copy_(wv)
            if b is not None:
                b.copy_(bv)
            return norm(zin).double()
        zeros = torch.zeros_like(w0)
        n0 = out_at(zeros, zeros)
        u = out_at(torch.ones_like(w0), zeros) - n0
        y0 = out_at(w0, b0 if b is not None else zeros)
        ok = torch.allclose(y0, n0 + u * w0.double() + (b0.double() if b is not None else 0), rtol=1e-4,
                            atol=1e-5 * float(y0.abs().max()) + 1e-6)
        if not ok:
            out_at(w0, b0 if b is not None else zeros)
            return False
        t = target.double() - n0
        if b is not None:
            um, tm = u.mean(0), t.mean(0)
            var = ((u - um) ** 2).mean(0)
            cov = ((u - um) * (t - tm)).mean(0)
            nw = torch.where(var > 1e-12, cov / var.clamp(min=1e-12), w0.double())
            nb = tm - nw * um
            w.copy_(nw.to(w.dtype))
            b.copy_(nb.to(b.dtype))
        else:
            den = (u * u).sum(0)
            nw = torch.where(den > 1e-12, (u * t).sum(0) / den.clamp(min=1e-12), w0.double())
            w.copy_(nw.to(w.dtype))
    return True


# ---- losses of the model's output (the profile) -------------------------------------------------

def _field(out, name):
    if hasattr(out, name):
        return getattr(out, name)
    if isinstance(out, dict):
        return out.get(name)
    return None


def default_loss(out, ref, batch):
    """Loss of the model's output against the dense model's on one batch (mean over its samples):
    KL(dense ‖ pruned) of the logits per token when the output has logits (causal LMs,
    classifiers); 1 − cosine of the mean-pooled last hidden state when it has one (encoders);
    else 1 − cosine of each sample's flattened output."""
    mask = token_mask(batch)
    lo, lr = _field(out, "logits"), _field(ref, "logits")
    if torch.is_tensor(lo) and torch.is_tensor(lr):
        lp, lq = torch.log_softmax(lo.float(), -1), torch.log_softmax(lr.float(), -1)
        kl = (lq.exp() * (lq - lp)).sum(-1)
        if mask is not None and kl.shape == mask.shape:
            return float(kl[mask].mean())
        return float(kl.mean())
    ho, hr = _field(out, "last_hidden_state"), _field(ref, "last_hidden_state")
    if torch.is_tensor(ho) and torch.is_tensor(hr):
        if mask is not None and ho.shape[:2] == mask.shape:
            mk = mask.unsqueeze(-1).to(ho.dtype)
            po, pr = (ho * mk).sum(1) / mk.sum(1).clamp(min=1), (hr * mk).sum(1) / mk.sum(1).clamp(min=1)
        else:
            po, pr = ho.mean(1), hr.mean(1)
        return float((1 - nn.functional.cosine_similarity(po.float(), pr.float(), dim=-1)).mean())
    o, r = _hidden_of(out), _hidden_of(ref)
    return float((1 - nn.functional.cosine_similarity(o.reshape(o.shape[0], -1).float(),
                                                      r.reshape(r.shape[0], -1).float(), dim=-1)).mean())


# ---- the report -----------------------------------------------------------------------------

class PruneReport:
    """What tilejit.torch.prune did. .layers: [{name, block, group, n, k, density, error, seconds}]
    (error: the layer's relative output error against the dense model's layer output on
    calibration tokens; seconds: its share of its group's statistics and rebuild); .density (kept
    fraction of the pruned layers' weights); .seconds {phase: s}; .peak_rss_gb; .pattern (the
    tilejit-pattern dict); .norms_refitted, .residual_layers, .notes."""

    def __init__(self):
        self.layers, self.notes = [], []
        self.seconds = {}
        self.density = 1.0
        self.peak_rss_gb = 0.0
        self.pattern = None
        self.norms_refitted, self.residual_layers = [], []
        self.recovery = []  # per block: reconstruct_block's results (recover="block")
        self.allocation = None
        self.profile = None  # the loss table (allocation "measured")
        self.samples = self.tokens = 0
        self.blocks = 0

    def to_dict(self):
        return {"layers": self.layers, "density": self.density, "seconds": self.seconds,
                "peak_rss_gb": self.peak_rss_gb, "allocation": self.allocation, "samples": self.samples,
                "tokens": self.tokens, "blocks": self.blocks, "norms_refitted": self.norms_refitted,
                "residual_layers": self.residual_layers, "recovery": self.recovery, "notes": self.notes}

    def __str__(self):
        lines = ["tilejit.prune: %d layers in %d blocks pruned to density %.4f (%s allocation) on %d samples "
                 "(%d tokens) in %.1f s, peak memory %.2f GB"
                 % (len(self.layers), self.blocks, self.density, self.allocation, self.samples, self.tokens,
                    self.seconds.get("total", 0.0), self.peak_rss_gb)]
        lines.append("  %-52s %12s %8s %10s %7s" % ("layer", "shape", "density", "rel.error", "s"))
        for l in self.layers:
            lines.append("  %-52s %12s %8.3f %10.2e %7.2f" % (l["name"], "%dx%d" % (l["n"], l["k"]), l["density"],
                                                           l["error"], l["seconds"]))
        lines.append("  seconds: " + ", ".join("%s %.1f" % kv for kv in self.seconds.items()))
        if self.norms_refitted:
            lines.append("  norms refitted: %d (%s, ...)" % (len(self.norms_refitted), self.norms_refitted[0]))
        if self.residual_layers:
            lines.append("  layers compensating residual drift: %d" % len(self.residual_layers))
        if self.recovery:
            lines.append("  block recovery: held-out block loss %.3e → %.3e (mean over %d blocks), %d steps, %.1f s"
                         % (sum(r["heldout_before"] for r in self.recovery) / len(self.recovery),
                            sum(r["heldout_after"] for r in self.recovery) / len(self.recovery), len(self.recovery),
                            sum(r["steps"] for r in self.recovery), sum(r["seconds"] for r in self.recovery)))
        lines += ["  note: " + n for n in self.notes]
        return "\n".join(lines)

    __repr__ = __str__


def peak_rss_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1048576.0


# ---- the engine -----------------------------------------------------------------------------

class _Block:
    """One block's structure, found by running it once on the first batch: its selected layers
    in the order their hooks fire, grouped by shared input; for each layer whose output is added
    to a residual (the sum's point: the next norm's input, or the block's output), that point."""

    def __init__(self, name, module, layers, inp, hidden):
        self.name, self.module = name, module
        self.layers = layers  # {full name: nn.Linear}
        self.mods = {n: m for n, m in layers.items()}
        self.norms = {}
        prefix = name + "." if name else ""
        for n, m in module.named_modules():
            if n and _is_norm(m):
                self.norms[prefix + n] = m
        order = []
        hk = _Hooks({**self.mods, **self.norms}, order=order)
        try:
            with torch.no_grad():
                out = hk.run(inp, module, hidden)
        finally:
            hk.remove()
        hid = _hidden_of(out)
        self.hidden_width = hid.shape[-1]
        # post-norm (BERT): the block's output is its last norm's output, so a norm at a sum point
        # carries the residual stream itself; pre-norm (LLaMA): norms only feed branches
        last = next(((n, t) for kind, n, t in reversed(order) if kind == "out"), None)
        self.post_norm = (last is not None and last[0] in self.norms and torch.is_tensor(last[1])
                          and last[1].data_ptr() == hid.data_ptr())
        # groups: consecutive first firings of selected layers on one input tensor
        self.groups, seen, last = [], set(), None
        events = []
        for kind, n, t in order:
            events.append((kind, n, t.shape[-1] if torch.is_tensor(t) else None))
            if kind != "in" or n not in self.mods or n in seen:
                continue
            seen.add(n)
            key = (t.data_ptr(), tuple(t.shape), tuple(t.stride())) if torch.is_tensor(t) else None
            if self.groups and key is not None and key == last:
                self.groups[-1].append(n)
            else:
                self.groups.append([n])
            last = key
        self._pos = {}
        for i, (kind, n, _) in enumerate(order):
            self._pos.setdefault(n, i)
        missing = [n for n in self.mods if n not in seen]
        self.unused = missing  # never called in this block's forward
        self.events = events
        # candidate sum points: the first norm after the layer's output, same width; else the output
        self.sum_point = {}
        for i, (kind, n, width) in enumerate(events):
            if kind != "out" or n not in self.mods or n in self.sum_point:
                continue
            if self.mods[n].out_features != self.hidden_width:
                continue
            s = next((m for kd, m, wd in events[i + 1:] if kd == "in" and m in self.norms and wd == width), None)
            self.sum_point[n] = s  # None: the block's output

    def position(self, name):
        """Where a module first fires in the block's forward."""
        return self._pos.get(name, -1)

    def verify_residuals(self, inp, hidden):
        """Keeps the sum points where the block's value there changes by exactly δ when δ is
        added to the layer's output (so it is layer output + something independent of it)."""
        ok = {}
        gen = torch.Generator().manual_seed(1234)
        for n, s in self.sum_point.items():
            base = self._at(inp, hidden, n, s, None)
            if base is None:
                continue
            y, z = base
            delta = torch.randn(y.shape, generator=gen).to(y.device, y.dtype) * (0.01 * float(y.float().std()) + 1e-3)
            pert = self._at(inp, hidden, n, s, delta)
            if pert is None:
                continue
            dz = pert[1].float() - z.float()
            err = float((dz - delta.float()).norm())
            if err <= 1e-3 * float(delta.float().norm()) + 1e-6 * float(z.float().norm()):
                ok[n] = s
        self.sum_point = ok

    def _at(self, inp, hidden, name, s, delta):
        """(layer output, value at the sum point) on one batch (full tensors, not rows)."""
        got = {}
        handles = []
        m = self.mods[name]

        def post(mod, args, out):
            if delta is not None:
                out = out + delta
            got["y"] = out.detach()
            return out
        handles.append(m.register_forward_hook(post))
        if s is not None:
            def pre(mod, args):
                got["z"] = args[0].detach()
                raise _Stop
            handles.append(self.norms[s].register_forward_pre_hook(pre))
        try:
            with torch.no_grad():
                try:
                    out = inp.call(self.module, hidden)
                    got["z"] = _hidden_of(out).detach()
                except _Stop:
                    pass
        finally:
            for h in handles:
                h.remove()
        if "y" not in got or "z" not in got or got["y"].shape != got["z"].shape:
            return None
        return got["y"], got["z"]


class _Engine:
    def __init__(self, model, batches, *, pruner, density, target, residual, norm_refit, sequential, log,
                 report, originals, recover=None):
        self.model = model
        self.batches = batches
        self.pruner = pruner
        self.density = density
        self.target = target
        # the residual drift and the norm refit compare two streams: sequential, dense target only
        self.residual = residual and target == "dense" and sequential
        self.norm_refit = norm_refit if target == "dense" and sequential else False  # None: auto
        self.sequential = sequential
        self.log = log
        self.report = report
        self.originals = originals  # {id(param): (param, original value)}, to undo on failure
        self.pattern_layers = []
        self.recover = recover  # None, or the keyword arguments of recover.reconstruct_block

    def _save(self, p):
        if p is not None and id(p) not in self.originals:
            self.originals[id(p)] = (p, p.detach().clone())

    # -- one block
    def prune_block(self, bi, blk, ins, P, D, dense_module):
        """Prunes block `blk` given the pruned stream's inputs P (per batch) and the dense stream's
        D; returns (P', D') for the next block."""
        mod = blk.module
        nb = len(ins)
        need_dense = self.sequential and self.target == "dense"
        Dget = (lambda b: None) if D is None else D.__getitem__  # noqa: E731
        Pget = (lambda b: None) if P is None else P.__getitem__  # noqa: E731
        # 1. the dense block once: each group's input, each residual layer's residual, each norm's
        #    output; and the dense stream's next inputs
        dmods = dict(dense_module.named_modules())
        prefix = blk.name + "." if blk.name else ""
        rel = lambda n: n[len(prefix):] if prefix else n  # noqa: E731
        dense_of = {n: dmods[rel(n)] for n in list(blk.mods) + list(blk.norms)}
        resid = {n: s for n, s in blk.sum_point.items()} if self.residual else {}
        on = blk.post_norm if self.norm_refit is None else self.norm_refit
        refit = {n: s for n, s in blk.sum_point.items() if s is not None} if on else {}
        xref = {g[0]: [] for g in blk.groups}
        rref = {n: [] for n in resid}
        yref = {s: [] for s in set(refit.values())}
        Dn = []
        Dout = []  # the dense block's outputs: the targets of the block's recovery
        if need_dense or not self.sequential:
            ins_names = [g[0] for g in blk.groups] + [s for s in resid.values() if s is not None]
            out_names = list(resid) + list(yref)
            hk = _Hooks(dense_of, inputs=ins_names, outputs=out_names)
            try:
                for b in range(nb):
                    with torch.no_grad():
                        out = hk.run(ins[b], dense_module, Dget(b))
                    for n in xref:
                        x = hk.rec[("in", n)]
                        if not bool(torch.isfinite(x.sum(0)).all()):
                            raise PruneError("layer '%s' (dense model): its input: NaN or Inf on batch %d" % (n, b))
                        xref[n].append(x)
                    for n, s in resid.items():
                        z = hk.rec[("in", s)] if s is not None else _rows(_hidden_of(out), ins[b].mask)
                        rref[n].append(z - hk.rec[("out", n)])
                    for s in yref:
                        yref[s].append(hk.rec[("out", s)])
                    if D is not None:
                        Dn.append(_hidden_of(out).detach())
                    elif self.recover is not None:
                        Dout.append(_hidden_of(out).detach())
            finally:
                hk.remove()
        # 2. group by group on the pruned stream
        for gi, group in enumerate(blk.groups):
            t0 = time.perf_counter()
            first = group[0]
            k = blk.mods[first].in_features
            h = torch.zeros(k + 1, k + 1, dtype=torch.float64)
            g = torch.zeros(k + 1, k + 1, dtype=torch.float64) if need_dense else None
            rmem = [n for n in group if n in resid]
            dres = {n: torch.zeros(k + 1, blk.mods[n].out_features, dtype=torch.float64) for n in rmem}
            sample_x, sample_xr, got_rows = [], [], 0
            # the sum points of this group's refitted norms, recorded by this pass before the
            # prune: after it, z' = z + x·(W' − W)ᵀ + (b' − b) there (the point is the layer's output
            # plus something independent of it, verified), so no second pass is needed
            zkeep = {n: [] for n in rmem if refit.get(n) is not None and refit[n] == resid[n]}
            xkeep = []
            if self.sequential:
                # stop where the last thing needed is recorded: the group's input, or the sum points
                # (none when one of them is the block's output)
                stop = first
                if rmem:
                    pts = [resid[n] for n in rmem]
                    stop = None if None in pts else max(pts, key=blk.position)
                hk = _Hooks(blk.mods | blk.norms, inputs=[first] + [resid[n] for n in rmem if resid[n]],
                            outputs=rmem, stop=stop)
                try:
                    for b in range(nb):
                        with torch.no_grad():
                            out = hk.run(ins[b], mod, Pget(b))
                        x = hk.rec[("in", first)]
                        gram_add(h, x)
                        _check_finite(h, "layer '%s': its input" % first, b)
                        if g is not None:
                            xr = xref[first][b]
                            if xr.shape != x.shape:
                                raise PruneError("layer '%s': batch %d gives %d tokens in the pruned model and %d "
                                                 "in the dense one" % (first, b, x.shape[0], xr.shape[0]))
                            cross_add(g, x, xr)
                            if got_rows < 8192:
                                sample_x.append(x[:8192 - got_rows])
                                sample_xr.append(xr[:8192 - got_rows])
                                got_rows += sample_x[-1].shape[0]
                        for n in rmem:
                            s = resid[n]
                            z = hk.rec[("in", s)] if s is not None else _rows(_hidden_of(out), ins[b].mask)
                            resid_add(dres[n], x, rref[n][b] - (z - hk.rec[("out", n)]))
                            if n in zkeep:
                                zkeep[n].append(z)
                        if zkeep:
                            xkeep.append(x)
                finally:
                    hk.remove()
            else:
                for b in range(nb):
                    x = xref[first][b]
                    gram_add(h, x)
                    if got_rows < 8192:
                        sample_x.append(x[:8192 - got_rows])
                        got_rows += sample_x[-1].shape[0]
                sample_xr = sample_x
            h = (h + h.T) * 0.5
            tokens = int(round(float(h[k, k])))
            if tokens == 0:
                raise PruneError("layer '%s': no calibration token reached it (all padding?)" % first)
            if not self.report.tokens:
                self.report.tokens = tokens
            specs = []
            for n in group:
                lin = blk.mods[n]
                hb, gb = h, g
                rb = dres.get(n)
                if lin.bias is None:
                    hb, gb, rb = _no_bias(h), _no_bias(g), _no_bias(rb)
                w = lin.weight.detach().float().cpu().numpy()
                bias = lin.bias.detach().float().cpu().numpy() if lin.bias is not None else None
                specs.append((n, w, bias, hb.numpy(), gb.numpy() if gb is not None else None, tokens,
                              self.density[n], rb.numpy() if rb is not None else None))
            try:
                got, rebuilt = self.pruner.prune(specs)
            except RuntimeError as e:
                raise PruneError("layer '%s': %s" % (first, e)) from e
            xs = torch.cat(sample_x) if sample_x else None
            xrs = torch.cat(sample_xr) if sample_xr else None
            dt = (time.perf_counter() - t0) / len(group)
            for n, pl, (w, b) in zip(group, got, rebuilt):
                lin = blk.mods[n]
                wt, bt = torch.from_numpy(w), torch.from_numpy(b)
                if n in zkeep:
                    with torch.no_grad():
                        dw = wt.to(xkeep[0].device) - lin.weight.detach().float()
                        db = (bt.to(dw.device) - lin.bias.detach().float()) if lin.bias is not None else 0
                        zkeep[n] = [z + x @ dw.T + db for z, x in zip(zkeep[n], xkeep)]
                err = float("nan")
                if xs is not None:
                    wt, bt = wt.to(xs.device), bt.to(xs.device)
                    ref = xrs @ lin.weight.detach().float().T
                    if lin.bias is not None:
                        ref = ref + lin.bias.detach().float()
                    new = xs @ wt.T + (bt if lin.bias is not None else 0)
                    err = float(((new - ref) ** 2).sum() / ((ref ** 2).sum()).clamp(min=1e-30))
                self._save(lin.weight)
                with torch.no_grad():
                    lin.weight.copy_(wt.to(lin.weight.dtype))
                    if lin.bias is not None:
                        self._save(lin.bias)
                        lin.bias.copy_(bt.to(lin.bias.dtype))
                if lin.bias is None and bool((bt != 0).any()):
                    raise PruneError("layer '%s': the rebuild gave a bias to a layer without one" % n)
                pl["name"] = n
                self.pattern_layers.append(pl)
                self.report.layers.append({"name": n, "block": blk.name, "group": gi, "n": pl["n"], "k": pl["k"],
                                           "density": kept_of(pl) / (pl["n"] * pl["k"]), "error": err,
                                           "seconds": round(dt, 3)})
                if n in rmem:
                    self.report.residual_layers.append(n)
            # the norm after each residual sum of this group, refitted to the dense model's output
            for n in group:
                s = refit.get(n)
                if s is None:
                    continue
                zs = zkeep.get(n)
                if zs is None:
                    hk = _Hooks(blk.mods | blk.norms, inputs=[s], stop=s)
                    zs = []
                    try:
                        for b in range(nb):
                            with torch.no_grad():
                                hk.run(ins[b], mod, Pget(b))
                            zs.append(hk.rec[("in", s)])
                    finally:
                        hk.remove()
                norm = blk.norms[s]
                self._save(norm.weight)
                self._save(getattr(norm, "bias", None) if isinstance(getattr(norm, "bias", None), torch.Tensor) else None)
                if refit_norm(norm, torch.cat(zs), torch.cat(yref[s])):
                    self.report.norms_refitted.append(s)
        # 3. block-local reconstruction: the block's kept weights, biases and norms trained to
        #    reproduce the dense block's outputs from the pruned stream's inputs
        if self.recover is not None and self.sequential and need_dense:
            from .recover import reconstruct_block
            mine = {pl["name"]: pl for pl in self.pattern_layers if pl["name"] in blk.mods}
            rel = {n[len(prefix):] if prefix else n: dict(mine[n], name=n[len(prefix):] if prefix else n)
                   for n in mine}
            Pr = P if P is not None else [None] * nb
            r = reconstruct_block(mod, list(rel), rel, ins, Pr, Dn if D is not None else Dout,
                                  log=self.log, what="block '%s'" % (blk.name or "the model"),
                                  originals=self.originals, **self.recover)
            r["block"] = blk.name
            self.report.recovery.append(r)
        # 4. the pruned stream's next inputs
        if P is None:
            return None, None
        if not self.sequential:
            return Dn, Dn
        with torch.no_grad():
            Pn = [_hidden_of(ins[b].call(mod, P[b])).detach() for b in range(nb)]
        return Pn, (Dn if need_dense else None)


def block_outputs(module, ins, D):
    """A block's outputs on the stream D (per batch), the next block's inputs; None stays None."""
    if D is None:
        return None
    with torch.no_grad():
        return [_hidden_of(ins[b].call(module, D[b])).detach() for b in range(len(ins))]


def dense_block_stats(blk, ins, D):
    """The dense statistics H = X̃ᵀX̃ (float64, symmetric) of every selected layer of a block on
    the calibration data (one pass; layers of a group share theirs), and the block's outputs
    (the next block's inputs; None for the whole model)."""
    firsts = [g[0] for g in blk.groups]
    stats = {f: torch.zeros(blk.mods[f].in_features + 1, blk.mods[f].in_features + 1, dtype=torch.float64)
             for f in firsts}
    hk = _Hooks(blk.mods, inputs=firsts, stop=None)
    Dn = []
    try:
        for b in range(len(ins)):
            with torch.no_grad():
                out = hk.run(ins[b], blk.module, D[b] if D is not None else None)
            for f in firsts:
                gram_add(stats[f], hk.rec[("in", f)])
                _check_finite(stats[f], "layer '%s' (dense model): its input" % f, b)
            if D is not None:
                Dn.append(_hidden_of(out).detach())
    finally:
        hk.remove()
    out = {}
    for grp in blk.groups:
        h = (stats[grp[0]] + stats[grp[0]].T) * 0.5
        for n in grp:
            out[n] = h
    return out, (Dn if D is not None else None)


def statistics(model, data, path=None, *, layers=None, ignore=DEFAULT_IGNORE, num_samples=512, max_seq_len=None,
               sequential_targets=None, progress=True):
    """The calibration statistics of the selected layers of the dense model (NAME.hessian,
    NAME.tokens: the statistics file `tilejit prune --calibration` reads, docs/pruning-calibrated.md),
    block by block on the data; written to `path` (safetensors) when given. Returns
    {name: (H as a float64 NumPy array, tokens)}."""
    log = _logger(progress)
    selected = select_layers(model, layers, ignore)
    state = _ModelState(model)
    out = {}
    try:
        state.enter()
        batches, _ = take_batches(data, num_samples, max_seq_len, next(model.parameters()).device, "data")
        blocks = find_blocks(model, selected, sequential_targets)
        with torch.no_grad():
            ins = catch_inputs(model, blocks[0][1], batches) if blocks else [_WholeModel(b) for b in batches]
        block_list = blocks or [("", model)]
        D = [i.hidden() for i in ins] if blocks else None
        for bname, bmod in block_list:
            prefix = bname + "." if bname else ""
            bl = {n: m for n, m in selected.items() if not prefix or n.startswith(prefix)}
            bl = {n: m for n, m in bl.items() if n not in out}
            if not bl:
                D = block_outputs(bmod, ins, D)
                continue
            blk = _Block(bname, bmod, bl, ins[0], D[0] if D is not None else None)
            stats, D = dense_block_stats(blk, ins, D)
            for n, h in stats.items():
                out[n] = (h.numpy(), int(round(float(h[-1, -1]))))
            log("statistics: %s (%d layers)" % (bname or "the model", len(stats)))
    finally:
        state.leave()
    missing = [n for n in selected if n not in out]
    if missing:
        raise PruneError("statistics: layer '%s' is outside the blocks (name its block in sequential_targets)"
                         % missing[0])
    if path:
        import numpy as np
        from . import safetensors
        tensors = {}
        for n, (h, tokens) in out.items():
            tensors[n + ".hessian"] = h
            tensors[n + ".tokens"] = np.array([tokens], dtype=np.int64)
        tmp = path + ".tmp"
        safetensors.save(tmp, tensors, {"format": "tilejit-calibration", "version": "1",
                                        "model": type(model).__name__})
        import os
        os.replace(tmp, path)
    return out


# ---- the profile (allocation "measured") -------------------------------------------------------

def profile(model, block_list, ins, selected, in_block, prof_batches, pruner, steps, measure, loss, log):
    """The loss table (format tilejit-prune-profile): each selected layer alone rebuilt at densities
    j/steps by the library's sweep (from its dense statistics on the calibration data). Its loss
    at the j in `measure` is its block's sensitivity times the relative error of the block's
    output on the profile batches with that layer alone at that density; at the other densities,
    its exact relative output error times the measured loss/error ratio, interpolated linearly in
    d. A block's sensitivity is the loss of the model's own output against the dense model's
    (`loss`, default default_loss) per unit of block output error, measured once per block with
    all its layers at the highest density in `measure` (the model runs from the block on, the
    blocks before replaying their cached dense outputs). So the model runs once per block, not
    once per layer and density: a deep model costs block-local passes. Without blocks (the whole
    model as one), the loss is measured per layer directly."""
    loss_fn = loss or default_loss
    whole = len(block_list) == 1 and block_list[0][0] == ""
    measure = sorted(set(range(steps) if measure in (None, "all") else [int(j) for j in measure]))
    if any(j < 0 or j >= steps for j in measure):
        raise PruneError("measure=%r: densities j of j/%d with 0 ≤ j < %d" % (measure, steps, steps))
    cur = [0]
    cache = [[None] * len(prof_batches) for _ in block_list]
    handles = []
    if not whole:
        for t, (_, bm) in enumerate(block_list):
            def rec(mod, args, out, t=t):
                cache[t][cur[0]] = out
            handles.append(bm.register_forward_hook(rec))
    refs = []
    try:
        with torch.no_grad():
            for i, b in enumerate(prof_batches):
                cur[0] = i
                try:
                    refs.append(call_model(model, b))
                except Exception as e:
                    raise PruneError("profile batch %d: the model rejected it: %s: %s" % (i, type(e).__name__, e)) from e
            pins = None if whole else catch_inputs(model, block_list[0][1], prof_batches)
    finally:
        for h in handles:
            h.remove()
    weights = [batch_size(b) for b in prof_batches]

    def model_loss(bi):
        """The loss of the model's output on the profile batches, blocks before bi skipped."""
        skipped = [] if whole else [bm for _, bm in block_list[:bi]]
        for t, bm in enumerate(skipped):
            bm.forward = (lambda *a, _t=t, **k: cache[_t][cur[0]])
        try:
            tot = 0.0
            with torch.no_grad():
                for i, b in enumerate(prof_batches):
                    cur[0] = i
                    tot += weights[i] * float(loss_fn(call_model(model, b), refs[i], b))
            return tot / sum(weights)
        finally:
            for bm in skipped:
                del bm.forward

    def block_error(bi, bmod, PH, ref):
        """The error of block bi's output on the profile batches (inputs PH): the mean over real
        tokens of each token's relative squared error (token_errors)."""
        if whole:
            return model_loss(bi)
        tot, count = 0.0, 0
        with torch.no_grad():
            for i, p in enumerate(pins):
                e = token_errors(_hidden_of(p.call(bmod, PH[i])), ref[i], p.mask)
                tot += float(e.sum())
                count += e.numel()
        return tot / max(count, 1)

    def set_weights(lin, w, b):
        """Writes weights w and bias b (NumPy arrays or tensors) into lin."""
        with torch.no_grad():
            lin.weight.copy_(torch.as_tensor(w).to(lin.weight.dtype))
            if lin.bias is not None:
                lin.bias.copy_(torch.as_tensor(b).to(lin.bias.dtype))

    dens = [j / steps for j in range(steps + 1)]
    table = {"format": "tilejit-prune-profile", "version": 1, "densities": dens, "layers": [],
             "samples": sum(weights), "measured": [dens[j] for j in measure]}
    pool = ThreadPoolExecutor(1)
    t0 = time.perf_counter()
    D = None if whole else [i.hidden() for i in ins]
    PH = None if whole else [p.hidden() for p in pins]
    done = 0
    try:
        for bi, (bname, bmod) in enumerate(block_list):
            bl = {n: selected[n] for n in selected if in_block.get(n) == bname}
            ref = None if whole else block_outputs(bmod, pins, PH)
            if not bl:
                D = block_outputs(bmod, ins, D)
                PH = ref
                continue
            blk = _Block(bname, bmod, bl, ins[0], D[0] if D is not None else None)
            stats, D = dense_block_stats(blk, ins, D)
            h_of = {n: (stats[n] if bl[n].bias is not None else _no_bias(stats[n])).numpy() for n in bl}
            order = [n for grp in blk.groups for n in grp]

            def sweep(n):
                lin = bl[n]
                w = lin.weight.detach().float().cpu().numpy()
                b = lin.bias.detach().float().cpu().numpy() if lin.bias is not None else None
                tokens = int(round(h_of[n][-1, -1]))
                return pruner.sweep(n, w, b, h_of[n], tokens, steps, measure)
            pending = pool.submit(sweep, order[0])
            saved = {n: (bl[n].weight.detach().clone(), bl[n].bias.detach().clone() if bl[n].bias is not None
                         else None) for n in order}
            errs, sweeps, measured = {}, {}, {}
            try:
                for li, n in enumerate(order):
                    try:
                        errs[n], sweeps[n] = pending.result()
                    except RuntimeError as e:
                        raise PruneError("layer '%s': %s" % (n, e)) from e
                    pending = pool.submit(sweep, order[li + 1]) if li + 1 < len(order) else None
                    measured[n] = {}
                    for j in measure:
                        set_weights(bl[n], *sweeps[n][j])
                        measured[n][j] = max(0.0, block_error(bi, bmod, PH, ref))
                    set_weights(bl[n], *saved[n])
                # the block's sensitivity: the model's loss per unit of block output error
                if whole:
                    alpha = 1.0
                else:
                    top = measure[-1]
                    for n in order:
                        set_weights(bl[n], *sweeps[n][top])
                    e_all = block_error(bi, bmod, PH, ref)
                    l_all = model_loss(bi)
                    alpha = max(0.0, l_all) / e_all if e_all > 0 else 0.0
            finally:
                for n in order:
                    set_weights(bl[n], *saved[n])
            for n in order:
                lin, err = bl[n], errs[n]
                m = {j: alpha * v for j, v in measured[n].items()}
                if not all(math.isfinite(v) for v in m.values()):
                    raise PruneError("layer '%s': the loss of the model's output is not finite at density %s"
                                     % (n, [dens[j] for j, v in m.items() if not math.isfinite(v)]))
                mj = sorted(m)
                ratio = [m[j] / err[j] if err[j] > 0 else 0.0 for j in mj]
                lossv = [m[j] if j in m else float(err[j] * np.interp(j, mj, ratio)) for j in range(steps)]
                for j in range(steps - 2, -1, -1):  # monotone: more density never costs more loss
                    lossv[j] = max(lossv[j], lossv[j + 1])
                lossv.append(0.0)
                table["layers"].append({"name": n, "n": lin.out_features, "k": lin.in_features, "loss": lossv,
                                        "output_error": [float(v) for v in err] + [0.0]})
                done += 1
                log("profile: %3d/%d %-50s loss at d = 1/4, 1/2, 3/4: %.2e %.2e %.2e (%.0f s)"
                    % (done, len(selected), n, lossv[steps // 4], lossv[steps // 2], lossv[3 * steps // 4],
                       time.perf_counter() - t0))
            PH = ref
    finally:
        pool.shutdown(wait=True)
    names = {e["name"] for e in table["layers"]}
    missing = [n for n in selected if n not in names]
    if missing:
        raise PruneError("profile: layer '%s' is outside the blocks; use allocation='uniform' or name its block "
                         "in sequential_targets" % missing[0])
    return table


# ---- helpers of prune() ---------------------------------------------------------------------

def default_measure(sparsity, steps):
    """The densities j/steps at which the profile runs the model by default: the target density
    and half of it (where the knapsack's choices around the target are made; the other densities
    are interpolated), or j = steps/4 and steps/2 for a latency budget."""
    if sparsity is None:
        return sorted({max(1, steps // 4), max(1, steps // 2)})
    j = min(steps - 1, max(1, int(round((1 - float(sparsity)) * steps))))
    return sorted({max(1, j // 2), j})

def _logger(progress):
    if callable(progress):
        return progress
    if progress:
        return lambda msg: print(msg, file=sys.stderr, flush=True)
    return lambda msg: None


class _ModelState:
    """Eval mode and no KV cache while calibrating (a cache object passed to the blocks would grow
    with every replay); restored afterwards."""

    def __init__(self, model):
        self.model = model
        self.cfg = getattr(model, "config", None)

    def enter(self):
        self.training = self.model.training
        self.model.eval()
        self.use_cache = getattr(self.cfg, "use_cache", None)
        if self.use_cache is not None:
            self.cfg.use_cache = False

    def leave(self):
        self.model.train(self.training)
        if self.use_cache is not None:
            self.cfg.use_cache = self.use_cache


def _restore(originals):
    with torch.no_grad():
        for p, v in originals.values():
            p.copy_(v)
    originals.clear()


def _split_samples(batches, n):
    """(the batches holding the first n samples, the rest), a batch cut in two where needed."""
    first, rest, seen = [], [], 0
    for b in batches:
        bs = batch_size(b)
        if seen >= n:
            rest.append(b)
        elif seen + bs <= n:
            first.append(b)
        else:
            cut = n - seen
            first.append(_map_batch(b, lambda t: t[:cut] if t.ndim >= 1 and t.shape[0] == bs else t))
            rest.append(_map_batch(b, lambda t: t[cut:] if t.ndim >= 1 and t.shape[0] == bs else t))
        seen += bs
    return first, rest


def _global_densities(selected, sparsity, mode, g, ew):
    """Per-layer densities from the plain pruner's one global magnitude threshold."""
    from . import Context
    with Context(backend="reference") as c:
        pat = c.prune({n: m.weight.detach().float().cpu() for n, m in selected.items()}, sparsity, mode=mode, g=g,
                      ew_fraction=0.01 if ew is None else float(ew))
    return {l["name"]: kept_of(l) / (l["n"] * l["k"]) for l in pat["layers"]}


def prune(model, data, *, sparsity=None, budget_ms=None, mode="tw1", g=128, layers=None, ignore=DEFAULT_IGNORE,
          num_samples=512, max_seq_len=None, allocation="measured", sequential=True, target="dense", residual=True,
          norm_refit=None, loss=None, sequential_targets=None, profile_data=None, profile_samples=64, steps=16,
          measure=None, latency_m=128, threads=None, damp=None, ew=None, tilejit=None, progress=True,
          recover=None, recover_steps=200, recover_lr=1e-4):
    """The engine of tilejit.torch.prune (documented there)."""
    t_all = time.perf_counter()
    log = _logger(progress)
    if (sparsity is None) == (budget_ms is None):
        raise PruneError("give exactly one of sparsity= and budget_ms=")
    if sparsity is not None and not (0 <= float(sparsity) < 1):
        raise PruneError("sparsity=%r: must be in [0, 1)" % (sparsity,))
    if budget_ms is not None and (allocation != "measured" or not budget_ms > 0):
        raise PruneError("budget_ms= must be > 0 and needs allocation='measured'")
    if allocation not in ("measured", "uniform", "global"):
        raise PruneError("allocation=%r: expected 'measured', 'uniform' or 'global'" % (allocation,))
    if target not in ("dense", "own"):
        raise PruneError("target=%r: expected 'dense' or 'own'" % (target,))
    if not isinstance(g, int) or isinstance(g, bool) or g < 1:
        raise PruneError("g=%r: the tile width must be a positive integer" % (g,))
    if recover not in (None, "none", "block"):
        raise PruneError("recover=%r: expected None or 'block'" % (recover,))
    if recover == "block" and not (sequential and target == "dense"):
        raise PruneError("recover='block' needs sequential=True and target='dense' (the dense block's outputs)")
    if num_samples is not None and num_samples < 1:
        raise PruneError("num_samples=%r: must be ≥ 1" % (num_samples,))
    if not isinstance(model, nn.Module):
        raise PruneError("model: expected a torch.nn.Module, got %s" % type(model).__name__)
    selected = select_layers(model, layers, ignore)
    for n, m in selected.items():
        if m.weight.ndim != 2 or max(m.weight.shape) > (1 << 24) or min(m.weight.shape) < 1:
            raise PruneError("layer '%s': shape %s cannot be cut into tiles of g = %d (n and k must be in [1, 2^24])"
                             % (n, tuple(m.weight.shape), g))
        if not m.weight.dtype.is_floating_point:
            raise PruneError("layer '%s': weights of dtype %s (floating point expected)" % (n, m.weight.dtype))
        if m.weight.is_meta:
            raise PruneError("layer '%s': its weights are on the meta device (not loaded)" % n)
    device = next(model.parameters()).device
    threads = threads or torch.get_num_threads()
    pruner = Pruner(g, mode, ew, damp, threads)
    report = PruneReport()
    report.allocation = allocation
    originals = {}
    state = _ModelState(model)
    where = ["reading the data"]
    try:
        state.enter()
        t = time.perf_counter()
        want = num_samples + (profile_samples if allocation == "measured" and profile_data is None else 0)
        batches, nsamp = take_batches(data, want, max_seq_len, device, "data")
        batches, prof_batches = _split_samples(batches, num_samples)
        report.samples = min(nsamp, num_samples)
        if allocation == "measured":
            if profile_data is not None:
                prof_batches, _ = take_batches(profile_data, profile_samples, max_seq_len, device, "profile_data")
            elif not prof_batches:
                _, prof_batches = _split_samples(batches, max(0, report.samples - profile_samples))
                report.notes.append("the profile used the last %d calibration samples (the data held no more)"
                                    % sum(batch_size(b) for b in prof_batches))
        blocks = find_blocks(model, selected, sequential_targets)
        where[0] = "catching the first block's inputs"
        with torch.no_grad():
            ins = catch_inputs(model, blocks[0][1], batches) if blocks else [_WholeModel(b) for b in batches]
        report.seconds["inputs"] = round(time.perf_counter() - t, 1)
        block_list = blocks if blocks else [("", model)]
        report.blocks = len(block_list)
        in_block = {}
        for bname, _ in block_list:
            for n in selected:
                if n not in in_block and (not bname or n.startswith(bname + ".")):
                    in_block[n] = bname
        outside = [n for n in selected if n not in in_block]
        log("tilejit.prune: %d layers in %d blocks%s; %d calibration samples in %d batches"
            % (len(selected), len(block_list), " and %d outside them" % len(outside) if outside else "",
               report.samples, len(batches)))
        t = time.perf_counter()
        where[0] = "the allocation"
        if allocation == "uniform":
            density = {n: 1.0 - float(sparsity) for n in selected}
        elif allocation == "global":
            density = _global_densities(selected, sparsity, mode, g, ew)
        else:
            table = profile(model, block_list, ins, selected, in_block, prof_batches, pruner, steps,
                            default_measure(sparsity, steps) if measure is None else measure, loss, log)
            if budget_ms is not None:
                times = latency_table({n: tuple(m.weight.shape) for n, m in selected.items()}, steps, latency_m, g,
                                      threads, tilejit, log)
                for e in table["layers"]:
                    e["time_ms"] = times[e["name"]]
            try:
                density = pruner.allocate(table, sparsity, budget_ms)
            except RuntimeError as e:
                raise PruneError(str(e)) from e
            report.profile = table
        report.seconds["profile"] = round(time.perf_counter() - t, 1)
        t = time.perf_counter()
        eng = _Engine(model, batches, pruner=pruner, density=density, target=target, residual=residual,
                      norm_refit=norm_refit, sequential=sequential, log=log, report=report, originals=originals,
                      recover={"steps": int(recover_steps), "lr": float(recover_lr)} if recover == "block" else None)
        need_dense = not sequential or target == "dense"
        P = [i.hidden() for i in ins] if blocks else None
        D = list(P) if blocks and need_dense else None
        pruned_any = False
        for bi, (bname, bmod) in enumerate(block_list):
            where[0] = "block '%s'" % bname if bname else "the model"
            bl = {n: selected[n] for n in selected if in_block.get(n) == bname}
            if not bl:  # nothing to prune here: both streams pass through
                if P is not None:
                    with torch.no_grad():
                        Pn = [_hidden_of(ins[b].call(bmod, P[b])).detach() for b in range(len(ins))]
                        if D is not None:
                            D = Pn if not pruned_any else \
                                [_hidden_of(ins[b].call(bmod, D[b])).detach() for b in range(len(ins))]
                    P = Pn
                continue
            blk = _Block(bname, bmod, bl, ins[0], P[0] if P is not None else None)
            if blk.unused:
                raise PruneError("layer '%s' is never called in %s on batch 0" % (blk.unused[0], where[0]))
            blk.verify_residuals(ins[0], P[0] if P is not None else None)
            dense_module = copy.deepcopy(bmod) if sequential and target == "dense" else bmod
            P, D = eng.prune_block(bi, blk, ins, P, D, dense_module)
            del dense_module
            pruned_any = True
            log("tilejit.prune: %s pruned, %d/%d blocks (%.0f s)" % (where[0], bi + 1, len(block_list),
                                                                   time.perf_counter() - t_all))
        if outside:
            # layers outside the blocks: the whole, partly pruned model as one more block, on its
            # own outputs (no dense copy of the whole model is kept)
            where[0] = "the layers outside the blocks"
            eng.target, eng.sequential, eng.residual, eng.norm_refit = "own", True, False, False
            whole = [_WholeModel(b) for b in batches]
            blk = _Block("", model, {n: selected[n] for n in outside}, whole[0], None)
            blk.sum_point = {}
            eng.prune_block(len(block_list), blk, whole, None, None, model)
            report.notes.append("%d layers outside the blocks were pruned on their own outputs" % len(outside))
        report.seconds["prune"] = round(time.perf_counter() - t, 1)
        order = list(selected)
        pattern = {"format": "tilejit-pattern", "version": 1,
                   "layers": sorted(eng.pattern_layers, key=lambda l: order.index(l["name"]))}
        report.density = sum(kept_of(l) for l in pattern["layers"]) / sum(l["n"] * l["k"] for l in pattern["layers"])
        report.pattern = pattern
        model._tilejit_pattern = pattern
    except KeyboardInterrupt:
        _restore(originals)
        raise PruneInterrupted("tilejit.prune: interrupted in %s; the model is unchanged" % where[0]) from None
    except BaseException:
        _restore(originals)
        raise
    finally:
        state.leave()
    report.seconds["total"] = round(time.perf_counter() - t_all, 1)
    report.peak_rss_gb = round(peak_rss_gb(), 2)
    log("tilejit.prune: density %.4f in %.1f s (%s), peak memory %.2f GB"
        % (report.density, report.seconds["total"], ", ".join("%s %.1f" % kv for kv in report.seconds.items()),
           report.peak_rss_gb))
    return report
