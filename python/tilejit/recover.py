"""Recovery after tile-wise pruning, with the pattern held by construction (docs/pruning-torch.md):

- TileLinear: a pruned linear layer whose parameters are only its kept weights, per tile (its rows ×
  its kept input features), computed tile by tile from gathered inputs. A pruned weight is not a
  parameter, so no optimiser can make it grow back and no mask is ever re-applied. TWLinear
  trains through it; recovery swaps it in for the pruned nn.Linear of a block while it trains.
- reconstruct_block: Adam on one block's kept weights, biases and norm parameters so that the
  block, fed the pruned model's inputs, reproduces the dense block's outputs on the calibration
  data (block-local reconstruction), with early stopping on held-out calibration batches. It
  runs inside tilejit.torch.prune (recover="block") after each block, or alone: recover().
- finetune: end-to-end distillation of the pruned model against the dense teacher."""
import copy
import math
import time

import torch
from torch import nn

from .sequential import (PruneError, PruneInterrupted, _hidden_of, _Inputs, _logger, _ModelState, _restore,
                         call_model, catch_inputs, find_blocks, take_batches, token_errors, token_mask)

_ACT = {"none": None, "relu": torch.relu, "gelu": lambda y: nn.functional.gelu(y, approximate="none")}


def _gather(x2, idx):
    """Each tile's kept input features of x2 [M × k]: [tiles × M × kept]."""
    return x2.index_select(1, idx.reshape(-1)).view(x2.shape[0], idx.shape[0], -1).transpose(0, 1)


class _GatherMM(torch.autograd.Function):
    """y[t] = x2[:, idx[t]] · w[t]ᵀ for every tile t ([tiles × M × g]). The backward gathers x2's
    kept features again instead of holding them from the forward: autograd would keep the
    gathered copy, (n / g) · kept floats per token, several times x itself (SmolLM2 at 50 %:
    about 3.6 GB for a batch of 8 × 256 tokens), where x2 is usually held anyway."""

    @staticmethod
    def forward(ctx, x2, w, idx):
        ctx.save_for_backward(x2, w, idx)
        return torch.bmm(_gather(x2, idx), w.transpose(1, 2))

    @staticmethod
    def backward(ctx, gy):
        x2, w, idx = ctx.saved_tensors
        gx = gw = None
        if ctx.needs_input_grad[1]:
            gw = torch.bmm(gy.transpose(1, 2), _gather(x2, idx))
        if ctx.needs_input_grad[0]:
            gxg = torch.bmm(gy, w).transpose(0, 1).reshape(x2.shape[0], -1)  # [M × tiles · kept]
            gx = torch.zeros_like(x2).index_add_(1, idx.reshape(-1), gxg)
        return gx, gw, None


