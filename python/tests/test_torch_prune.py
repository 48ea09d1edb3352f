"""tilejit.torch.prune on tiny random models of both families (a BERT encoder, a LLaMA decoder)
and python -m tilejit.calibrate on them: densities, pattern and weights, the structure found
(groups, residual sums, norms), padding left out, the calibrated rebuild against the magnitude
pruner, save/reload with tilejit's kernels bit for bit, and every bad input (one error naming the
layer or batch, the model unchanged). Exit 77 (skip) without PyTorch/transformers."""
import copy
import json
import os
import subprocess
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
import tiny_models as tiny  # noqa: E402
transformers.utils.logging.disable_progress_bar()
import tilejit.torch as tjt  # noqa: E402
from tilejit import data as D  # noqa: E402

failures = 0
torch.set_num_threads(2)


def check(cond, msg):
    global failures
    print(("ok: " if cond else "FAIL: ") + msg, flush=True)
    if not cond:
        failures += 1


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def same_state(model, st):
    """Bit for bit (NaN equal to NaN)."""
    now = model.state_dict()
    return set(now) == set(st) and all(bool(((now[k] == st[k]) | (now[k].isnan() & st[k].isnan())).all())
                                       if now[k].is_floating_point() else torch.equal(now[k], st[k]) for k in st)


def bert_batches(tok, n=96, bs=16, seed=0):
    return D.sentence_batches(tok, tiny.sentences(n, seed), bs, 64)


def llama_batches(tok, n=48, seed=0, seq=32):
    return D.token_chunks(tok, " ".join(tiny.sentences(n * 4, seed, 8, 30)), n, seq, 8)


def out_of(model, batches):
    with torch.no_grad():
        o = [model(**b) for b in batches]
    f = "logits" if hasattr(o[0], "logits") else "last_hidden_state"
    return [getattr(x, f) for x in o]


def closeness(model, dense_out, batches):
    """Mean cosine of the outputs (last hidden state or logits), per token, to the dense model's."""
    cs = []
    for a, b, bt in zip(out_of(model, batches), dense_out, batches):
        m = bt["attention_mask"].bool()
        cs.append(torch.nn.functional.cosine_similarity(a[m], b[m], dim=-1))
    return float(torch.cat(cs).mean())


def quiet(msg):
    pass


