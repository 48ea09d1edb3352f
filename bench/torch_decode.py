#!/usr/bin/env python3
"""Greedy LLM decode with the block linears on tilejit, against dense PyTorch in the same run.

SmolLM2-135M-Instruct (a LLaMA: 30 blocks of q/k/v/o/gate/up/down linears, an lm_head tied to
the embeddings) loaded by transformers from its GGUF file (weights dequantised to fp32). The block
linears are swapped by tilejit.torch.sparsify: pruned here by magnitude (tw1, g 128, one global
threshold, --sparsity), or from --pattern/--weights; the lm_head stays dense (PyTorch). For each
precision (fp32; bf16: the same weights rounded, where the CPU has avx512_bf16 or AMX), batch
size and thread count, both models decode --tokens tokens greedily after the same prompt (its
prefill not timed), alternating, --runs times; tokens/s = batch × tokens / decode seconds.
Prints medians (min-max) and the ratio tilejit/dense of the medians, and checks the first step's
logits against the same pruned weights run dense in fp32 (tilejit's error at most PyTorch's own
at that precision) and how many greedy tokens equal the masked dense model's.

--breakdown: where a decode step's time goes in each model, timed by forward hooks inside real
decode steps: per kind of linear (q_proj ... down_proj, lm_head) µs per call and GB/s = the
weight bytes a call must read (kept weights for tilejit, all for dense) / its time, and the rest
(attention, norms, SiLU, the cache, Python). Then per linear shape at M = batch, cycling through
the 30 layers of that shape (a working set that stays in a large cache): the C call alone
(tj_linear_ex through ctypes: the kernel and dispatch), the TWLinear call (plus the Python side)
and PyTorch's nn.Linear on the masked weight; beside the read bandwidth of a 512 MB sum.

usage: .venv/bin/python bench/torch_decode.py MODEL_DIR [--gguf-file F] [--batch 1,8]
       [--threads 1,2] [--dtypes fp32,bf16] [--tokens 32] [--runs 3] [--sparsity 0.5]
       [--pattern P --weights W] [--breakdown]
(run it as `flock /tmp/tilejit-bench.lock chrt -f 10 ...` on a shared machine)
"""
import argparse
import copy
import ctypes
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

BLOCK_LINEARS = r"model\.layers\.\d+\.(self_attn|mlp)\."
PROMPT = ("Write a short story about a lighthouse keeper who finds a message in a bottle, "
          "and explain what the message says.")


def has_bf16():
    flags = open("/proc/cpuinfo").read()
    return " avx512_bf16" in flags or " amx_bf16" in flags


def decode(model, ids, steps, timing=None):
    """Greedy decode of `steps` tokens after the prompt ids [batch × p]: (decode seconds,
    tokens [batch × steps], first decode step's logits). timing["on"] is set while the decode
    steps run (not the prefill)."""
    import torch
    import transformers
    with torch.no_grad():
        out = model(input_ids=ids, cache=transformers.DynamicCache(), use_cache=True, logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        toks, first = [], None
        if timing is not None:
            timing["on"] = True
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=nxt, cache=out.cache, use_cache=True)
            if first is None:
                first = out.logits[:, -1].float()
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            toks.append(nxt)
        t = time.perf_counter() - t0
        if timing is not None:
            timing["on"] = False
    return t, torch.cat(toks, 1), first


def spread(ts):
    return "%7.1f (%.1f-%.1f)" % (statistics.median(ts), min(ts), max(ts))


def step_breakdown(model, ids, steps):
    """Per decode step: ms in total, and per kind of linear (q_proj ... down_proj, lm_head) the
    calls per step and µs per call, timed by forward hooks inside real decode steps (weights
    streamed from memory as decode does)."""
    import torch
    import tilejit.torch as tjt
    acc, calls, start, timing = {}, {}, {}, {"on": False}

    def pre(m, args):
        start[id(m)] = time.perf_counter()

    def post_for(kind):
        def post(m, args, out):
            t = time.perf_counter() - start.pop(id(m))
            if timing["on"]:
                acc[kind] = acc.get(kind, 0.0) + t
                calls[kind] = calls.get(kind, 0) + 1
        return post

    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, (tjt.TWLinear, torch.nn.Linear)):
            kind = name.rsplit(".", 1)[-1]
            hooks += [m.register_forward_pre_hook(pre), m.register_forward_hook(post_for(kind))]
    decode(model, ids, 2)  # warm
    t, _, _ = decode(model, ids, steps, timing)
    for h in hooks:
        h.remove()
    return 1e3 * t / steps, {k: (calls[k] / steps, 1e6 * acc[k] / calls[k]) for k in acc}


