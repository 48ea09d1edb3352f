#!/usr/bin/env python3
"""Whole-model speed of a sentence encoder with its linear layers on tilejit, against dense PyTorch
in the same run, at each thread count.

all-MiniLM-L6-v2 (transformers.BertModel) on a batch of --batch sentences, padded to the longest:
--sentences sample (default) repeats tilejit.data.SAMPLE_SENTENCES, sixteen short everyday
sentences (16 tokens each, as examples/torch_encoder.py), --sentences fortunes takes the first
--batch of the evaluation split of tilejit.data.corpus_split (longer: padded to 68). One forward pass of the
dense model and of the same model with its encoder's linear layers swapped by
tilejit.torch.sparsify, alternating, --runs timed passes each after two warm-up passes. For every
thread count the two are timed under the same torch.set_num_threads(t); tilejit follows
torch.get_num_threads() (sparsify's default), or runs --tilejit-threads when given. Prints per
thread count the medians (min-max) in ms, the ratio dense/tilejit of the medians, and at the end
how each side scales from the first thread count to the others.

--pattern/--weights: a pruned model (tilejit.calibrate's pattern.json and pruned
weights.safetensors); or --sparsity S to prune the encoder here (plain magnitude, one threshold).
sparsify fuses each GELU that follows a swapped layer into its kernel (fuse_activations, the
default); --no-fuse keeps PyTorch's GELU modules. --breakdown adds where a tilejit pass spends its
time: the swapped linear layers, summed by forward hooks, and everything else (attention,
LayerNorm, the GELUs when not fused, embeddings: PyTorch's).

usage: .venv/bin/python bench/torch_model.py --pattern P.json --weights W.safetensors
       [--model DIR] [--batch 128] [--sentences sample|fortunes] [--threads 1,2] [--runs 7]
       [--tilejit-threads N] [--no-fuse] [--breakdown]
(run it as `flock /tmp/tilejit-bench.lock chrt -f 10 ...` on a shared machine)
"""
import argparse
import copy
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def forward_ms(model, batch):
    import torch
    t0 = time.perf_counter()
    with torch.no_grad():
        model(**batch)
    return 1e3 * (time.perf_counter() - t0)


def spread(ts):
    return "%8.1f (%.1f-%.1f)" % (statistics.median(ts), min(ts), max(ts))


def linear_share(model, batch, runs):
    """Median ms of a forward pass and of the part spent inside the swapped layers."""
    import tilejit.torch as tjt
    acc = [0.0]
    starts = {}

    def pre(mod, args):
        starts[id(mod)] = time.perf_counter()

    def post(mod, args, out):
        acc[0] += time.perf_counter() - starts.pop(id(mod))

    hooks = []
    for m in model.modules():
        if isinstance(m, tjt.TWLinear):
            hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    tot, lin = [], []
    for _ in range(runs):
        acc[0] = 0.0
        tot.append(forward_ms(model, batch))
        lin.append(1e3 * acc[0])
    for h in hooks:
        h.remove()
    return statistics.median(tot), statistics.median(lin)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "default-model", "all-MiniLM-L6-v2"))
    ap.add_argument("--pattern")
    ap.add_argument("--weights")
    ap.add_argument("--sparsity", type=float)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--sentences", choices=("sample", "fortunes"), default="sample")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tilejit-threads", type=int, default=None,
                    help="tilejit's threads (default: follow torch.get_num_threads())")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--no-fuse", action="store_true", help="keep the GELU modules (sparsify fuse_activations=False)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    if (a.pattern is None) == (a.sparsity is None):
        ap.error("give --pattern (with --weights) or --sparsity")
    os.environ.setdefault("TILEJIT_LIBRARY", os.path.join(a.build, "libtilejit.so"))
    import torch
    import transformers
    import tilejit.torch as tjt
    from tilejit.data import SAMPLE_SENTENCES, corpus_split

    threads = [int(t) for t in a.threads.split(",")]
    tok = transformers.AutoTokenizer.from_pretrained(a.model)
    dense = transformers.BertModel.from_pretrained(a.model).eval()
    if a.sentences == "sample":
        sentences = list(SAMPLE_SENTENCES * (a.batch // len(SAMPLE_SENTENCES) + 1))[:a.batch]
    else:
        sentences = corpus_split()[0][:a.batch]
    batch = tok(sentences, padding=True, return_tensors="pt")
    sparse = copy.deepcopy(dense)
    kw = {"fuse_activations": not a.no_fuse}
    if a.tilejit_threads is not None:
        kw["threads"] = a.tilejit_threads
    if a.pattern:
        rep = tjt.sparsify(sparse, pattern=a.pattern, weights=a.weights, **kw)
    else:
        rep = tjt.sparsify(sparse, sparsity=a.sparsity, layers=r"^encoder\.", **kw)
    kept = sum(d * n * k for _, _, n, k, d in rep.swapped) / max(1, sum(n * k for _, _, n, k, _ in rep.swapped))
    print("all-MiniLM-L6-v2, batch %d sentences (%d tokens, padded to %d each = M %d); %d layers on tilejit, "
          "%.1f %% of their weights kept (%s), %d activations fused; torch %s; tilejit threads: %s"
          % (a.batch, int(batch["attention_mask"].sum()), batch["input_ids"].shape[1], batch["input_ids"].numel(),
             len(rep.swapped), 100 * kept, a.pattern or "sparsity %.2f, magnitude" % a.sparsity, len(rep.fused),
             torch.__version__, a.tilejit_threads or "torch.get_num_threads()"))
    with torch.no_grad():
        ref = dense(**batch).last_hidden_state
        masked = tjt.dense_copy(sparse)(**batch).last_hidden_state
        got = sparse(**batch).last_hidden_state
    err = float((got - masked).abs().max() / masked.abs().max())
    print("check: tilejit vs the same pruned weights run dense: max relative error %.2e" % err)
    if not err < 1e-4:
        sys.exit("torch_model: tilejit's output differs from the dense computation (%.2e)" % err)
    del ref
    print("%-8s %-26s %-26s %8s" % ("threads", "PyTorch dense ms", "tilejit ms", "ratio"))
    med = {}
    for t in threads:
        torch.set_num_threads(t)
        for _ in range(2):
            forward_ms(dense, batch)
            forward_ms(sparse, batch)
        td, ts = [], []
        for _ in range(a.runs):
            td.append(forward_ms(dense, batch))
            ts.append(forward_ms(sparse, batch))
        med[t] = (statistics.median(td), statistics.median(ts))
        print("%-8d %-26s %-26s %7.2fx" % (t, spread(td), spread(ts), med[t][0] / med[t][1]), flush=True)
        if a.breakdown:
            tot, lin = linear_share(sparse, batch, a.runs)
            print("         tilejit pass %.1f ms: %d swapped layers %.1f ms, the rest (PyTorch) %.1f ms"
                  % (tot, len(rep.swapped), lin, tot - lin), flush=True)
    t0 = threads[0]
    for t in threads[1:]:
        print("scaling %d -> %d threads: PyTorch dense %.2fx, tilejit %.2fx"
              % (t0, t, med[t0][0] / med[t][0], med[t0][1] / med[t][1]))


if __name__ == "__main__":
    main()