class TileLinear(nn.Module):
    """y = act(x · (W ⊙ mask)ᵀ + b) for a tile-wise pattern layer (a dict of the tilejit-pattern
    JSON), whose parameters are only the kept weights: when every tile keeps the same number of
    input features (the calibrated pruner's tw1 and tw2), one tensor `w` [tiles × g × kept] (the
    rows past the layer's last output feature are never used) and the kept indices [tiles × kept];
    otherwise one parameter per tile in `tiles`. For tew, `ew` holds the residual's weights. The
    forward gathers each tile's kept input features and multiplies them with the tile's weights;
    autograd gives the gradients of x and of the kept weights from the same gathered products."""

    def __init__(self, layer, weight, bias=None, train_bias=True):
        super().__init__()
        n, k, g = int(layer["n"]), int(layer["k"]), int(layer["g"])
        if tuple(weight.shape) != (n, k):
            raise ValueError("tilejit: layer '%s' has weights %s, its pattern [%d, %d]"
                             % (layer.get("name"), tuple(weight.shape), n, k))
        self.name, self.n, self.k, self.g = layer.get("name", ""), n, k, g
        self.in_features, self.out_features = k, n
        dev = weight.device
        cols = torch.tensor(layer["cols"], dtype=torch.long, device=dev) if "cols" in layer else None
        self.ncols = len(cols) if cols is not None else n
        self.register_buffer("cols", cols, persistent=False)
        w = weight.detach()
        tiles = layer["tiles"]
        self.ntiles = len(tiles)
        rows = [self._rows(t, cols, dev) for t in range(self.ntiles)]
        counts = {len(r) for r in tiles}
        self.uniform = len(counts) == 1 and self.ntiles > 0 and counts != {0}
        self.tiles = nn.ParameterList()
        self._kept = []
        if self.uniform:
            kt = len(tiles[0])
            idx = torch.tensor(tiles, dtype=torch.long, device=dev)  # [tiles × kept]
            self.register_buffer("idx", idx, persistent=False)
            packed = w.new_zeros(self.ntiles, g, kt)
            for t, r in enumerate(rows):
                packed[t, :len(r)] = w[r][:, idx[t]]
            self.w = nn.Parameter(packed)
        else:
            self.w = None
            for t, rows_in in enumerate(tiles):
                kk = torch.tensor(rows_in, dtype=torch.long, device=dev)
                self.register_buffer("kept%d" % t, kk, persistent=False)
                self._kept.append("kept%d" % t)
                self.tiles.append(nn.Parameter(w[rows[t]][:, kk].clone()))
        ew = layer.get("ew")
        self.ew = None
        if ew and ew.get("indices"):
            indptr = ew["indptr"]
            r = torch.tensor([row for row in range(n) for _ in range(indptr[row], indptr[row + 1])], dtype=torch.long,
                             device=dev)
            c = torch.tensor(ew["indices"], dtype=torch.long, device=dev)
            self.register_buffer("ew_rows", r, persistent=False)
            self.register_buffer("ew_cols", c, persistent=False)
            self.ew = nn.Parameter(w[r, c].clone())
        self.bias = nn.Parameter(bias.detach().clone(), requires_grad=train_bias) if bias is not None else None
        self.activation = layer.get("activation", "none")

    def _rows(self, t, cols, dev):
        """The output features (rows of W) of tile t."""
        out = torch.arange(t * self.g, min((t + 1) * self.g, self.ncols), device=dev)
        return cols[out] if cols is not None else out

    def forward(self, x):
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.k)
        m = x2.shape[0]
        if self.uniform:
            y = _GatherMM.apply(x2, self.w, self.idx).transpose(0, 1).reshape(m, -1)[:, :self.ncols]
        else:
            outs = []
            for name, wt in zip(self._kept, self.tiles):
                kk = getattr(self, name)
                outs.append(_GatherMM.apply(x2, wt.unsqueeze(0), kk.unsqueeze(0))[0] if kk.numel()
                            else x2.new_zeros(m, wt.shape[0]))
            y = torch.cat(outs, 1) if outs else x2.new_zeros(m, 0)
        if self.cols is not None:
            y = x2.new_zeros(m, self.n).index_copy(1, self.cols, y)
        if self.ew is not None:
            y = y.index_add(1, self.ew_rows, x2.index_select(1, self.ew_cols) * self.ew)
        if self.bias is not None:
            y = y + self.bias
        act = _ACT[self.activation]
        if act is not None:
            y = act(y)
        return y.reshape(*lead, self.n)

    def dense_weight(self):
        """W ⊙ mask as a dense [n × k] tensor (zeros outside the pattern, exactly)."""
        with torch.no_grad():
            ref = self.w if self.uniform else (self.tiles[0] if len(self.tiles) else self.bias)
            w = torch.zeros(self.n, self.k, dtype=ref.dtype if ref is not None else torch.float32,
                            device=ref.device if ref is not None else None)
            for t in range(self.ntiles):
                rows = self._rows(t, self.cols, w.device)
                if self.uniform:
                    w[rows[:, None], self.idx[t][None, :]] = self.w[t, :len(rows)]
                else:
                    kk = getattr(self, self._kept[t])
                    if kk.numel():
                        w[rows[:, None], kk[None, :]] = self.tiles[t]
            if self.ew is not None:
                w[self.ew_rows, self.ew_cols] = self.ew
        return w