def print_breakdown(dense, tj, ids, steps, esize):
    """Where a decode step goes, dense beside tilejit; GB/s = weight bytes read per call / time."""
    import tilejit.torch as tjt
    sd, kd = step_breakdown(dense, ids, steps)
    st, kt = step_breakdown(tj, ids, steps)
    size = {}
    for name, m in tj.named_modules():
        if hasattr(m, "in_features"):
            kind = name.rsplit(".", 1)[-1]
            d = m.density if isinstance(m, tjt.TWLinear) else 1.0
            n0, d0 = size.get(kind, (0, 0.0))
            size[kind] = (n0 + 1, d0 + d * m.in_features * m.out_features)
    print("      in decode (forward hooks): step %.2f ms dense, %.2f ms tilejit; per call us (GB/s):" % (sd, st))
    rest_d, rest_t = sd, st
    for kind in kd:
        n, w = size[kind]
        dn = max(1, n)
        full = sum(m.in_features * m.out_features for nm, m in dense.named_modules()
                   if hasattr(m, "in_features") and nm.rsplit(".", 1)[-1] == kind) / dn
        cd, ud = kd[kind]
        ct, ut = kt.get(kind, (0, 0.0))
        rest_d -= cd * ud / 1e3
        rest_t -= ct * ut / 1e3
        print("        %-10s x%-4.0f dense %7.1f us (%5.1f GB/s)   tilejit %7.1f us (%5.1f GB/s, density %.2f)"
              % (kind, cd, ud, full * esize / ud / 1e3, ut, w / dn * esize / ut / 1e3, w / dn / full))
    print("        the rest (attention, norms, SiLU, cache, Python): dense %.2f ms, tilejit %.2f ms" % (rest_d, rest_t))


def per_call(fn, n):
    for _ in range(n):
        fn()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - t0) / n)
    return statistics.median(ts)


def shape_table(sparse, masked, batch, dtype):
    """Per linear shape: µs per call and GB/s of the C call, the TWLinear call and nn.Linear."""
    import torch
    import tilejit.torch as tjt
    from tilejit.torch import _PACK, _scratch
    import tilejit._lib as L
    groups = {}
    for name, m in sparse.named_modules():
        if isinstance(m, tjt.TWLinear):
            groups.setdefault(name.rsplit(".", 1)[-1], []).append((m, masked.get_submodule(name)))
    esize = 2 if dtype == torch.bfloat16 else 4
    code, bits = (L.kDLBfloat, 16) if dtype == torch.bfloat16 else (L.kDLFloat, 32)
    rows = []
    for kind, mods in groups.items():
        n, k = mods[0][0].out_features, mods[0][0].in_features
        x = torch.randn(batch, k).to(dtype)
        y = torch.empty(batch, n)
        raw = []
        for tw, _ in mods:
            fn, mp, _ = tw._bound.cpu or tw._bound.bind_cpu()
            buf = ctypes.create_string_buffer(_PACK.size)
            base = ctypes.addressof(buf)
            _PACK.pack_into(buf, 0, x.data_ptr(), L.kDLCPU, 0, 2, code, bits, 1, base + 96, base + 112, 0,
                            y.data_ptr(), L.kDLCPU, 0, 2, L.kDLFloat, 32, 1, base + 128, base + 144, 0,
                            batch, k, k, 1, batch, n, n, 1)
            raw.append((fn, mp, tw._bound.index, base, buf))

        def c_calls():
            for fn, mp, i, base, _ in raw:
                fn(mp, i, base, base + 48, 0, None)

        def tw_calls():
            for tw, _ in mods:
                tw(x)

        def dense_calls():
            for _, d in mods:
                d(x)
        with torch.no_grad():
            t_c = per_call(c_calls, 3) / len(mods)
            t_tw = per_call(tw_calls, 3) / len(mods)
            t_d = per_call(dense_calls, 3) / len(mods)
        kept = sum(tw.density for tw, _ in mods) / len(mods) * n * k
        rows.append((kind, n, k, kept / (n * k), t_c, t_tw, t_d, kept * esize, n * k * esize))
    del _scratch
    return rows


