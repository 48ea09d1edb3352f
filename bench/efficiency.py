#!/usr/bin/env python3
"""The efficiency table of `tilejit bench --backend cpu` (issue 25): for each shape n×k, batch M,
thread count and sparsity, efficiency = (dense time × density) / tilejit time, where dense is
the fastest library of the same precision in the same run (--dtype f32: oneDNN fp32 or
OpenBLAS; --dtype bf16: oneDNN bf16). 1.0 is the ideal 1/density speedup; at sparsity 0 it is
tilejit's speed relative to the library.

Each `tilejit bench` run goes through `flock LOCK chrt -f 10` (one benchmark at a time on a
shared machine, real-time priority over builds); a row is the median of --runs runs (each run
itself the median of the bench's --repeats), with the spread of the runs.

    python3 bench/efficiency.py --dtype bf16 [--threads 1,2] [--m 1,16,128,512]
        [--sparsity 0,0.5,0.75] [--shapes 384x384,...] [--runs 3] [--tilejit build/cli/tilejit]
        [--csv OUT.csv] [--config JSON] [--bench-args ARGS] [--legacy]

Prints a Markdown table (one row per shape, M and threads; a column pair per sparsity) and the
rows below --target (default 0.85).
"""
import argparse
import csv
import os
import shlex
import statistics
import subprocess
import sys

SHAPES = "384x384,1536x384,384x1536,768x768,3072x768,768x3072,4096x4096,11008x4096,4096x11008"


def run_bench(args, n, k, m, s, t):
    cmd = ["flock", args.lock, "chrt", "-f", "10", args.tilejit, "bench", "--backend", "cpu", "--m", str(m), "--n", str(n),
           "--k", str(k), "--sparsity", str(s), "--threads", str(t), "--repeats", str(args.repeats), "--min-time",
           str(args.min_time)]
    if args.dtype == "bf16" and not args.legacy:
        cmd += ["--dtype", "bf16"]
    if args.config:
        cmd += ["--config", args.config]
    cmd += shlex.split(args.bench_args)
    p = subprocess.run(cmd, capture_output=True, text=True)
    last = [ln for ln in p.stdout.splitlines() if ln.startswith("speedup ")]
    if p.returncode != 0 or not last:
        raise RuntimeError("%s: exit %d: %s" % (" ".join(cmd), p.returncode, (p.stderr or p.stdout).strip()[-400:]))
    f = last[-1].split()
    kv = dict(zip(f[0::2], f[1::2]))
    dens = next(float(ln.split()[1]) for ln in p.stdout.splitlines() if ln[:1].isdigit())
    tj = float(kv["tilejit_ms"])
    # a build before --dtype (--legacy): the bf16 baseline is onednn_bf16_ms, fp32 the fastest
    base = float(kv["onednn_bf16_ms"]) if args.dtype == "bf16" else float(kv["dense_ms"])
    cfg = next((ln[7:] for ln in p.stdout.splitlines() if ln.startswith("config ")), "")
    return {"tilejit_ms": tj, "dense_ms": base, "density": dens, "eff": base * dens / tj, "config": cfg}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--m", default="1,16,128,512")
    ap.add_argument("--sparsity", default="0,0.5,0.75")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=0.05)
    ap.add_argument("--target", type=float, default=0.85)
    ap.add_argument("--tilejit", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "cli", "tilejit"))
    ap.add_argument("--lock", default="/tmp/tilejit-bench.lock")
    ap.add_argument("--config", help="a CPU config (JSON) for every run")
    ap.add_argument("--bench-args", default="", help="other `tilejit bench` arguments (shell words)")
    ap.add_argument("--legacy", action="store_true",
                    help="a tilejit without `bench --dtype`: give the bf16 choice as --config '{\"dtype\": \"bf16\"}'")
    ap.add_argument("--csv")
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    sps = [float(v) for v in args.sparsity.split(",")]
    rows = []
    out = None
    if args.csv:
        out = csv.writer(open(args.csv, "w", newline=""))
        out.writerow(["n", "k", "m", "threads", "sparsity", "density", "run", "tilejit_ms", "dense_ms", "efficiency", "config"])
    for n, k in shapes:
        for m in [int(v) for v in args.m.split(",")]:
            for t in [int(v) for v in args.threads.split(",")]:
                cells = {}
                for s in sps:
                    res = []
                    for r in range(args.runs):
                        x = run_bench(args, n, k, m, s, t)
                        res.append(x)
                        if out:
                            out.writerow([n, k, m, t, s, x["density"], r, x["tilejit_ms"], x["dense_ms"], "%.4f" % x["eff"], x["config"]])
                    effs = [x["eff"] for x in res]
                    cells[s] = (statistics.median(effs), min(effs), max(effs),
                                statistics.median(x["tilejit_ms"] for x in res), statistics.median(x["dense_ms"] for x in res))
                rows.append((n, k, m, t, cells))
                line = "| %d×%d | %d | %d | " % (n, k, m, t) + " | ".join(
                    "%.2f (%.2f–%.2f)" % c[:3] for c in cells.values())
                print(line, file=sys.stderr, flush=True)
    base = "oneDNN bf16" if args.dtype == "bf16" else "fastest fp32 library"
    print("efficiency = (%s time × density) / tilejit time; median of %d runs (min–max)\n" % (base, args.runs))
    print("| n×k | M | threads | " + " | ".join("s = %g" % s for s in sps) + " |")
    print("|---|---|---|" + "---|" * len(sps))
    for n, k, m, t, cells in rows:
        print("| %d×%d | %d | %d | " % (n, k, m, t) + " | ".join("%.2f (%.2f–%.2f)" % c[:3] for c in cells.values()) + " |")
    low = [(n, k, m, t, s, c[0]) for n, k, m, t, cells in rows for s, c in cells.items() if s > 0 and c[0] < args.target]
    print("\n%d of %d sparse rows below %.2f%s" % (len(low), sum(1 for *_, cells in rows for s in cells if s > 0), args.target,
                                                 ": " + ", ".join("%d×%d M%d T%d s%g %.2f" % r for r in low) if low else ""))


if __name__ == "__main__":
    main()
