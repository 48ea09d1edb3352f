#!/usr/bin/env python3
"""The CPU efficiency table: `tilejit bench --backend cpu` over shapes × M × threads × sparsity.

Efficiency = (the fastest dense library's time × density) / tilejit's time, both timed in the
same `tilejit bench` run on the same X and W (bench/dense_cpu.c); the library is of the same
precision: --dtype f32 (default) oneDNN fp32 or OpenBLAS, --dtype bf16 oneDNN bf16 against
tilejit's bf16 kernel (`tilejit bench --dtype bf16`: AMX, vdpbf16ps or FMA on widened values, as
the runtime picks for M). 1.0 is the ideal 1/density speedup. Each (shape, M, threads) point is one `tilejit bench --sweep` call that
times the dense libraries once and tilejit at every sparsity, plus density 1.0 (sparsity 0) for
reference: tilejit's speed on the unpruned layer against the same dense time. Every call runs
under `flock LOCK chrt -f 10` (one benchmark at a time on a shared machine, real-time priority
over builds), so other benchmarks interleave between calls; --runs R repeats the whole sweep R
times, interleaved, and the table gives the median (and spread) of the R runs.

  bench/efficiency.py                       # the full table: 9 shapes, M 1,16,128,512, 1 and 2 threads
  bench/efficiency.py --shapes 4096x4096 --m 16 --threads 1 --runs 3
  bench/efficiency.py --dtype bf16 --markdown > table.md   # bf16, as Markdown (bench/RESULTS.md)

Shapes are n×k (out_features × in_features). Exit status 1 when a bench call fails.
"""
import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SHAPES = ["384x384", "1536x384", "384x1536", "768x768", "3072x768", "768x3072",
          "4096x4096", "11008x4096", "4096x11008"]
TARGET = 0.85