def test_family(name, make, batches_of, tok):
    model = make()
    cal = batches_of(tok)
    held = batches_of(tok, 24, seed=7) if name == "llama" else bert_batches(tok, 48, 16, seed=7)
    dense = copy.deepcopy(model)
    dense_out = out_of(dense, held)
    rep = tjt.prune(model, cal, sparsity=0.5, g=32, num_samples=64 if name == "bert" else 32, profile_samples=16,
                    progress=quiet)
    print(rep)
    nlin = 12 if name == "bert" else 14
    check(len(rep.layers) == nlin, "%s: %d layers pruned (expected %d: heads and pooler left out)"
          % (name, len(rep.layers), nlin))
    check(abs(rep.density - 0.5) < 0.02, "%s: density %.4f ≈ 0.5" % (name, rep.density))
    names = {l["name"] for l in rep.layers}
    check(not any("pooler" in n or "lm_head" in n for n in names), "%s: no output head pruned" % name)
    # the weights hold the pattern's zeros exactly, and the pattern loads into tilejit
    mods = dict(model.named_modules())
    zeros_ok = all(bool((mods[l["name"]].weight.detach()[~tjt.layer_mask(l)] == 0).all())
                   for l in rep.pattern["layers"])
    check(zeros_ok, "%s: every pruned weight is exactly 0" % name)
    # structure found from hooks
    if name == "bert":
        exp_res = {"encoder.layer.%d.%s" % (i, s) for i in range(2) for s in ("attention.output.dense", "output.dense")}
        exp_norms = {"encoder.layer.%d.%s" % (i, s) for i in range(2)
                     for s in ("attention.output.LayerNorm", "output.LayerNorm")}
        grp = [l["group"] for l in rep.layers if l["block"] == "encoder.layer.0"]
    else:
        exp_res = {"model.layers.%d.%s" % (i, s) for i in range(2) for s in ("self_attn.o_proj", "mlp.down_proj")}
        exp_norms = set()  # pre-norm blocks: no refit by default (post_attention_layernorm feeds the MLP only)
        grp = [l["group"] for l in rep.layers if l["block"] == "model.layers.0"]
    check(set(rep.residual_layers) == exp_res, "%s: residual layers %s" % (name, sorted(rep.residual_layers)))
    check(set(rep.norms_refitted) == exp_norms, "%s: norms refitted %s" % (name, sorted(rep.norms_refitted)))
    want_groups = [0, 0, 0, 1, 2, 3] if name == "bert" else [0, 0, 0, 1, 2, 2, 3]
    check(grp == want_groups, "%s: groups by shared input in hook order %s" % (name, grp))
    cal_cos = closeness(model, dense_out, held)
    # the magnitude pruner at the same per-layer densities, for comparison
    mag = copy.deepcopy(dense)
    with torch.no_grad():
        for l in rep.layers:
            m = dict(mag.named_modules())[l["name"]]
            pat = tjt.TWLinear.from_linear(m, sparsity=1 - l["density"], g=32, name=l["name"]).layer
            m.weight.mul_(tjt.layer_mask(pat).to(m.weight.dtype))
    mag_cos = closeness(mag, dense_out, held)
    check(cal_cos > mag_cos, "%s: calibrated output cosine %.4f > magnitude pruner's %.4f on held-out data"
          % (name, cal_cos, mag_cos))
    # save, reload with from_pretrained and with tilejit's kernels: the same outputs
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "pruned")
        tjt.save_pruned(model, out, tokenizer=tok)
        check(sorted(os.listdir(out))[:3] and os.path.exists(os.path.join(out, "pattern.json")),
              "%s: save_pruned wrote %s" % (name, sorted(os.listdir(out))))
        cls = type(model)
        again = cls.from_pretrained(out).eval()
        a, b = out_of(again, held), out_of(model, held)
        check(all(torch.equal(x, y) for x, y in zip(a, b)), "%s: from_pretrained(saved) gives the same outputs" % name)
        # into the user's own dense model: pattern layers swapped, refitted norms loaded
        fresh = copy.deepcopy(dense)
        srep = tjt.sparsify(fresh, pattern=os.path.join(out, "pattern.json"),
                            weights=os.path.join(out, "model.safetensors"), backend="cpu")
        check(len(srep.swapped) == nlin and not srep.unmatched and srep.loaded > 0,
              "%s: sparsify reloads %d layers and %d other tensors" % (name, len(srep.swapped), srep.loaded))
        c, e = out_of(fresh, held), out_of(model, held)
        worst = max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(c, e))
        check(worst < 1e-4, "%s: tilejit's kernels reproduce the pruned model (max rel. diff %.1e)" % (name, worst))
        # an interrupted save leaves the folder as it was
        before = sorted(os.listdir(out))
        real = tjt._write_weights

        def boom(*a, **k):
            raise KeyboardInterrupt
        tjt._write_weights = boom
        try:
            tjt.save_pruned(model, out)
            check(False, "an interrupted save raises")
        except KeyboardInterrupt:
            check(sorted(os.listdir(out)) == before and not [f for f in os.listdir(d) if f.startswith(".")],
                  "%s: an interrupted save leaves the folder as it was and no temporary" % name)
        finally:
            tjt._write_weights = real
    return model