def read_bandwidth():
    import torch
    a = torch.ones(128 << 20)  # 512 MB
    a.sum()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        a.sum()
        ts.append(time.perf_counter() - t0)
    return a.numel() * 4 / statistics.median(ts) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--gguf-file", default="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--pattern")
    ap.add_argument("--weights")
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    os.environ.setdefault("TILEJIT_LIBRARY", os.path.join(a.build, "libtilejit.so"))
    import torch
    import transformers
    import tilejit.torch as tjt

    t0 = time.perf_counter()
    base = transformers.AutoModelForCausalLM.from_pretrained(a.model, gguf_file=a.gguf_file, dtype=torch.float32).eval()
    tok = transformers.AutoTokenizer.from_pretrained(a.model, gguf_file=a.gguf_file)
    load_s = time.perf_counter() - t0
    sparse = copy.deepcopy(base)
    if a.pattern:
        rep = tjt.sparsify(sparse, pattern=a.pattern, weights=a.weights)
        how = a.pattern
    else:
        rep = tjt.sparsify(sparse, sparsity=a.sparsity, layers=BLOCK_LINEARS)
        how = "magnitude-pruned here, tw1, sparsity %.2f" % a.sparsity
    pattern = next(m for m in sparse.modules() if isinstance(m, tjt.TWLinear))._bound.group.pattern
    kept = sum(d * n * k for _, _, n, k, d in rep.swapped)
    total = sum(n * k for _, _, n, k, _ in rep.swapped)
    head = base.lm_head.weight.numel()
    print("SmolLM2-135M-Instruct (%s, loaded in %.0f s); %d block linears on tilejit (%s), %.1f %% of their %d "
          "weights kept; lm_head %d weights dense (tied to the embeddings); torch %s, %s"
          % (a.gguf_file, load_s, len(rep.swapped), how, 100 * kept / total, total, head, torch.__version__,
             "CPU with bf16" if has_bf16() else "CPU without bf16"))
    print("weights a decode step reads: dense %.1f M, tilejit %.1f M (the lm_head is %.0f %% of tilejit's): "
          "a purely bandwidth-bound step could be at most %.2fx faster"
          % ((total + head) / 1e6, (kept + head) / 1e6, 100 * head / (kept + head), (total + head) / (kept + head)))
    masked32 = tjt.dense_copy(sparse)
    dtypes = [d for d in a.dtypes.split(",") if d]
    if "bf16" in dtypes and not has_bf16():
        print("bf16: skipped (the CPU has neither avx512_bf16 nor AMX)")
        dtypes.remove("bf16")
    ids1 = tok(PROMPT, return_tensors="pt")["input_ids"]
    print("prompt %d tokens, %d decode tokens per run, %d runs; tokens/s medians (min-max)" % (ids1.shape[1], a.tokens, a.runs))
    print("%-5s %5s %7s  %-24s %-24s %7s  %s" % ("dtype", "batch", "threads", "PyTorch dense tok/s", "tilejit tok/s",
                                                 "ratio", "tokens equal"))
    for dname in dtypes:
        dt = torch.bfloat16 if dname == "bf16" else torch.float32
        dense = base if dt == torch.float32 else copy.deepcopy(base).to(dt)
        if dt == torch.float32:
            tj = sparse
        else:
            tj = copy.deepcopy(base).to(dt)
            tjt.sparsify(tj, pattern=pattern)
        masked = tjt.dense_copy(tj)
        for b in [int(v) for v in a.batch.split(",")]:
            ids = ids1.repeat(b, 1)
            # the first decode step's logits against the pruned weights run dense in fp32: tilejit's
            # error at most PyTorch's own at this precision (bf16 rounds every layer's output)
            _, _, ref = decode(masked32, ids, 1)
            _, _, lt = decode(tj, ids, 1)
            _, _, lm = decode(masked, ids, 1)
            err, err_pt = (float((v - ref).abs().max() / ref.abs().max()) for v in (lt, lm))
            if not err <= max(1e-4, 1.5 * err_pt):
                sys.exit("torch_decode: tilejit's logits are off by %.2e relative (PyTorch %s: %.2e)" % (err, dname, err_pt))
            for t in [int(v) for v in a.threads.split(",")]:
                torch.set_num_threads(t)
                decode(dense, ids, 4)
                decode(tj, ids, 4)
                rd, rt = [], []
                for _ in range(a.runs):
                    td, _, _ = decode(dense, ids, a.tokens)
                    tt, toks, _ = decode(tj, ids, a.tokens)
                    rd.append(b * a.tokens / td)
                    rt.append(b * a.tokens / tt)
                _, mtoks, _ = decode(masked, ids, a.tokens)
                same = float((toks == mtoks).float().mean())
                print("%-5s %5d %7d  %-24s %-24s %6.2fx  %.0f %% of masked dense's (logits rel. err %.1e, "
                      "PyTorch's %.1e)" % (dname, b, t, spread(rd), spread(rt),
                                           statistics.median(rt) / statistics.median(rd), 100 * same, err, err_pt),
                      flush=True)
                if a.breakdown:
                    esize = 2 if dt == torch.bfloat16 else 4
                    print_breakdown(dense, tj, ids, a.tokens, esize)
                    print("      cycling through the 30 layers of each shape, M = %d (cache-resident here), us per "
                          "call (GB/s); read bandwidth of a 512 MB sum: %.1f GB/s:" % (b, read_bandwidth()))
                    for kind, n, k, d, tc, ttw, tden, bk, bd in shape_table(tj, masked, b, dt):
                        print("        %-10s %4d x %4d d %.2f  C call %6.1f us (%5.1f GB/s)  TWLinear %6.1f us  "
                              "nn.Linear %6.1f us (%5.1f GB/s)"
                              % (kind, n, k, d, 1e6 * tc, bk / tc / 1e9, 1e6 * ttw, 1e6 * tden, bd / tden / 1e9),
                              flush=True)


if __name__ == "__main__":
    main()