def _swap_in(model, names, pattern_by_name, train_bias=True):
    """Replaces the named nn.Linear modules by TileLinear ones; returns {name: (parent, attr, old)}."""
    swapped = {}
    for n in names:
        parent_name, _, attr = n.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        old = getattr(parent, attr)
        tl = TileLinear(pattern_by_name[n], old.weight.detach().float(),
                        old.bias.detach().float() if old.bias is not None else None, train_bias)
        tl.to(old.weight.device)
        setattr(parent, attr, tl)
        swapped[n] = (parent, attr, old)
    return swapped


def _swap_out(swapped, keep=True):
    """Puts the nn.Linear modules back, with the TileLinear's weights written in (when keep)."""
    for n, (parent, attr, old) in swapped.items():
        tl = getattr(parent, attr)
        if keep:
            with torch.no_grad():
                old.weight.copy_(tl.dense_weight().to(old.weight.dtype))
                if old.bias is not None:
                    old.bias.copy_(tl.bias.detach().to(old.bias.dtype))
        setattr(parent, attr, old)


def _norm_params(block):
    from .sequential import _is_norm
    out = []
    for m in block.modules():
        if _is_norm(m):
            out += [p for p in (getattr(m, "weight", None), getattr(m, "bias", None)) if isinstance(p, nn.Parameter)]
    return out


def _fit(params, lr, steps, train, loss_at, held_loss, before, eval_every, patience, what, on_eval=None):
    """Adam on params over the batches `train` in turn (loss_at(b) → scalar tensor), with early
    stopping: every `eval_every` steps (and at the last) held_loss() is measured, the best state
    kept, and training stops after `patience` evaluations without improvement; the params end in
    their best state. `before` is the held-out loss at the start. Returns (steps run, best
    held-out loss, last training loss)."""
    opt = torch.optim.Adam(params, lr=lr, foreach=True)
    best, best_state, bad, step, last = before, [p.detach().clone() for p in params], 0, 0, float("nan")
    with torch.enable_grad():
        for step in range(1, steps + 1):
            b = train[(step - 1) % len(train)]
            loss = loss_at(b)
            if not torch.isfinite(loss):
                raise PruneError("%s: the loss is not finite at step %d (batch %d); lower the learning rate (%g)"
                                 % (what, step, b, lr))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            last = float(loss.detach())
            if step % eval_every == 0 or step == steps:
                h = held_loss()
                if on_eval is not None:
                    on_eval(step, last, h)
                if h < best:
                    best, best_state, bad = h, [p.detach().clone() for p in params], 0
                else:
                    bad += 1
                    if bad >= patience:
                        break
    with torch.no_grad():
        for p, v in zip(params, best_state):
            p.copy_(v)
    return step, best, last