def test_padding(tok):
    """Padding tokens are left out of the statistics: the same sentences one per batch (no padding)
    and sixteen per batch (padded) give the same pattern and nearly the same weights."""
    sents = tiny.sentences(48, 3, 3, 24)
    runs = []
    for bs in (1, 16):
        m = tiny.bert(seed=2)
        rep = tjt.prune(m, D.sentence_batches(tok, sents, bs, 64), sparsity=0.5, g=32, num_samples=48,
                        allocation="uniform", progress=quiet)
        runs.append((rep, m))
    same_pattern = json.dumps(runs[0][0].pattern, sort_keys=True) == json.dumps(runs[1][0].pattern, sort_keys=True)
    diff = max(float((a - b).abs().max()) for a, b in zip(runs[0][1].state_dict().values(), runs[1][1].state_dict().values()))
    check(same_pattern and diff < 1e-3, "padding left out of the statistics: same pattern, weights within %.1e" % diff)
    check(runs[0][0].tokens == runs[1][0].tokens, "tokens counted %d = %d" % (runs[0][0].tokens, runs[1][0].tokens))


def test_options(tok):
    m = tiny.llama(seed=3)
    cal = llama_batches(tok, 40)
    rep = tjt.prune(m, cal, sparsity=0.25, g=32, num_samples=20, max_seq_len=16, allocation="uniform",
                    layers=r"mlp\.", progress=quiet)
    check(rep.samples == 20 and rep.tokens == 20 * 16, "num_samples and max_seq_len honoured (%d samples, %d tokens)"
          % (rep.samples, rep.tokens))
    check({l["name"].split(".")[-1] for l in rep.layers} == {"gate_proj", "up_proj", "down_proj"},
          "layers= selects the MLP only")
    check(all(abs(l["density"] - 0.75) < 0.04 for l in rep.layers), "uniform allocation: every layer at 0.75")
    # tuples and tensors as batches
    m2 = tiny.llama(seed=3)
    rep2 = tjt.prune(m2, [b["input_ids"] for b in cal], sparsity=0.25, g=32, num_samples=20, max_seq_len=16,
                     allocation="uniform", layers=r"mlp\.", progress=quiet)
    m3 = tiny.llama(seed=3)
    rep3 = tjt.prune(m3, [(b["input_ids"],) for b in cal], sparsity=0.25, g=32, num_samples=20, max_seq_len=16,
                     allocation="uniform", layers=r"mlp\.", progress=quiet)
    same = json.dumps(rep2.pattern) == json.dumps(rep.pattern) == json.dumps(rep3.pattern)
    check(same, "dict, tuple and tensor batches give the same pattern")
    # a user loss for the profile, and a DataLoader
    calls = []

    def loss(out, ref, batch):
        calls.append(1)
        return float(((out.logits - ref.logits) ** 2).mean())
    ds = torch.utils.data.TensorDataset(torch.cat([b["input_ids"] for b in cal]))
    dl = torch.utils.data.DataLoader(ds, batch_size=8)
    m4 = tiny.llama(seed=3)
    rep4 = tjt.prune(m4, dl, sparsity=0.5, g=32, num_samples=24, profile_samples=8, loss=loss, progress=quiet)
    check(calls and abs(rep4.density - 0.5) < 0.02, "a DataLoader and a user loss (called %d times)" % len(calls))
    # the whole model as one block when it has no ModuleList
    seq = torch.nn.Sequential(torch.nn.Linear(24, 64), torch.nn.GELU(), torch.nn.Linear(64, 24))
    x = torch.randn(256, 24)
    dense = copy.deepcopy(seq)
    rep5 = tjt.prune(seq, [x[i:i + 64] for i in range(0, 256, 64)], sparsity=0.5, g=16, num_samples=256,
                     profile_samples=64, progress=quiet)
    check(len(rep5.layers) == 2 and rep5.blocks == 1 and abs(rep5.density - 0.5) < 0.03,
          "a plain nn.Sequential is pruned as one block (density %.3f)" % rep5.density)
    with torch.no_grad():
        err = float(((seq(x) - dense(x)) ** 2).sum() / (dense(x) ** 2).sum())
    check(err < 0.5, "  and still computes about the same (relative error %.3f)" % err)


