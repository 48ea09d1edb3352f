"""Recovery after tile-wise pruning (tilejit.recover, TWLinear's autograd) on tiny random models:
gradients of the tile-wise layer against finite differences and against the masked dense layer
(tw1, tw2, tew, with activations); the pattern unchanged by training (every pruned weight still
exactly 0, the kept sets identical); save, reload, bit-identical outputs; block recovery inside
prune() and alone, and distillation fine-tuning, each bringing the model closer to the dense one;
bad input (no data, a non-finite loss, a teacher whose outputs do not match) as one clear error with
the model unchanged. Exit 77 (skip) without PyTorch/transformers."""
import copy
import json
import os
import sys
import tempfile

try:
    import torch
    import transformers  # noqa: F401
except ImportError as e:
    print("PyTorch or transformers is not installed (%s): skipping (scripts/install-torch)" % e)
    sys.exit(77)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)
from checks import check  # noqa: E402
import tiny_models as tiny  # noqa: E402
import tilejit.torch as tjt  # noqa: E402
from tilejit import data as D  # noqa: E402
from tilejit.recover import TileLinear  # noqa: E402

transformers.utils.logging.disable_progress_bar()
torch.set_num_threads(2)


def quiet(msg):
    pass


def layer_of(w, mode, g, sparsity=0.5, act="none"):
    """A pattern layer for weights w from the library's magnitude pruner (tw1, tw2 or tew)."""
    from tilejit import Context
    with Context(backend="reference") as c:
        l = c.prune({"l": w.float()}, sparsity, mode=mode, g=g, ew_fraction=0.03)["layers"][0]
    l["activation"] = act
    return l