def reconstruct_block(block, names, pattern_by_name, ins, P, targets, *, steps=200, lr=1e-4, holdout=0.1,
                      eval_every=25, patience=4, log=None, what="block", originals=None):
    """Block-local reconstruction: Adam on the block's kept weights (the pruned layers `names`,
    swapped for TileLinear while it trains), their biases and the block's norm parameters, so
    that the block run on the pruned model's inputs P[b] reproduces targets[b] (the dense block's
    outputs); the loss is the mean over real tokens of each token's relative squared error
    (tilejit.sequential.token_errors). The last `holdout` of the batches (at least one, when
    there are two or more) is held out: every `eval_every` steps its loss is measured, the best
    state kept, and training stops after `patience` evaluations without improvement. Returns
    {"steps", "train_loss", "heldout_before", "heldout_after", "seconds"}; the block keeps its best
    state (never worse than before on the held-out batches)."""
    t0 = time.perf_counter()
    log = log or (lambda m: None)
    nb = len(ins)
    nh = 0 if nb < 2 else max(1, int(round(nb * holdout)))
    train, held = list(range(nb - nh)), list(range(nb - nh, nb)) or list(range(nb))
    swapped = _swap_in(block, names, pattern_by_name) if names else {}
    norm = _norm_params(block)
    if originals is not None:
        for p in norm:
            if id(p) not in originals:
                originals[id(p)] = (p, p.detach().clone())
    params = [p for _, (par, attr, _) in swapped.items() for p in getattr(par, attr).parameters() if p.requires_grad]
    params += norm
    ok = False
    try:
        req = [(p, p.requires_grad) for p in block.parameters()]
        for p in block.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        def loss_at(b):
            return token_errors(_hidden_of(ins[b].call(block, P[b])), targets[b], ins[b].mask).mean()

        def held_loss():
            with torch.no_grad():
                return sum(float(loss_at(b)) for b in held) / len(held)
        before = held_loss()
        step, best, last = _fit(params, lr, steps, train, loss_at, held_loss, before, eval_every, patience,
                                "recovery of %s" % what)
        for p, r in req:
            p.requires_grad_(r)
        ok = True
    finally:
        _swap_out(swapped, keep=ok)
    res = {"steps": step, "train_loss": last, "heldout_before": before, "heldout_after": best,
           "seconds": round(time.perf_counter() - t0, 2)}
    log("recover: %s: held-out loss %.3e → %.3e in %d steps (%.1f s)" % (what, before, best, step, res["seconds"]))
    return res


def recover(model, dense_model, data, *, num_samples=512, max_seq_len=None, steps=200, lr=1e-4, holdout=0.1,
            sequential_targets=None, pattern=None, progress=True):
    """Block-local reconstruction of a pruned model (its pruned layers dense nn.Linear with zeros
    outside the pattern, as tilejit.torch.prune leaves them) against the dense model it came from,
    on calibration data (batches as tilejit.torch.prune takes them): block by block, the pruned
    model's inputs to the block come through the already recovered blocks and the target is the
    dense model's block output. pattern: the tilejit-pattern (default: the one prune() left on
    the model). Errors and interrupts leave the model as it was. Returns [per-block results]."""
    from .torch import pattern_of
    log = _logger(progress)
    pattern = pattern if pattern is not None else pattern_of(model)
    if pattern is None:
        raise PruneError("recover: the model has no tile-wise pattern (prune it first, or pass pattern=)")
    if not isinstance(dense_model, nn.Module):
        raise PruneError("recover: the dense model must be a torch.nn.Module")
    by_name = {l["name"]: l for l in pattern["layers"]}
    mods = dict(model.named_modules())
    missing = [n for n in by_name if not isinstance(mods.get(n), nn.Linear)]
    if missing:
        raise PruneError("recover: pattern layer '%s' is not an nn.Linear of the model" % missing[0])
    blocks = find_blocks(model, by_name, sequential_targets)
    dblocks = find_blocks(dense_model, by_name, sequential_targets)
    if not blocks:
        blocks, dblocks = [("", model)], [("", dense_model)]
    if [n for n, _ in blocks] != [n for n, _ in dblocks]:
        raise PruneError("recover: the dense model's blocks (%d) do not match the pruned model's (%d)"
                         % (len(dblocks), len(blocks)))
    originals, results = {}, []
    states = [_ModelState(model), _ModelState(dense_model)]
    try:
        for s in states:
            s.enter()
        batches, _ = take_batches(data, num_samples, max_seq_len, next(model.parameters()).device, "data")
        whole = blocks[0][0] == ""
        with torch.no_grad():
            if whole:
                from .sequential import _WholeModel
                ins = [_WholeModel(b) for b in batches]
                P = D = [None] * len(ins)
            else:
                ins = catch_inputs(model, blocks[0][1], batches)
                dins = catch_inputs(dense_model, dblocks[0][1], batches)
                P = [i.hidden() for i in ins]
                D = [i.hidden() for i in dins]
        for (bname, bmod), (_, dmod) in zip(blocks, dblocks):
            prefix = bname + "." if bname else ""
            names = [n for n in by_name if n.startswith(prefix)]
            for n in names:
                for p in (mods[n].weight, mods[n].bias):
                    if p is not None and id(p) not in originals:
                        originals[id(p)] = (p, p.detach().clone())
            with torch.no_grad():
                tg = [_hidden_of(ins[b].call(dmod, D[b])).detach() for b in range(len(ins))]
            if names:
                rel = {n[len(prefix):] if prefix else n: by_name[n] for n in names}
                r = reconstruct_block(bmod, list(rel), rel, ins, P, tg, steps=steps, lr=lr, holdout=holdout,
                                      log=log, what="block '%s'" % (bname or "the model"), originals=originals)
                r["block"] = bname
                results.append(r)
            if not whole:
                with torch.no_grad():
                    P = [_hidden_of(ins[b].call(bmod, P[b])).detach() for b in range(len(ins))]
                D = tg
    except KeyboardInterrupt:
        _restore(originals)
        raise PruneInterrupted("tilejit.recover: interrupted; the model is unchanged") from None
    except BaseException:
        _restore(originals)
        raise
    finally:
        for s in states:
            s.leave()
    return results