def expect_error(what, fn, model, words, exc=tjt.PruneError):
    st = state(model)
    try:
        fn()
        check(False, "%s: no error" % what)
        return
    except exc as e:
        msg = str(e)
        ok = all(w in msg for w in words)
        check(ok, "%s: %s" % (what, msg))
    check(same_state(model, st), "%s: the model is unchanged" % what)


def test_bad_input(tok):
    m = tiny.llama(seed=4)
    cal = llama_batches(tok, 16)
    expect_error("no nn.Linear", lambda: tjt.prune(torch.nn.Sequential(torch.nn.ReLU()), cal, sparsity=0.5,
                                                    progress=quiet), m, ["no nn.Linear"])
    expect_error("no batch", lambda: tjt.prune(m, [], sparsity=0.5, progress=quiet), m, ["no batch"])
    expect_error("no data", lambda: tjt.prune(m, None, sparsity=0.5, progress=quiet), m, ["no data"])
    bad = [cal[0], {"input_ids": cal[1]["input_ids"].float()}]  # token ids as floats: the embedding refuses
    expect_error("a batch the model rejects", lambda: tjt.prune(m, bad, sparsity=0.5, allocation="uniform",
                                                              progress=quiet), m, ["batch 1", "rejected"])
    expect_error("a layers regex matching nothing", lambda: tjt.prune(m, cal, sparsity=0.5, layers="nothing_here",
                                                                    progress=quiet), m, ["matches no nn.Linear"])
    expect_error("an ignore regex matching nothing", lambda: tjt.prune(m, cal, sparsity=0.5, ignore="nothing_here",
                                                                     progress=quiet), m, ["matches no nn.Linear"])
    # NaN activations: a NaN in the embedding of one token that batch 1 uses
    mn = tiny.llama(seed=4)
    tokid = int(cal[1]["input_ids"][0, 0])
    with torch.no_grad():
        mn.model.embed_tokens.weight[tokid, 0] = float("nan")
    expect_error("NaN activations", lambda: tjt.prune(mn, cal, sparsity=0.5, allocation="uniform", g=32,
                                                      progress=quiet), mn, ["NaN or Inf", "layer 'model.layers.0"])
    # a layer with no output features: nothing to tile
    sq = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 0))
    expect_error("a layer the tile size cannot cover", lambda: tjt.prune(sq, [torch.randn(4, 8)], sparsity=0.5,
                                                                         progress=quiet), sq, ["layer '1'", "tiles"])
    expect_error("g = 0", lambda: tjt.prune(m, cal, sparsity=0.5, g=0, progress=quiet), m, ["g=0"])
    # an interrupt part-way (after the first block): PruneInterrupted, the model as it was
    mi = tiny.llama(seed=4)

    def interrupt(msg):
        if "block 'model.layers.0' pruned" in msg:
            raise KeyboardInterrupt
    expect_error("an interrupt part-way", lambda: tjt.prune(mi, cal, sparsity=0.5, g=32, allocation="uniform",
                                                            progress=interrupt), mi,
                 ["interrupted", "model.layers"], exc=tjt.PruneInterrupted)
    check(mi.config.use_cache and not hasattr(mi, "_tilejit_pattern"), "  and its config and attributes as they were")


