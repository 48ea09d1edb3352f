"""Calibrated pruning end to end (python -m tilejit.calibrate → tilejit prune --calibration):
on a tiny random BERT (default) or the real default model (TJ_CALIB_REAL=1, suite 'quality').
Checks the density reached, the pattern and weights files, the profile's shape, that the
rebuild changed the kept weights and refitted the biases, that the statistics file matches the
model's activations, and that the calibrated model agrees with the dense one better than the
plain magnitude pruner's. Exit 77 (skip) without NumPy or Debian's fortunes."""
import json
import os
import subprocess
import sys
import tempfile

try:
    import numpy as np
except ImportError:
    print("numpy is not installed: skipping")
    sys.exit(77)
if not os.path.exists("/usr/share/games/fortunes/fortunes"):
    print("Debian's fortunes package is not installed (scripts/install-deps): skipping")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
from tilejit import bert, calibrate, safetensors  # noqa: E402

TJ = os.environ.get("TJ_TILEJIT", os.path.join(ROOT, "build", "cli", "tilejit"))
failures = 0


def check(cond, msg):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", msg)
    else:
        print("ok:", msg)


def tiny_model(d, seed=1):
    """A 2-block BERT (hidden 48, 4 heads, intermediate 96) with a letter vocabulary, random
    weights with per-feature scales (so that features differ in importance, as in trained ones)."""
    rng = np.random.default_rng(seed)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"] + letters + ["##" + c for c in letters] + list(".,;:!?'\"-()")
    with open(os.path.join(d, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    H, I, L = 48, 96, 2
    cfg = {"hidden_size": H, "num_attention_heads": 4, "intermediate_size": I, "num_hidden_layers": L,
           "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "vocab_size": len(vocab)}
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)

    def lin(n, k):
        scale = np.exp(rng.normal(0, 0.7, k))
        return (rng.normal(0, 1, (n, k)) * scale / np.sqrt(k)).astype(np.float32), rng.normal(0, 0.1, n).astype(np.float32)

    w = {"embeddings.word_embeddings.weight": rng.normal(0, 1, (len(vocab), H)).astype(np.float32),
         "embeddings.position_embeddings.weight": rng.normal(0, 0.3, (512, H)).astype(np.float32),
         "embeddings.token_type_embeddings.weight": rng.normal(0, 0.1, (2, H)).astype(np.float32),
         "embeddings.LayerNorm.weight": np.ones(H, np.float32), "embeddings.LayerNorm.bias": np.zeros(H, np.float32)}
    for i in range(L):
        p = "encoder.layer.%d." % i
        for name, (n, k) in (("attention.self.query", (H, H)), ("attention.self.key", (H, H)),
                             ("attention.self.value", (H, H)), ("attention.output.dense", (H, H)),
                             ("intermediate.dense", (I, H)), ("output.dense", (H, I))):
            w[p + name + ".weight"], w[p + name + ".bias"] = lin(n, k)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            w[p + ln + ".weight"] = np.ones(H, np.float32)
            w[p + ln + ".bias"] = np.zeros(H, np.float32)
    safetensors.save(os.path.join(d, "model.safetensors"), w)
    return cfg


def embed_cos(model_dir, weights_path, seqs, dense):
    m = bert.Bert.from_dir(model_dir)
    m.set_weights({k: v for k, v in safetensors.load(weights_path).items()})
    return float(np.mean(np.sum(m.embed_batch(seqs) * dense, 1)))


def main():
    real = os.environ.get("TJ_CALIB_REAL") == "1"
    tmp = tempfile.mkdtemp(prefix="tj-calib-")
    if real:
        mdir = os.path.join(ROOT, "default-model", "all-MiniLM-L6-v2")
        if not os.path.exists(os.path.join(mdir, "model.safetensors")):
            print("the default model is missing (scripts/default-model): skipping")
            return 77
        sparsity, g, args = 0.5, "128", []
    else:
        mdir = os.path.join(tmp, "tiny")
        os.makedirs(mdir)
        tiny_model(mdir)
        sparsity, g, args = 0.5, "16", ["--steps", "8", "--measure", "2,4,6", "--calib-sentences", "48",
                                        "--profile-sentences", "6"]
    out = os.path.join(tmp, "out")
    rc = calibrate.main(["--model", mdir, "--out", out, "--sparsity", str(sparsity), "--g", g, "--tilejit", TJ] + args)
    check(rc == 0, "calibrate ran")
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    check(abs(summary["density"] - (1 - sparsity)) < 0.02, "density %.4f ≈ %.2f" % (summary["density"], 1 - sparsity))
    with open(os.path.join(out, "profile.json")) as f:
        prof = json.load(f)
    names = bert.linear_names(bert.Bert.from_dir(mdir).c)
    check([l["name"] for l in prof["layers"]] == names, "profile has every layer in forward order")
    check(all(len(l["loss"]) == len(prof["densities"]) and l["loss"][-1] == 0 and
              all(a >= b for a, b in zip(l["loss"], l["loss"][1:])) for l in prof["layers"]),
          "profile losses: one per density, non-increasing, 0 when dense")
    check(prof["layers"][0]["loss"][0] > 0, "pruning a layer away costs something (%.4f)" % prof["layers"][0]["loss"][0])

    dense_w = safetensors.load(os.path.join(mdir, "model.safetensors"))
    pruned = safetensors.load(os.path.join(out, "pruned.safetensors"))
    masks = _masks(os.path.join(out, "pattern.json"))
    changed = sum(int(np.any(pruned[n + ".weight"][masks[n]] != dense_w[n + ".weight"][masks[n]])) for n in names)
    zeros = all(np.all(pruned[n + ".weight"][~masks[n]] == 0) for n in names)
    biases = sum(int(np.any(pruned[n + ".bias"] != dense_w[n + ".bias"])) for n in names)
    check(changed == len(names), "kept weights rebuilt in %d of %d layers" % (changed, len(names)))
    check(zeros, "weights outside the pattern are zero")
    check(biases == len(names), "biases refitted in %d of %d layers" % (biases, len(names)))

    # statistics: H of the first query layer equals X̃ᵀX̃ of its input, recomputed here
    st = safetensors.load(os.path.join(out, "stats-dense.safetensors"))
    m = bert.Bert.from_dir(mdir, dtype=np.float64)
    tok = bert.WordPiece(os.path.join(mdir, "vocab.txt"))
    _, cal, _ = bert.corpus_split(n_calib=summary["calibration_sentences"], n_profile=summary["profile_sentences"])
    x, _ = m.embeddings([tok.encode(s) for s in cal])
    xt = np.hstack([x, np.ones((x.shape[0], 1))])
    h = st["encoder.layer.0.attention.self.query.hessian"]
    rel = np.abs(h - xt.T @ xt).max() / np.abs(xt.T @ xt).max()
    check(rel < 1e-5 and int(st["encoder.layer.0.attention.self.query.tokens"][0]) == x.shape[0],
          "statistics file: H = X̃ᵀX̃ of the layer's input (rel. diff %.1e), token count" % rel)

    # cross statistics: X̃ᵀX̃_ref in float64, rows from x, columns from xref, corner = tokens
    rng = np.random.default_rng(5)
    xa, xb = rng.standard_normal((300, 7)).astype(np.float32), rng.standard_normal((300, 7)).astype(np.float32)
    ga = calibrate.cross_gram(xa, xb, chunk=128)
    ta, tb = (np.hstack([v.astype(np.float64), np.ones((300, 1))]) for v in (xa, xb))
    rel = np.abs(ga - ta.T @ tb).max() / np.abs(ta.T @ tb).max()
    check(rel < 1e-5 and ga[7, 7] == 300, "cross statistics = X̃ᵀX̃_ref (rel. diff %.1e)" % rel)
    check(np.allclose(calibrate.cross_gram(xa, xa), calibrate.gram(xa)), "cross statistics of x with itself = H")
    try:
        calibrate.cross_gram(xa, xb[:10])
        check(False, "cross statistics of inputs with different token counts must fail")
    except ValueError:
        pass

    wpath = os.path.join(mdir, "model.safetensors")
    # the in-process pruner (tj_prune_calibrated_layers and _sweep_layer through ctypes, as the
    # sequential prune and the profile use it) gives what `tilejit prune` gives from files: the
    # q/k/v layers with H of their input and cross statistics against a perturbed input
    grp = sorted(names[:3])  # natural name order, as tilejit prune orders them
    k = dense_w[grp[0] + ".weight"].shape[1]
    xq = rng.standard_normal((200, k)).astype(np.float32) * np.exp(rng.normal(0, 0.7, k)).astype(np.float32)
    hq, gq = calibrate.gram(xq), calibrate.cross_gram(xq, xq + 0.1 * rng.standard_normal((200, k)).astype(np.float32))
    spath = os.path.join(tmp, "stats-qkv.safetensors")
    calibrate.save_stats(spath, calibrate.stats_tensors(grp, hq, 200, gq), "tiny")
    r = subprocess.run([TJ, "prune", "--weights", wpath, "--calibration", spath, "--layers", calibrate.layer_regex(grp),
                        "--g", g, "--sparsity", "0.5", "-o", os.path.join(tmp, "qkv.json"), "--pruned-weights",
                        os.path.join(tmp, "qkv.safetensors"), "--quiet"], capture_output=True, text=True)
    pr = calibrate.Pruner(int(g))
    got, rebuilt = pr.prune([(n, dense_w[n + ".weight"], dense_w[n + ".bias"], hq, gq, 200, 0.5) for n in grp])
    with open(os.path.join(tmp, "qkv.json")) as f:
        want = json.load(f)["layers"] if r.returncode == 0 else None
    qkv = safetensors.load(os.path.join(tmp, "qkv.safetensors")) if r.returncode == 0 else {}
    check(r.returncode == 0 and got == want and
          all(np.array_equal(rebuilt[i][0], qkv[n + ".weight"]) and np.array_equal(rebuilt[i][1], qkv[n + ".bias"])
              for i, n in enumerate(grp)),
          "in-process prune = tilejit prune --calibration (pattern, weights, biases of %d layers)" % len(grp))
    # ... and with residual statistics (NAME.residual) on the attention-output layer
    ao = "encoder.layer.0.attention.output.dense"
    ka, na = dense_w[ao + ".weight"].shape[1], dense_w[ao + ".weight"].shape[0]
    xo = rng.standard_normal((200, ka)).astype(np.float32)
    ho, go = calibrate.gram(xo), calibrate.cross_gram(xo, xo + 0.1 * rng.standard_normal((200, ka)).astype(np.float32))
    ro = calibrate.resid_gram(xo, 0.3 * rng.standard_normal((200, na)).astype(np.float32))
    tens = calibrate.stats_tensors([ao], ho, 200, go)
    tens[ao + ".residual"] = ro
    calibrate.save_stats(spath, tens, "tiny")
    r = subprocess.run([TJ, "prune", "--weights", wpath, "--calibration", spath, "--layers", calibrate.layer_regex([ao]),
                        "--g", g, "--sparsity", "0.5", "-o", os.path.join(tmp, "ao.json"), "--pruned-weights",
                        os.path.join(tmp, "ao.safetensors"), "--quiet"], capture_output=True, text=True)
    got_r, reb_r = pr.prune([(ao, dense_w[ao + ".weight"], dense_w[ao + ".bias"], ho, go, 200, 0.5, ro)])
    _, reb_n = pr.prune([(ao, dense_w[ao + ".weight"], dense_w[ao + ".bias"], ho, go, 200, 0.5)])
    ar = safetensors.load(os.path.join(tmp, "ao.safetensors")) if r.returncode == 0 else {}
    check(r.returncode == 0 and np.array_equal(reb_r[0][0], ar[ao + ".weight"]) and
          np.array_equal(reb_r[0][1], ar[ao + ".bias"]) and not np.array_equal(reb_r[0][1], reb_n[0][1]),
          "in-process prune with residual statistics = tilejit prune with NAME.residual, and differs without")
    r = subprocess.run([TJ, "prune", "--weights", wpath, "--calibration", os.path.join(out, "stats-dense.safetensors"),
                        "--layers", calibrate.layer_regex(grp[:1]), "--g", g, "--sweep-out",
                        os.path.join(tmp, "sweep.safetensors"), "--sweep-steps", "8", "--sweep-weights", "2,5",
                        "--quiet"], capture_output=True, text=True)
    sw = safetensors.load(os.path.join(tmp, "sweep.safetensors")) if r.returncode == 0 else {}
    n0 = grp[0]
    errs, ws = pr.sweep(n0, dense_w[n0 + ".weight"], dense_w[n0 + ".bias"], st[n0 + ".hessian"],
                        int(st[n0 + ".tokens"][0]), 8, [2, 5])
    check(r.returncode == 0 and np.array_equal(errs, sw[n0 + ".error"]) and sorted(ws) == [2, 5] and
          all(np.array_equal(ws[j][0], sw["d%d/%s.weight" % (j, n0)]) and np.array_equal(ws[j][1], sw["d%d/%s.bias" % (j, n0)])
              for j in (2, 5)), "in-process sweep = tilejit prune --sweep-out")
    bad = hq.copy()
    bad[k, k] = 199
    try:
        pr.prune([(grp[0], dense_w[grp[0] + ".weight"], dense_w[grp[0] + ".bias"], bad, None, 200, 0.5)])
        check(False, "statistics whose token count disagrees must fail in process too")
    except RuntimeError as e:
        check("tokens" in str(e), "in process, bad statistics: %s" % e)

    # residual statistics: X̃ᵀΔR in float64, last row the column sums of ΔR
    dr = rng.standard_normal((300, 5)).astype(np.float32)
    gr = calibrate.resid_gram(xa, dr, chunk=128)
    want = ta.T @ dr.astype(np.float64)
    rel = np.abs(gr - want).max() / np.abs(want).max()
    check(gr.shape == (8, 5) and rel < 1e-5, "residual statistics = X̃ᵀΔR (rel. diff %.1e)" % rel)

    # LayerNorm refit: recovers the weight and bias that map LN(z) onto a target exactly
    lm = bert.Bert.from_dir(mdir, dtype=np.float64)
    z = rng.standard_normal((400, 48)) * 3 + 1
    w_true, b_true = rng.uniform(0.5, 2, 48), rng.normal(0, 0.5, 48)
    ln_name = "encoder.layer.0.output.LayerNorm"
    target = bert.layer_norm(z, w_true, b_true, lm.c["layer_norm_eps"])
    upd = calibrate.refit_layer_norm(lm, ln_name, z, target)
    err_w = np.abs(upd[ln_name + ".weight"] - w_true).max()
    err_b = np.abs(upd[ln_name + ".bias"] - b_true).max()
    check(err_w < 1e-4 and err_b < 1e-4 and np.array_equal(lm.w[ln_name + ".bias"], upd[ln_name + ".bias"]),
          "LayerNorm refit recovers weight and bias (max err %.1e, %.1e) and sets them" % (err_w, err_b))

    # latency budget through the CLI: a made-up time table (ms = density · n · k / 1e4)
    for l in prof["layers"]:
        l["time_ms"] = [d * l["n"] * l["k"] / 1e4 for d in prof["densities"]]
    tprof = os.path.join(tmp, "profile-time.json")
    with open(tprof, "w") as f:
        json.dump(prof, f)
    full = sum(l["time_ms"][-1] for l in prof["layers"])
    r = subprocess.run([TJ, "prune", "--weights", wpath, "--calibration", os.path.join(out, "stats-dense.safetensors"),
                        "--layers", calibrate.layer_regex(names), "--g", g, "--allocation", "measured", "--profile", tprof,
                        "--budget-ms", "%g" % (0.4 * full), "-o", os.path.join(tmp, "lat.json"), "--quiet"],
                       capture_output=True, text=True)
    line = [x for x in r.stdout.splitlines() if x.startswith("latency:")]
    used = float(line[0].split()[1]) if line else float("inf")
    check(r.returncode == 0 and used <= 0.4 * full + 1e-9 and used > 0.3 * full,
          "--budget-ms %.3f: the allocation uses %.3f ms of the table's times" % (0.4 * full, used))
    # bad inputs through the CLI: statistics of another model, a density outside [0, 1]
    other = os.path.join(tmp, "other-stats.safetensors")
    safetensors.save(other, {names[0] + ".hessian": np.eye(7), names[0] + ".tokens": np.array([1], dtype=np.int64)})
    r = subprocess.run([TJ, "prune", "--weights", wpath, "--calibration", other, "--layers", calibrate.layer_regex(names[:1]),
                        "--sparsity", "0.5", "-o", os.path.join(tmp, "x.json")], capture_output=True, text=True)
    check(r.returncode == 1 and "another model" in r.stderr, "statistics of another model: %s" % r.stderr.strip())
    bad = dict(prof, densities=[1.5] + prof["densities"][1:])
    with open(tprof, "w") as f:
        json.dump(bad, f)
    r = subprocess.run([TJ, "prune", "--weights", wpath, "--calibration", os.path.join(out, "stats-dense.safetensors"),
                        "--allocation", "measured", "--profile", tprof, "--sparsity", "0.5", "--layers",
                        calibrate.layer_regex(names), "-o", os.path.join(tmp, "x.json")], capture_output=True, text=True)
    check(r.returncode == 1 and "outside [0, 1]" in r.stderr, "density outside [0, 1]: %s" % r.stderr.strip())

    # quality: calibrated vs the plain global magnitude pruner at the same sparsity
    ev, _, _ = bert.corpus_split()
    seqs = [tok.encode(s) for s in ev[:60 if not real else 600]]
    dense = bert.Bert.from_dir(mdir).embed_batch(seqs)
    plain = os.path.join(tmp, "plain.safetensors")
    subprocess.run([TJ, "prune", "--weights", os.path.join(mdir, "model.safetensors"), "--sparsity", str(sparsity),
                    "--g", g, "--layers", calibrate.layer_regex(names), "-o", os.path.join(tmp, "plain.json"),
                    "--pruned-weights", plain], check=True, stdout=subprocess.DEVNULL)
    c_cal = embed_cos(mdir, os.path.join(out, "pruned.safetensors"), seqs, dense)
    c_plain = embed_cos(mdir, plain, seqs, dense)
    check(c_cal > c_plain, "embedding cosine to dense: calibrated %.4f > plain magnitude %.4f" % (c_cal, c_plain))
    if real:
        # measured 0.828 with the defaults (1,024 calibration sentences, dense target, residual
        # statistics and LayerNorm refit; bench/RESULTS.md, "Issue 16, fourth round"; the issue's
        # target 0.87 is not reached): a regression bound, above the second round's 0.814, not the target
        check(c_cal >= 0.82, "real model at 50 %%: cosine %.4f ≥ 0.82" % c_cal)
    print("%d failures" % failures)
    return 1 if failures else 0


def _masks(path):
    with open(path) as f:
        p = json.load(f)
    out = {}
    for l in p["layers"]:
        n, k, g = l["n"], l["k"], l["g"]
        cols = l.get("cols", list(range(n)))
        mk = np.zeros((n, k), dtype=bool)
        for t, rows in enumerate(l["tiles"]):
            if rows:
                mk[np.ix_(cols[t * g:(t + 1) * g], rows)] = True
        out[l["name"]] = mk
    return out


if __name__ == "__main__":
    sys.exit(main())