def _kl_rows(lo, lr):
    """KL(teacher ‖ model) of each row's next-token distribution: [rows, vocabulary] logits → [rows]."""
    lp, lq = torch.log_softmax(lo.float(), -1), torch.log_softmax(lr.float(), -1)
    return (lq.exp() * (lq - lp)).sum(-1)


def kl_tokens(lo, lr, rows=256):
    """_kl_rows of [..., vocabulary] logits, per token, in slices of `rows` tokens. Under autograd
    each slice is recomputed in the backward pass (torch.utils.checkpoint), so a batch's
    log-softmaxes and their products (five tensors of batch × tokens × vocabulary floats, 400 MB
    each for 8 × 256 tokens of a 49,152-word vocabulary) are never held at once: only one slice's."""
    from torch.utils.checkpoint import checkpoint
    v = lo.shape[-1]
    a, b = lo.reshape(-1, v), lr.reshape(-1, v)
    grad = torch.is_grad_enabled() and a.requires_grad
    parts = [checkpoint(_kl_rows, a[i:i + rows], b[i:i + rows], use_reentrant=False) if grad
             else _kl_rows(a[i:i + rows], b[i:i + rows]) for i in range(0, a.shape[0], rows)]
    return torch.cat(parts).reshape(lo.shape[:-1])


def _distill_loss(kind, out, ref, batch):
    mask = token_mask(batch)
    if callable(kind):
        return kind(out, ref, batch)
    if kind == "logits":
        kl = kl_tokens(out.logits, ref.logits)
        return kl[mask].mean() if mask is not None and kl.shape == mask.shape else kl.mean()
    if kind == "hidden":
        ho, hr = out.last_hidden_state, ref.last_hidden_state
        if mask is not None and ho.shape[:2] == mask.shape:
            m = mask.unsqueeze(-1).to(ho.dtype)
            po, pr = (ho * m).sum(1) / m.sum(1).clamp(min=1), (hr * m).sum(1) / m.sum(1).clamp(min=1)
        else:
            po, pr = ho.mean(1), hr.mean(1)
        return (1 - nn.functional.cosine_similarity(po.float(), pr.float(), dim=-1)).mean()
    if kind == "layers":
        hs, rs = getattr(out, "hidden_states", None), getattr(ref, "hidden_states", None)
        if hs is None or rs is None:
            raise PruneError("finetune: loss='layers' needs the model's hidden_states (a model called with "
                             "output_hidden_states=True); this model's output has none")
        tot = 0
        for h, r in zip(hs[1:], rs[1:]):
            d, t = (h - r).float(), r.float()
            if mask is not None and d.shape[:-1] == mask.shape:
                d, t = d[mask], t[mask]
            tot = tot + (d * d).sum() / (t * t).sum().clamp(min=1e-30)
        return tot / max(1, len(hs) - 1)
    raise PruneError("finetune: loss=%r: expected 'hidden', 'layers', 'logits' or a callable" % (kind,))