def parse_args(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--tilejit", default=os.path.join(here, "..", "build", "cli", "tilejit"), help="the tilejit binary")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="n×k list, e.g. 384x384,4096x11008")
    ap.add_argument("--m", default="1,16,128,512", help="token counts M")
    ap.add_argument("--threads", default="1,2", help="thread counts")
    ap.add_argument("--sparsity", default="0.5,0.75", help="sparsities")
    ap.add_argument("--dtype", choices=["f32", "bf16"], default="f32", help="bench --dtype: the precision of both sides")
    ap.add_argument("--no-dense-ref", action="store_true", help="skip tilejit at density 1.0")
    ap.add_argument("--runs", type=int, default=3, help="runs of the whole sweep (median over runs)")
    ap.add_argument("--min-time", default="0.02", help="bench --min-time (seconds per repeat)")
    ap.add_argument("--repeats", default="5", help="bench --repeats (median of repeats within a run)")
    ap.add_argument("--config", help="bench --config JSON for tilejit (default: the built-in per-M default)")
    ap.add_argument("--tuning-log", help="bench --tuning-log LOG")
    ap.add_argument("--lock", default="/tmp/tilejit-bench.lock", help="flock file ('' for none)")
    ap.add_argument("--no-chrt", action="store_true", help="do not run under chrt -f 10")
    ap.add_argument("--csv", help="also write every run's rows to this CSV")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--dry-run", action="store_true", help="print the bench commands only")
    a = ap.parse_args(argv)
    try:
        a.shape_list = [tuple(int(v) for v in s.lower().split("x")) for s in a.shapes.split(",")]
        a.m_list = [int(v) for v in a.m.split(",")]
        a.t_list = [int(v) for v in a.threads.split(",")]
        a.s_list = [float(v) for v in a.sparsity.split(",")]
    except ValueError as e:
        ap.error("bad list: %s" % e)
    if any(len(s) != 2 or min(s) < 1 for s in a.shape_list) or min(a.m_list) < 1 or min(a.t_list) < 1:
        ap.error("shapes are NxK with positive sizes; M and threads positive")
    if any(not 0 < s < 1 for s in a.s_list) or a.runs < 1:
        ap.error("sparsities in (0, 1), runs ≥ 1")
    return a


def command(a, n, k, m, t, csv_path):
    sweep = ([] if a.no_dense_ref else ["0"]) + ["%g" % s for s in a.s_list]
    cmd = [a.tilejit, "bench", "--backend", "cpu", "--m", str(m), "--n", str(n), "--k", str(k), "--threads", str(t),
           "--sweep", ",".join(sweep), "--csv", csv_path, "--min-time", a.min_time, "--repeats", a.repeats]
    if a.dtype != "f32":
        cmd += ["--dtype", a.dtype]
    if a.config:
        cmd += ["--config", a.config]
    if a.tuning_log:
        cmd += ["--tuning-log", a.tuning_log]
    if not a.no_chrt:
        cmd = ["chrt", "-f", "10"] + cmd
    if a.lock:
        cmd = ["flock", a.lock] + cmd
    return cmd


def run_point(a, n, k, m, t, tmp):
    path = os.path.join(tmp, "point.csv")
    cmd = command(a, n, k, m, t, path)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stderr.write("bench/efficiency.py: %s failed (%d):\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
        sys.exit(1)
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def fmt_ms(v):
    return "%.4f" % v if v < 1 else "%.3f" % v if v < 100 else "%.1f" % v


def main(argv):
    a = parse_args(argv)
    points = [(n, k, m, t) for (n, k) in a.shape_list for m in a.m_list for t in a.t_list]
    if a.dry_run:
        for n, k, m, t in points:
            print(" ".join(command(a, n, k, m, t, "OUT.csv")))
        return 0
    if not shutil.which(a.tilejit) and not os.access(a.tilejit, os.X_OK):
        sys.stderr.write("bench/efficiency.py: no tilejit at %s (--tilejit)\n" % a.tilejit)
        return 1
    t0 = time.time()
    rows = {}  # (n, k, m, t) -> list over runs of csv rows
    all_rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.runs):
            for pt in points:
                got = run_point(a, *pt, tmp)
                rows.setdefault(pt, []).append(got)
                for row in got:
                    row["run"] = str(r)
                all_rows += got
                sys.stderr.write("\r%d/%d calls, %.0f s " % (r * len(points) + points.index(pt) + 1,
                                                             a.runs * len(points), time.time() - t0))
    sys.stderr.write("\n")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(all_rows[0].keys()))
            w.writeheader()
            w.writerows(all_rows)

    head = ["n×k", "M", "thr", "S", "efficiency", "(runs min–max)", "tilejit ms", "dense ms", "dense library (kernel)",
            "d 1.0: dense/tilejit", "w GB/s", "read GB/s"]
    table, effs = [], []
    for pt in points:
        n, k, m, t = pt
        runs = rows[pt]
        ref = [float(x["speedup"]) for run in runs for x in run if float(x["sparsity"]) == 0]
        for s in a.s_list:
            sel = [next(x for x in run if abs(float(x["sparsity"]) - s) < 1e-6) for run in runs]
            eff = [float(x["speedup"]) * float(x["density"]) for x in sel]
            med = statistics.median(eff)
            effs.append(med)
            med_of = lambda key: statistics.median(float(x[key]) for x in sel)
            names = sorted({x["baseline_name"] for x in sel})
            table.append(["%dx%d" % (n, k), str(m), str(t), "%.2f" % s, "%.2f" % med,
                          "%.2f–%.2f" % (min(eff), max(eff)), fmt_ms(med_of("tilejit_ms")), fmt_ms(med_of("dense_ms")),
                          " / ".join(names), "%.2f" % statistics.median(ref) if ref else "-",
                          "%.1f" % med_of("weights_gbps"), "%.1f" % med_of("read_gbps")])
    if a.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in table:
            row = row[:4] + [("**%s**" % row[4]) if float(row[4]) < TARGET else row[4]] + row[5:]
            print("| " + " | ".join(row) + " |")
    else:
        wid = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(head)]
        print("  ".join(h.ljust(wid[i]) for i, h in enumerate(head)))
        for row in table:
            print("  ".join(c.ljust(wid[i]) for i, c in enumerate(row)))
    below = sum(e < TARGET for e in effs)
    print("\n%d rows, efficiency median %.2f, min %.2f, %d below %.2f; %d bench calls in %.0f s (median of %d runs each)" %
          (len(effs), statistics.median(effs), min(effs), below, TARGET, a.runs * len(points), time.time() - t0, a.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
