#!/usr/bin/env python3
"""A PyTorch sentence encoder on tilejit: all-MiniLM-L6-v2 through Hugging Face transformers, its 36
encoder linear layers pruned tile-wise and swapped for tilejit's kernels by three lines, with the
model's speed before and after measured in this run (same inputs, same threads) and how the
embeddings compare.

usage: .venv/bin/python examples/torch_encoder.py [--model DIR] [--sparsity 0.75] [--batch 16]
       [--threads N] [--runs 10]
(scripts/install-torch makes .venv; scripts/default-model fetches the model; scripts/build builds
libtilejit.so, found as build/libtilejit.so of this checkout or through $TILEJIT_LIBRARY.)
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import transformers  # noqa: E402

from tilejit.data import SAMPLE_SENTENCES as SENTENCES  # noqa: E402
from tilejit.torch import sentence_embeddings as embed  # noqa: E402



def speed(model, batch, runs):
    """Median milliseconds per forward pass of the batch (after two warm-up passes)."""
    for _ in range(2):
        embed(model, batch)
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        embed(model, batch)
        ts.append(1e3 * (time.perf_counter() - t0))
    return sorted(ts)[len(ts) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "default-model", "all-MiniLM-L6-v2"))
    ap.add_argument("--sparsity", type=float, default=0.75)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    tok = transformers.AutoTokenizer.from_pretrained(a.model)
    model = transformers.BertModel.from_pretrained(a.model).eval()
    sentences = list(SENTENCES * (a.batch // len(SENTENCES) + 1))[:a.batch]
    batch = tok(sentences, padding=True, return_tensors="pt")
    tokens = int(batch["attention_mask"].sum())
    before = speed(model, batch, a.runs)
    dense_emb = embed(model, batch)

    # --- the three lines -------------------------------------------------------------------
    import tilejit.torch
    report = tilejit.torch.sparsify(model, sparsity=a.sparsity, layers=r"^encoder\.", threads=a.threads)
    print(report)
    # -----------------------------------------------------------------------------------------

    after = speed(model, batch, a.runs)
    emb = embed(model, batch)
    masked = tilejit.torch.dense_copy(model)  # the same pruned model, dense PyTorch kernels
    masked_ms = speed(masked, batch, a.runs)
    cos_masked = (emb * embed(masked, batch)).sum(1)
    cos_dense = (emb * dense_emb).sum(1)
    print()
    print("all-MiniLM-L6-v2, batch %d sentences (%d tokens, padded to %d), %d thread(s), median of %d runs:"
          % (a.batch, tokens, batch["input_ids"].shape[1], a.threads, a.runs))
    print("  before: PyTorch dense           %8.2f ms" % before)
    print("  after:  tilejit, %2.0f %% pruned    %8.2f ms   speedup %.2fx" % (100 * a.sparsity, after, before / after))
    print("  (PyTorch on the pruned weights kept dense: %.2f ms)" % masked_ms)
    print("  embeddings vs the same pruned model run dense: cosine min %.6f (the kernels are exact)"
          % float(cos_masked.min()))
    print("  embeddings vs the unpruned model: cosine mean %.3f (what pruning at %.0f %% costs this model)"
          % (float(cos_dense.mean()), 100 * a.sparsity))


if __name__ == "__main__":
    main()
