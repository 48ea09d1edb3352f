#!/usr/bin/env python3
"""Per-call overhead of tilejit.torch against a direct C call of the same layer.

Two layers: a real one (all-MiniLM-L6-v2's encoder.layer.0.intermediate.dense, 1536 × 384, pruned
alone to --sparsity; random weights if the model is absent) and a tiny one (16 × 16, random),
where the kernel takes ~1 µs so the overhead stands out of the noise. Each is saved as pattern +
safetensors; the C
program build/bench/call_latency times tj_linear_ex on it (DLTensors built once), and this script
times, in the same process setting (backend cpu, same threads), TWLinear(x) (the eager path),
TWLinear(x, out=y), torch.ops.tilejit.linear (through PyTorch's dispatcher) and nn.Linear on the
masked dense weight. Medians of 21 repeats of ~20 ms each; overhead = PyTorch call − C call.

usage: .venv/bin/python bench/torch_overhead.py [--m 1] [--threads 1] [--build build]
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def per_call(fn, repeats=21, target=0.02):
    for _ in range(200):
        fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < target:
        fn()
        n += 1
    ts = []
    for _ in range(repeats):
        a = time.perf_counter()
        for _ in range(n):
            fn()
        ts.append((time.perf_counter() - a) / n * 1e9)
    ts.sort()
    return ts[len(ts) // 2], ts[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--m", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=os.path.join(ROOT, "default-model", "all-MiniLM-L6-v2", "model.safetensors"))
    a = ap.parse_args()
    os.environ.setdefault("TILEJIT_LIBRARY", os.path.join(a.build, "libtilejit.so"))
    import json
    import numpy as np
    import torch
    import tilejit
    import tilejit.torch as tjt
    from tilejit import safetensors
    torch.set_num_threads(a.threads)
    print("torch %s, M = %d, %d thread(s) (tilejit and PyTorch), sparsity %.2f; times per call in ns, "
          "median (min) of 21 repeats" % (torch.__version__, a.m, a.threads, a.sparsity))
    print("%-34s %-46s %16s %12s" % ("layer", "call", "median (min)", "overhead"))
    name = "encoder.layer.0.intermediate.dense"
    rng = np.random.default_rng(0)
    if os.path.exists(a.model):
        t = safetensors.load(a.model)
        cases = [("MiniLM " + name.replace("encoder.layer.", "L"), name, t[name + ".weight"], t[name + ".bias"])]
    else:
        cases = [("random 1536 x 384", name, rng.standard_normal((1536, 384)), rng.standard_normal(1536))]
    cases.append(("random 16 x 16", "tiny", rng.standard_normal((16, 16)), rng.standard_normal(16)))
    for label, lname, w, b in cases:
        w, b = np.array(w, np.float32), np.array(b, np.float32)
        n, k = w.shape
        with tilejit.Context(backend="reference") as c:
            pattern = c.prune({lname: w}, a.sparsity, g=min(128, n))
        with tempfile.TemporaryDirectory() as d:
            pp, wp = os.path.join(d, "p.json"), os.path.join(d, "w.safetensors")
            json.dump(pattern, open(pp, "w"))
            safetensors.save(wp, {lname + ".weight": w, lname + ".bias": b})
            exe = os.path.join(a.build, "bench", "call_latency")
            out = subprocess.run([exe, pp, wp, lname, str(a.m), "cpu", str(a.threads)], capture_output=True, text=True)
            if out.returncode:
                sys.exit("call_latency failed: " + out.stderr)
            f = out.stdout.split()
            c_med, c_min = float(f[2]), float(f[4])
        lin = torch.nn.Linear(k, n)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(b))
        tw = tjt.TWLinear.from_linear(lin, layer=pattern["layers"][0], backend="cpu", threads=a.threads)
        dense = torch.nn.Linear(k, n)
        with torch.no_grad():
            dense.weight.copy_(tw.masked_weight())
            dense.bias.copy_(lin.bias)
        x = torch.randn(a.m, k)
        y = torch.empty(a.m, n)
        op = torch.ops.tilejit.linear
        h = tw.handle
        rows = [("C: tj_linear_ex (bench/call_latency)", (c_med, c_min))]
        with torch.no_grad():
            ref = dense(x)
            assert float((tw(x) - ref).abs().max()) <= 1e-4 * max(1.0, float(ref.abs().max()))
            rows.append(("TWLinear(x)  (eager)", per_call(lambda: tw(x))))
            rows.append(("TWLinear(x, out=y)", per_call(lambda: tw(x, out=y))))
            rows.append(("torch.ops.tilejit.linear(x, h)  (dispatcher)", per_call(lambda: op(x, h))))
            rows.append(("nn.Linear on W*mask (PyTorch dense)", per_call(lambda: dense(x))))
        for i, (call, (med, mn)) in enumerate(rows):
            over = "%+.0f" % (med - c_med) if 0 < i < 4 else ""
            print("%-34s %-46s %8.0f (%5.0f) %12s" % (label if i == 0 else "", call, med, mn, over))


if __name__ == "__main__":
    main()