def test_gradients():
    g = torch.Generator().manual_seed(0)
    for mode, act, uniform in (("tw1", "none", False), ("tw2", "gelu", False), ("tew", "relu", False),
                               ("tw1", "gelu", True), ("tw2", "none", True)):
        w = torch.randn(70, 45, generator=g, dtype=torch.float64)
        b = torch.randn(70, generator=g, dtype=torch.float64)
        l = layer_of(w, mode, 16, act=act)
        if uniform:  # every tile keeping the same count, as the calibrated pruner's tw1 and tw2 do
            l["tiles"] = [sorted(torch.randperm(45, generator=g)[:20].tolist()) for _ in l["tiles"]]
        mode = mode + (" (one tensor)" if uniform else "")
        mask = tjt.layer_mask(l)
        tl = TileLinear(l, w, b)
        tl.double()
        check(tl.uniform == uniform, "%s: TileLinear keeps the tiles %s" % (mode, "in one tensor" if uniform else "apart"))
        x = torch.randn(6, 45, generator=g, dtype=torch.float64, requires_grad=True)
        ok = torch.autograd.gradcheck(lambda x, *ps: tl(x), (x, *tl.parameters()), eps=1e-6, atol=1e-5)
        check(ok, "%s (%s): TileLinear's gradients of x and the kept weights match finite differences" % (mode, act))
        # against the masked dense layer
        ref = w * mask
        x2 = x.detach().clone().requires_grad_(True)
        y = x2 @ ref.t() + b
        y = {"none": y, "gelu": torch.nn.functional.gelu(y), "relu": torch.relu(y)}[act]
        y.square().sum().backward()
        x3 = x.detach().clone().requires_grad_(True)
        tl.zero_grad()
        tl(x3).square().sum().backward()
        wg = torch.zeros_like(w)
        tl2 = copy.deepcopy(tl)
        with torch.no_grad():  # the kept weights' gradients laid out densely, as dense_weight does
            for p, q in zip(tl2.parameters(), tl.parameters()):
                p.copy_(q.grad if q.grad is not None else torch.zeros_like(q))
            wg = tl2.dense_weight()
        wd = torch.nn.Parameter(ref.clone())
        yd = x.detach() @ (wd * mask).t() + b
        yd = {"none": yd, "gelu": torch.nn.functional.gelu(yd), "relu": torch.relu(yd)}[act]
        yd.square().sum().backward()
        check(torch.allclose(x3.grad, x2.grad, atol=1e-10) and torch.allclose(wg, wd.grad * mask, atol=1e-9)
              and bool((wg[~mask] == 0).all()),
              "%s: gradients equal the masked dense layer's (x and W ⊙ mask), none outside the pattern" % mode)
        check(torch.equal(tl.dense_weight() != 0, mask & (w != 0)), "%s: dense_weight() is W ⊙ mask" % mode)
    # TWLinear: x's gradient without trainable weights, then the kept weights trained
    lin = torch.nn.Linear(96, 200)
    tw = tjt.TWLinear.from_linear(lin, sparsity=0.5, g=32, name="l", backend="cpu")
    x = torch.randn(7, 96, requires_grad=True)
    tw(x).square().sum().backward()
    xr = x.detach().clone().requires_grad_(True)
    (xr @ tw.masked_weight().t() + tw.bias).square().sum().backward()
    check(torch.allclose(x.grad, xr.grad, rtol=1e-4, atol=1e-4), "TWLinear: x's gradient equals the masked dense layer's")
    pat = json.dumps(tw.layer, sort_keys=True)
    w_before = tw.weight.detach().clone()
    k = tw.trainable()
    opt = torch.optim.Adam(tw.parameters(), lr=1e-2)
    for _ in range(5):
        opt.zero_grad()
        tw(torch.randn(9, 96)).square().mean().backward()
        opt.step()
    with torch.no_grad():
        xe = torch.randn(4, 96)
        yk, yt = tw(xe), k(xe)
    check(float((yk - yt).abs().max()) < 1e-4, "TWLinear after training: the kernel (rebuilt) computes what the "
          "trained kept weights do (max diff %.1e)" % float((yk - yt).abs().max()))
    mask = tw.mask()
    check(json.dumps(tw.layer, sort_keys=True) == pat and torch.equal(tw.weight[~mask], w_before[~mask])
          and not torch.equal(tw.weight[mask], w_before[mask]) and sorted(tw.state_dict()) == ["bias", "weight"],
          "TWLinear after training: same pattern, kept weights trained, nothing else touched, state_dict keys "
          "weight and bias only")
    # traced whole (fullgraph), through AOTAutograd, without paying for Inductor's code generation
    cm = torch.compile(torch.nn.Sequential(tw), fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        yc = cm(xe)
    check(torch.allclose(yc, yk, atol=1e-5), "torch.compile(fullgraph=True) still traces the forward")


def pruned_pair(make, batches, **kw):
    dense = make()
    model = copy.deepcopy(dense)
    rep = tjt.prune(model, batches, sparsity=0.6, g=32, allocation="uniform", progress=quiet, **kw)
    return dense, model, rep


def out_cos(model, dense, batches):
    cs = []
    with torch.no_grad():
        for b in batches:
            o, r = model(**b), dense(**b)
            f = "logits" if hasattr(o, "logits") else "last_hidden_state"
            m = b["attention_mask"].bool()
            cs.append(torch.nn.functional.cosine_similarity(getattr(o, f)[m], getattr(r, f)[m], dim=-1))
    return float(torch.cat(cs).mean())


def same_pattern_and_zeros(model, pattern):
    mods = dict(model.named_modules())
    for l in pattern["layers"]:
        m = mods[l["name"]]
        w = m.masked_weight() if isinstance(m, tjt.TWLinear) else m.weight.detach()
        if bool((w[~tjt.layer_mask(l)] != 0).any()):
            return False
    back = tjt.pattern_of(model)
    return json.dumps(back["layers"], sort_keys=True) == json.dumps(pattern["layers"], sort_keys=True)


def test_recovery(tok):
    # enough tokens for the kept weights not to overfit: 192 chunks × 32 tokens × 64 features of
    # targets against ~25,000 trainable values per block
    cal = D.token_chunks(tok, " ".join(tiny.sentences(1800, 1, 8, 30)), 192, 32, 16)
    held = D.token_chunks(tok, " ".join(tiny.sentences(200, 9, 8, 30)), 16, 32, 8)
    # block recovery inside prune() against the same prune without it
    dense, plain, _ = pruned_pair(tiny.llama, cal, num_samples=192)
    _, rec, rep = pruned_pair(tiny.llama, cal, num_samples=192, recover="block", recover_steps=60, recover_lr=1e-3)
    c0, c1 = out_cos(plain, dense, held), out_cos(rec, dense, held)
    check(c1 > c0, "prune(recover='block'): held-out output cosine %.4f → %.4f" % (c0, c1))
    check(len(rep.recovery) == 2 and all(r["heldout_after"] <= r["heldout_before"] for r in rep.recovery),
          "  each block's held-out loss did not grow: %s" % [(round(r["heldout_before"], 4), round(r["heldout_after"], 4))
                                                         for r in rep.recovery])
    check(same_pattern_and_zeros(rec, rep.pattern), "  the pattern holds: pruned weights exactly 0, kept sets identical")
    # recover() alone, on the plain prune
    r = tjt.recover(plain, dense, cal, steps=60, lr=1e-3, progress=quiet)
    c2 = out_cos(plain, dense, held)
    check(c2 > c0 and len(r) == 2, "recover() alone: held-out output cosine %.4f → %.4f" % (c0, c2))
    check(same_pattern_and_zeros(plain, plain._tilejit_pattern), "  the pattern holds")
    # fine-tuning an encoder swapped to TWLinear, against its dense teacher
    sents = tiny.sentences(160, 4)
    bcal = D.sentence_batches(tok, sents[:128], 16, 48)
    bheld = D.sentence_batches(tok, sents[128:], 16, 48)
    bdense, bmodel, brep = pruned_pair(tiny.bert, bcal, num_samples=128)
    with tempfile.TemporaryDirectory() as d:
        tjt.save_pruned(bmodel, os.path.join(d, "p"))
        tw_model = copy.deepcopy(bdense)
        tjt.sparsify(tw_model, pattern=os.path.join(d, "p", "pattern.json"),
                     weights=os.path.join(d, "p", "model.safetensors"), backend="cpu")
    b0 = out_cos(tw_model, bdense, bheld)
    res = tjt.finetune(tw_model, bdense, bcal, steps=80, lr=5e-4, eval_every=10, progress=quiet)
    b1 = out_cos(tw_model, bdense, bheld)
    check(res["loss"] == "layers", "an encoder's default distillation loss is every layer's hidden states (%s)"
          % res["loss"])
    check(b1 > b0 and res["heldout_after"] < res["heldout_before"],
          "finetune (TWLinear model, loss 'layers'): held-out cosine %.4f → %.4f" % (b0, b1))
    check(same_pattern_and_zeros(tw_model, brep.pattern), "  the pattern holds after fine-tuning")
    # save, reload, bit-identical outputs
    with tempfile.TemporaryDirectory() as d:
        out = tjt.save_pruned(tw_model, os.path.join(d, "ft"))
        again = type(bdense).from_pretrained(out).eval()
        tjt.sparsify(again, pattern=os.path.join(out, "pattern.json"), backend="cpu")
        with torch.no_grad():
            same = all(torch.equal(tw_model(**b).last_hidden_state, again(**b).last_hidden_state) for b in bheld)
        check(same, "saved, reloaded and sparsified again: bit-identical outputs")
        saved = json.load(open(os.path.join(out, "pattern.json")))
        check(json.dumps(saved["layers"], sort_keys=True) == json.dumps(brep.pattern["layers"], sort_keys=True),
              "  the saved pattern is the pruned one")
    # a finetune of a dense-layer model (prune()'s output) with the default loss (logits: KL)
    rec2 = copy.deepcopy(rec)
    res2 = tjt.finetune(rec, dense, cal, steps=20, lr=1e-3, progress=quiet)
    check(res2["loss"] == "logits" and same_pattern_and_zeros(rec, rep.pattern),
          "finetune of prune()'s model (nn.Linear layers, KL of the logits): the pattern holds")
    # the teacher's outputs recomputed for every batch instead of held: the same training
    res3 = tjt.finetune(rec2, dense, cal, steps=20, lr=1e-3, teacher_cache_gb=0, progress=quiet)
    check(res2["teacher_cached"] == len(cal) and res3["teacher_cached"] == 0 and unchanged(rec2, state(rec)),
          "  with teacher_cache_gb=0 (%d of %d batches held, against %d): bit-identical weights"
          % (res3["teacher_cached"], len(cal), res2["teacher_cached"]))


def state(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def unchanged(m, st):
    now = m.state_dict()
    return all(torch.equal(now[k], st[k]) for k in st)


def expect(what, fn, model, words):
    st = state(model)
    try:
        fn()
        check(False, "%s: no error" % what)
    except tjt.PruneError as e:
        check(all(w in str(e) for w in words), "%s: %s" % (what, e))
    check(unchanged(model, st), "%s: the model is unchanged" % what)


def test_token_errors():
    """Recovery's loss is the mean of each real token's relative squared error: a token with
    activations thousands of times the others' (a decoder's attention sink) weighs as one token,
    padding not at all, and the gradient reaches the output."""
    from tilejit.sequential import token_errors
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(2, 5, 16, generator=g)
    ref[0, 0] *= 1e4  # the sink
    out = ref + 0.1 * torch.randn(2, 5, 16, generator=g)
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[1, 3:] = False
    out[1, 3:] += 100.0  # padding, wildly wrong: must not count
    want = torch.stack([((out[b, t] - ref[b, t]) ** 2).sum() / (ref[b, t] ** 2).sum()
                        for b in range(2) for t in range(5) if mask[b, t]])
    out.requires_grad_(True)
    e = token_errors(out, ref, mask)
    check(e.shape == (8,) and torch.allclose(e, want, rtol=1e-5),
          "token_errors: one relative error per real token (%s)" % (e.shape,))
    check(float(e[0]) < 1e-6 and float(e.mean()) > 1e-3,
          "token_errors: the sink token is one token of eight (its %.2e, mean %.2e)" % (float(e[0]), float(e.mean())))
    e.mean().backward()
    check(out.grad is not None and bool(out.grad[1, 3:].eq(0).all()) and float(out.grad[0, 1].abs().sum()) > 0,
          "token_errors: gradients reach real tokens and not the padding")


def test_layers_loss():
    """finetune's "layers" loss: per hidden state after the embeddings, the squared error over the
    target's square summed over the real tokens (one ratio per layer), averaged over the layers."""
    from types import SimpleNamespace
    from tilejit.recover import _distill_loss
    g = torch.Generator().manual_seed(2)
    rs = [torch.randn(2, 4, 8, generator=g) for _ in range(3)]
    hs = [r + 0.2 * torch.randn(2, 4, 8, generator=g) for r in rs]
    hs[1][0, 0] += 50.0  # one token far off: one ratio, so it weighs by its squared error
    mask = torch.ones(2, 4, dtype=torch.long)
    mask[1, 2:] = 0
    hs[2][1, 2:] += 1e3  # padding: must not count
    m = mask.bool()
    want = sum(((h - r)[m] ** 2).sum() / (r[m] ** 2).sum() for h, r in zip(hs[1:], rs[1:])) / 2
    got = _distill_loss("layers", SimpleNamespace(hidden_states=tuple(hs)), SimpleNamespace(hidden_states=tuple(rs)),
                        {"input_ids": torch.zeros(2, 4, dtype=torch.long), "attention_mask": mask})
    check(torch.allclose(got, want, rtol=1e-5), "finetune's 'layers' loss: %.6f, by hand %.6f" % (float(got), float(want)))


def test_kl_slices():
    """finetune's "logits" loss computes the KL per token in slices, each recomputed in the
    backward pass: the same values and gradients as the whole-batch formula, slices that do not
    divide the tokens included."""
    from tilejit.recover import kl_tokens
    g = torch.Generator().manual_seed(3)
    lo, lr = 3 * torch.randn(2, 7, 50, generator=g), 3 * torch.randn(2, 7, 50, generator=g)
    a, b = lo.clone().requires_grad_(True), lo.clone().requires_grad_(True)
    lq = torch.log_softmax(lr, -1)
    want = (lq.exp() * (lq - torch.log_softmax(a, -1))).sum(-1)
    got = kl_tokens(b, lr, rows=3)
    check(got.shape == want.shape and torch.allclose(got, want, rtol=1e-5, atol=1e-6),
          "kl_tokens in slices of 3 of 14 tokens: max difference %.2e" % float((got - want).detach().abs().max()))
    w = torch.randn(2, 7, generator=g)
    (want * w).sum().backward()
    (got * w).sum().backward()
    check(torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7),
          "kl_tokens' gradient equals the whole-batch formula's (max difference %.2e)" % float((a.grad - b.grad).abs().max()))
    with torch.no_grad():
        check(torch.allclose(kl_tokens(lo, lr, rows=4), want.detach(), rtol=1e-5, atol=1e-6), "kl_tokens without autograd")


def test_bad_input(tok):
    cal = D.token_chunks(tok, " ".join(tiny.sentences(200, 2, 8, 30)), 16, 32, 8)
    dense, model, _ = pruned_pair(tiny.llama, cal, num_samples=16)
    expect("finetune without data", lambda: tjt.finetune(model, dense, [], progress=quiet), model, ["no batch"])
    expect("recover without data", lambda: tjt.recover(model, dense, None, progress=quiet), model, ["no data"])
    expect("a non-finite loss", lambda: tjt.finetune(model, dense, cal, steps=3, loss=lambda o, r, b: (o.logits * float("nan")).sum(),
                                                     progress=quiet), model, ["not finite", "step 1"])
    other = tiny.llama(seed=5, hidden=48, heads=4, kv_heads=2)
    other.resize_token_embeddings(300)
    expect("a teacher whose outputs do not match", lambda: tjt.finetune(model, other, cal, steps=3, progress=quiet),
           model, ["do not match"])
    m2 = copy.deepcopy(dense)
    expect("block recovery diverging", lambda: tjt.prune(m2, cal, sparsity=0.5, g=32, allocation="uniform",
                                                         recover="block", recover_lr=1e12, recover_steps=5,
                                                         progress=quiet), m2, ["not finite", "block"])


def main():
    tok = tiny.tokenizer()
    test_gradients()
    test_token_errors()
    test_layers_loss()
    test_kl_slices()
    test_recovery(tok)
    test_bad_input(tok)
    print(check.summary())
    return check.exit_code()


if __name__ == "__main__":
    sys.exit(main())