def _tensor_bytes(out):
    """Bytes of the tensors a model output holds (a tensor, a ModelOutput, dicts, tuples), each
    storage counted once (a ModelOutput's last_hidden_state is also its last hidden_states entry)."""
    seen, total, todo = set(), 0, [out]
    while todo:
        o = todo.pop()
        if isinstance(o, torch.Tensor):
            key = (o.untyped_storage().data_ptr(), o.untyped_storage().nbytes())
            if key not in seen:
                seen.add(key)
                total += key[1]
        elif hasattr(o, "values"):
            todo.extend(o.values())
        elif isinstance(o, (tuple, list)):
            todo.extend(o)
    return total


def finetune(model, teacher, data, *, steps=600, lr=2e-4, loss=None, num_samples=None, max_seq_len=None,
             holdout=0.1, eval_every=25, patience=4, pattern=None, teacher_cache_gb=4.0, progress=True):
    """Distillation fine-tuning of a pruned model against its dense teacher, end to end: only
    the kept weights of the pruned layers (through TileLinear, so the pattern holds), all
    biases and norm parameters train. loss: "hidden" (1 − cosine of the mean-pooled last hidden
    state), "layers" (the squared error of every layer's hidden states over their square, one
    ratio per layer over the batch's real tokens; the default for models without
    logits that take output_hidden_states, such as Hugging Face encoders: on all-MiniLM-L6-v2 it
    wins back far more than "hidden", which overfits a thousand sentences within one pass),
    "logits" (KL of the teacher's next-token distribution to the model's; the default for models
    with logits), or a callable(output, teacher_output, batch) → scalar tensor. Adam, `steps`
    steps over the batches, early stopping on the held-out last `holdout` of them (the best state
    kept). The teacher's outputs are computed once and held for as many batches as fit in
    `teacher_cache_gb` (a causal LM's logits are batch × tokens × vocabulary floats: 6.4 GB for
    128 chunks of 256 tokens of a 49,152-word vocabulary); the other batches' are recomputed
    each time they are used, so memory stays bounded whatever the amount of data. Errors (no
    data, a non-finite loss, outputs that do not match) and interrupts leave the model as it
    was. Returns {"steps", "heldout_before", "heldout_after", "seconds", "teacher_cached"}."""
    from .torch import TWLinear, pattern_of
    log = _logger(progress)
    t0 = time.perf_counter()
    pattern = pattern if pattern is not None else pattern_of(model)
    if pattern is None:
        raise PruneError("finetune: the model has no tile-wise pattern (prune it first, or pass pattern=)")
    by_name = {l["name"]: l for l in pattern["layers"]}
    mods = dict(model.named_modules())
    batches, _ = take_batches(data, num_samples, max_seq_len, next(model.parameters()).device, "data")
    nb = len(batches)
    nh = 0 if nb < 2 else max(1, int(round(nb * holdout)))
    train, held = list(range(nb - nh)), list(range(nb - nh, nb)) or list(range(nb))
    originals, state, tstate = {}, _ModelState(model), _ModelState(teacher)
    linears = [n for n in by_name if isinstance(mods.get(n), nn.Linear)]
    tws = [mods[n] for n in by_name if isinstance(mods.get(n), TWLinear)]
    if len(linears) + len(tws) != len(by_name):
        raise PruneError("finetune: pattern layer '%s' is not a linear layer of the model"
                         % next(n for n in by_name if n not in linears and not isinstance(mods.get(n), TWLinear)))
    swapped = {}
    ok = False
    try:
        state.enter()
        tstate.enter()
        def teacher_out(i, b):
            with torch.no_grad():
                try:
                    return call_model(teacher, b)
                except Exception as e:
                    raise PruneError("finetune: batch %d: the teacher rejected it: %s: %s"
                                     % (i, type(e).__name__, e)) from e
        kind = loss
        if kind is None:  # logits where the model has them, else every layer's hidden states if it gives them
            first = teacher_out(0, batches[0])
            kind = "logits" if hasattr(first, "logits") else (
                "layers" if hasattr(batches[0], "keys") and hasattr(getattr(teacher, "config", None),
                                                                   "output_hidden_states") else "hidden")
            del first
        if kind == "layers":  # every layer's hidden states: asked of models that take the flag
            batches = [dict(b, output_hidden_states=True) if hasattr(b, "keys") else b for b in batches]
        refs, held_bytes = [], 0
        for i, b in enumerate(batches):  # held while they fit the budget, recomputed after
            r = teacher_out(i, b)
            held_bytes += _tensor_bytes(r)
            if held_bytes > teacher_cache_gb * 1e9:
                break
            refs.append(r)
        del r
        ncached = len(refs)
        if ncached < nb:
            log("finetune: the teacher's outputs of %d of %d batches held (teacher_cache_gb=%g); the "
                "others are recomputed when used" % (ncached, nb, teacher_cache_gb))

        def ref(b):
            return refs[b] if b < ncached else teacher_out(b, batches[b])
        for p in model.parameters():
            if id(p) not in originals:
                originals[id(p)] = (p, p.detach().clone())
        made = [tw for tw in tws if "kept" not in tw._modules]
        for tw in tws:
            for p in tw.trainable().parameters():
                originals.setdefault(id(p), (p, p.detach().clone()))
        swapped = _swap_in(model, linears, by_name)
        tile_params = [p for n in linears for p in getattr(swapped[n][0], swapped[n][1]).parameters()]
        tile_params += [p for tw in tws for p in tw.kept.parameters()]
        tile_ids = {id(p) for p in tile_params}
        other = [p for m in model.modules() for p in (getattr(m, "bias", None),) if isinstance(p, nn.Parameter)
                 and id(p) not in tile_ids]
        other += [p for p in _norm_params(model) if id(p) not in tile_ids]
        params = list({id(p): p for p in tile_params + other}.values())
        req = [(p, p.requires_grad) for p in model.parameters()]
        for p in model.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        def eval_loss(idx):
            with torch.no_grad():
                return sum(float(_distill_loss(kind, call_model(model, batches[b]), ref(b), batches[b]))
                           for b in idx) / len(idx)
        try:
            before = eval_loss(held)
        except PruneError:
            raise
        except Exception as e:
            raise PruneError("finetune: the model's and the teacher's outputs do not match: %s: %s"
                             % (type(e).__name__, e)) from e

        def show(step, last, h):
            log("finetune: step %d/%d, loss %.4e, held-out %.4e (%.0f s)" % (step, steps, last, h,
                                                                           time.perf_counter() - t0))
        step, best, _ = _fit(params, lr, steps, train,
                             lambda b: _distill_loss(kind, call_model(model, batches[b]), ref(b), batches[b]),
                             lambda: eval_loss(held), before, eval_every, patience, "finetune", on_eval=show)
        for p, r in req:
            p.requires_grad_(r)
        ok = True
    except KeyboardInterrupt:
        _swap_out(swapped, keep=False)
        swapped = {}
        _restore(originals)
        raise PruneInterrupted("tilejit.finetune: interrupted; the model is unchanged") from None
    except BaseException:
        _swap_out(swapped, keep=False)
        swapped = {}
        _restore(originals)
        raise
    finally:
        if swapped:
            _swap_out(swapped, keep=ok)
        for tw in locals().get("made", []):
            tw.trainable(False)  # the trained kept weights written into the kernel's weights
        state.leave()
        tstate.leave()
    res = {"steps": step, "heldout_before": before, "heldout_after": best, "loss": kind if isinstance(kind, str) else
           "callable", "seconds": round(time.perf_counter() - t0, 1),
           "teacher_cached": locals().get("ncached", 0)}
    log("finetune: held-out loss %.4e → %.4e in %d steps (%.0f s)" % (before, best, step, res["seconds"]))
    return res