def test_cli(tok):
    """python -m tilejit.calibrate on saved tiny models with a text file and a JSON Lines file."""
    with tempfile.TemporaryDirectory() as d:
        py = sys.executable
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        txt = os.path.join(d, "data.txt")
        with open(txt, "w") as f:
            f.write("\n".join(tiny.sentences(200, 5)) + "\n")
        jl = os.path.join(d, "data.jsonl")
        with open(jl, "w") as f:
            for s in tiny.sentences(200, 6):
                f.write(json.dumps({"sentence": s}) + "\n")
        for name, make, data_args in (("bert", tiny.bert, ["--data", txt]),
                                      ("llama", tiny.llama, ["--data", jl, "--text-field", "sentence"])):
            mdir = tiny.save(make(seed=8), tok, os.path.join(d, name))
            out = os.path.join(d, name + "-out")
            r = subprocess.run([py, "-m", "tilejit.calibrate", "--model", mdir, "--sparsity", "0.5", "--g", "32",
                                "--out", out, "--num-samples", "32", "--max-seq-len", "24", "--profile-samples", "8",
                                "--evaluate", "8", "--eval-data", txt] + data_args,
                               capture_output=True, text=True, env=env, timeout=600)
            ok = r.returncode == 0
            summary = json.loads(r.stdout.strip().splitlines()[-1]) if ok else {}
            check(ok and abs(summary["density"] - 0.5) < 0.03 and "quality" in summary,
                  "CLI on the tiny %s: exit %d, density %s, quality %s%s" % (
                      name, r.returncode, summary.get("density"), summary.get("quality"),
                      "" if ok else ": " + r.stderr[-2000:]))
            files = sorted(os.listdir(out)) if os.path.isdir(out) else []
            check(all(f in files for f in ("pattern.json", "model.safetensors", "config.json", "report.json",
                                           "summary.json")), "CLI wrote %s" % files)
        r = subprocess.run([py, "-m", "tilejit.calibrate", "--model", os.path.join(d, "bert"), "--sparsity", "0.5",
                            "--out", os.path.join(d, "x"), "--data", os.path.join(d, "missing.txt")],
                           capture_output=True, text=True, env=env)
        check(r.returncode == 1 and "missing.txt" in r.stderr and len(r.stderr.strip().splitlines()) == 1,
              "CLI: a missing data file is one clear error: %s" % r.stderr.strip()[-300:])


LINEARS = r"^encoder\.layer\.[0-9]+\.(attention\.(self\.(query|key|value)|output\.dense)|intermediate\.dense|output\.dense)$"


def test_statistics_file(tok):
    """tilejit.torch.statistics writes the file `tilejit prune --calibration` reads: the C command
    prunes the saved model with it."""
    exe = os.environ.get("TJ_TILEJIT") or os.path.join(ROOT, "build", "cli", "tilejit")
    if not os.path.exists(exe):
        print("skip: no tilejit command for the statistics file check")
        return
    m = tiny.bert(seed=6)
    with tempfile.TemporaryDirectory() as d:
        tiny.save(m, tok, d)
        st = os.path.join(d, "stats.safetensors")
        stats = tjt.statistics(m, bert_batches(tok, 64), st, num_samples=64, progress=quiet)
        h, tokens = stats["encoder.layer.0.intermediate.dense"]
        check(h.shape == (65, 65) and tokens == int(h[-1, -1]) and tokens > 0,
              "statistics: H [k+1, k+1] with the token count in its corner (%d tokens)" % tokens)
        r = subprocess.run([exe, "prune", "--weights", os.path.join(d, "model.safetensors"), "--calibration", st,
                            "--sparsity", "0.5", "--g", "32", "--layers", LINEARS, "-o", os.path.join(d, "p.json"),
                            "--pruned-weights", os.path.join(d, "pw.safetensors")], capture_output=True, text=True)
        n = len(json.load(open(os.path.join(d, "p.json")))["layers"]) if r.returncode == 0 else 0
        check(r.returncode == 0 and n == 12, "tilejit prune --calibration on the statistics file: exit %d, %d layers %s"
              % (r.returncode, n, r.stderr.strip()[-300:]))


def main():
    tok = tiny.tokenizer()
    test_family("bert", tiny.bert, bert_batches, tok)
    test_family("llama", tiny.llama, llama_batches, tok)
    test_padding(tok)
    test_options(tok)
    test_bad_input(tok)
    test_cli(tok)
    test_statistics_file(tok)
    print("%d failures" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
