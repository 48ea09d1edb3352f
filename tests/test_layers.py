#!/usr/bin/env python3
"""scripts/check-layers can fail: it finds a cycle of calls and a cycle of include and call in
small fixture trees (tests/fixtures/layers/), passes a clean one, and its C scanner agrees with
`nm` on what each of the library's built objects defines and uses from the others.

usage: test_layers.py CHECK_LAYERS FIXTURES BUILD_DIR SOURCE_ROOT
"""
import glob
import importlib.machinery
import importlib.util
import os
import shutil
import subprocess
import sys


def run(script, root):
    p = subprocess.run([sys.executable, script, root], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def included(source, rel):
    """Every project header rel includes, directly or not (paths relative to source)."""
    seen, todo = set(), [rel]
    while todo:
        f = todo.pop()
        try:
            with open(os.path.join(source, f), encoding="utf-8") as fh:
                lines = fh.read().splitlines()
        except OSError:
            continue
        for line in lines:
            if line.lstrip().startswith("#") and "include" in line and '"' in line:
                inc = line.split('"')[1]
                for cand in (inc, os.path.join(os.path.dirname(f), inc)):
                    cand = os.path.normpath(cand)
                    if os.path.exists(os.path.join(source, cand)):
                        if cand not in seen:
                            seen.add(cand)
                            todo.append(cand)
                        break
    return seen


def main():
    script, fixtures, build, source = sys.argv[1:5]
    fails = 0

    def expect(cond, what):
        nonlocal fails
        print(("ok   " if cond else "FAIL ") + what)
        fails += not cond

    rc, out = run(script, os.path.join(fixtures, "call-cycle"))
    expect(rc == 1 and "file cycle: runtime/a ↔ runtime/b" in out and "uses b_work" in out and "uses a_note" in out,
           "call cycle found with both calls named")
    rc, out = run(script, os.path.join(fixtures, "include-cycle"))
    expect(rc == 1 and "file cycle: runtime/a ↔ runtime/b" in out and 'includes "runtime/b.h"' in out
           and "uses a_fn" in out, "include-and-call cycle found")
    rc, out = run(script, os.path.join(fixtures, "clean"))
    expect(rc == 0 and "0 violations" in out, "a chain is no cycle (comments, strings and statics ignored)")

    # The scanner against the linker's view of the built library objects.
    loader = importlib.machinery.SourceFileLoader("check_layers", script)
    spec = importlib.util.spec_from_loader("check_layers", loader)
    cl = importlib.util.module_from_spec(spec)
    loader.exec_module(cl)
    nm = shutil.which("nm")
    objs = sorted(glob.glob(os.path.join(build, "libtilejit.so*.p", "*.c.o")))
    if not nm or not objs:
        print("skip nm comparison (no nm or no objects)")
        return 1 if fails else 0
    scanned = {}
    for o in objs:
        name = os.path.basename(o)[: -len(".o")]
        src = name.replace("_", "/", 1)  # meson names objects FOLDER_FILE.c.o
        if not os.path.exists(os.path.join(source, src)):
            continue
        with open(os.path.join(source, src), encoding="utf-8") as f:
            scanned[src] = (o, *cl.scan_c(cl.strip_c(f.read())))
    defined = set().union(*(d for _, d, _ in scanned.values()))
    where = {}
    for src, (_, d, _) in scanned.items():
        for name in d:
            where.setdefault(name, []).append(src)
    bad = 0
    for src, (o, d, u) in sorted(scanned.items()):
        # (AddressSanitizer adds an __odr_asan.NAME symbol beside each global it instruments)
        got = {l.split()[-1] for l in subprocess.run([nm, "--defined-only", "-g", o], capture_output=True,
                                                     text=True).stdout.splitlines()
               if l.strip() and not l.split()[-1].startswith("__odr_asan")}
        undef = {l.split()[-1] for l in subprocess.run([nm, "-u", o], capture_output=True, text=True).stdout.splitlines()
                 if l.strip()} & defined
        # nm also sees calls made by the headers' inline functions and macros: those come with an
        # include (direct or not) of the defining file's header, which the include edges cover.
        reach = included(source, src)
        missing_use = {s for s in undef - (u - d)
                       if not any(os.path.splitext(g)[0] + ".h" in reach for g in where.get(s, ()))}
        if got != d or missing_use:
            bad += 1
            print(f"  {src}: nm defines {sorted(got - d)} not scanned, scanned {sorted(d - got)} not in nm; "
                  f"uses missed {sorted(missing_use)}")
    expect(bad == 0 and len(scanned) > 40, f"scanner agrees with nm on {len(scanned)} objects")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
