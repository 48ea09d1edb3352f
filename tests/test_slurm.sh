#!/usr/bin/env bash
# Tuning sweeps under a real one-node Slurm cluster (scripts/slurm-local): scripts/tune-slurm.sbatch
# as a job array plus the dependent merge job, a cancelled task resumed, a one-workload sweep over
# two shards, and the GPU form of the script checked by Slurm (--test-only) and as a dry run.
# Exit 0 pass, 1 fail, 77 skipped (only when the Slurm or munge programs are not installed).
set -uo pipefail

TILEJIT=${TJ_TILEJIT:?TJ_TILEJIT names the tilejit executable}
SYNTH=${TJ_SYNTH_MODEL:?TJ_SYNTH_MODEL names make-synthetic-model}
SRC=${TJ_SOURCE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
SLURM_LOCAL="$SRC/scripts/slurm-local"
SBATCH_SCRIPT="$SRC/scripts/tune-slurm.sbatch"
export PATH="$PATH:/usr/sbin:/sbin"
for prog in munged mungekey slurmctld slurmd sbatch; do
    if ! command -v "$prog" > /dev/null 2>&1; then
        echo "SKIP: '$prog' is not installed (Debian packages slurm-wlm and munge; scripts/install-deps installs them)"
        exit 77
    fi
done

T0=$(date +%s)
D=$(mktemp -d "${TMPDIR:-/tmp}/tj_slurm_XXXXXX") || exit 1
D=$(cd "$D" && pwd)
chmod 755 "$D" # munged wants every directory above its socket traversable by all
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
note() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
finish() {
    local rc=$?
    trap - EXIT INT TERM HUP
    "$SLURM_LOCAL" stop "$D/cluster" || { echo "FAIL: cluster processes left running"; failures=$((failures + 1)); }
    if [ $failures -eq 0 ] && [ $rc -eq 0 ]; then
        rm -rf "$D"
        note "PASS"
        exit 0
    fi
    echo "slurmctld log: $D/cluster/log/slurmctld.log; work files kept in $D"
    exit 1
}
trap finish EXIT
trap 'fail "interrupted"; exit 1' INT TERM HUP

# The cluster must not outlive the test however the test ends, finish included: a watchdog in a
# session of its own (out of reach of a signal to the test's process group, as meson sends when it
# times out or is itself killed) asks the test to finish when the test's parent goes away (an
# orphaned test would run on unseen), and stops the cluster by pid once the test is gone.
gone() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null); [ -z "$st" ] || [ "${st:0:1}" = Z ]; }
watchdog() { # TEST_PID PARENT_PID SLURM_LOCAL CLUSTER_DIR
    local t
    while ! gone "$1" && [ "$(ps -o ppid= -p "$1" 2>/dev/null | tr -d ' ')" = "$2" ]; do sleep 0.5; done
    if ! gone "$1"; then
        echo "watchdog: the test's parent $2 is gone: stopping the test ($1)"
        kill -TERM "$1" 2>/dev/null
        for t in $(seq 60); do gone "$1" && break; sleep 0.5; done
        gone "$1" || kill -KILL "$1" 2>/dev/null
    fi
    "$3" stop "$4" && echo "watchdog: nothing of $4 runs"
}
setsid bash -c "$(declare -f gone watchdog); watchdog \"\$@\"" watchdog $$ "$PPID" "$SLURM_LOCAL" "$D/cluster" \
    < /dev/null > "$D/watchdog.log" 2>&1 &
echo $! > "$D/watchdog.pid"

"$SLURM_LOCAL" start "$D/cluster"
rc=$?
[ $rc -eq 77 ] && { trap - EXIT; rm -rf "$D"; exit 77; }
[ $rc -eq 0 ] || { fail "the cluster did not start"; exit 1; }
export SLURM_CONF="$D/cluster/slurm.conf"
sb() { "$SLURM_LOCAL" sbatch "$D/cluster" "$@"; }

# waitjobs SECONDS JOBID...: until no task of them is pending or running (4x under sanitizers)
waitjobs() {
    local limit=$1 t=0
    [ -n "${TJ_SANITIZER:-}" ] && limit=$((limit * 4))
    shift
    local ids
    ids=$(IFS=,; echo "$*")
    while [ -n "$(squeue -h -j "$ids" -o %i 2>/dev/null)" ]; do
        sleep 0.5
        t=$((t + 1))
        if [ $t -gt $((limit * 2)) ]; then
            fail "jobs $ids still queued after $limit s"; squeue; return 1
        fi
    done
}
# states JOBID: "task=state exit" per array task (or the job), sorted
states() { scontrol -o show job "$1" | sed -n 's/.*JobState=\([A-Z_]*\).*ExitCode=\([0-9:]*\).*/\1 \2/p' | sort | tr '\n' ' '; }
mlines() { if [ -f "$1" ]; then grep -c '"workload"' "$1"; else echo 0; fi; } # measurement records in a log

# --- the model: one synthetic encoder layer (6 linear layers), pruned to a TW pattern ---------
cd "$D" || exit 1
"$SYNTH" -o w.safetensors --layers 1 --hidden 64 --intermediate 128 --vocab 16 > /dev/null || { fail "synthetic model"; exit 1; }
"$TILEJIT" prune --weights w.safetensors --sparsity 0.5 --g 32 --mode tw1 --layers 'query|intermediate' -o p.json \
    > prune.out 2>&1 || { cat prune.out; fail "prune"; exit 1; }
"$TILEJIT" prune --weights w.safetensors --sparsity 0.5 --g 32 --mode tw1 --layers 'attention.self.query' -o one.json \
    > prune1.out 2>&1 || { cat prune1.out; fail "prune (one layer)"; exit 1; }
cat > configs.json <<'EOF'
[{"mb":0,"mr":4,"nr":16,"offsets":"table","unroll":1},
 {"mb":0,"mr":6,"nr":32,"offsets":"table","unroll":4},
 {"mb":0,"mr":2,"nr":16,"offsets":"table","unroll":4}]
EOF
# six configs for the fault case (fake timings: one measurement takes --min-time, the time reported
# is a deterministic function of the config, so runs can be compared record for record)
cat > configs6.json <<'EOF'
[{"mr":2,"nr":16},{"mr":4,"nr":16},{"mr":6,"nr":16},{"mr":2,"nr":32},{"mr":4,"nr":32},{"mr":6,"nr":32}]
EOF
layers=$(python3 -c 'import json,sys; print(len(json.load(open("p.json"))["layers"]))')
[ "$layers" = 2 ] || fail "the pattern has $layers layers, expected 2"

# validjsonl LOG SHARD [torn-ok]: every line JSON, the first a header of that shard, the rest
# measurements (torn-ok: one torn line, ended by a resumed run, may sit in between)
validjsonl() {
    python3 - "$1" "$2" "${3:-}" <<'PY'
import json, sys
path, shard, torn_ok = sys.argv[1], sys.argv[2], sys.argv[3] == "torn-ok"
lines = open(path).read().split("\n")
if lines[-1] != "": sys.exit(f"{path}: last line not terminated")
recs, torn = [], 0
for l in lines[:-1]:
    try: recs.append(json.loads(l))
    except ValueError:
        torn += 1
        if not torn_ok or torn > 1: raise
h = recs[0]
if h.get("format") != "tilejit-tune" or h.get("kind") != "header" or h.get("shard") != shard:
    sys.exit(f"{path}: first line is not the header of shard {shard}: {lines[0]}")
for r in recs[1:]:
    if r.get("kind", "measurement") != "measurement" or "workload" not in r or "config" not in r:
        sys.exit(f"{path}: not a measurement: {r}")
PY
}

# --- 1. a real CPU sweep as an array of 3 tasks, then the merge job ---------------------------
note "1: array of 3 CPU tasks + merge"
mkdir -p out1
opts=(-- --search exhaustive --configs "$D/configs.json" --min-time 0.02 --timeout 60 --confirm 0)
jid=$(TILEJIT="$TILEJIT" sb --parsable --array=0-2 --cpus-per-task=1 --time=5 -o "$D/out1/task-%a.out" \
      "$SBATCH_SCRIPT" "$D/p.json" "$D/w.safetensors" "$D/out1" cpu 8,64 "${opts[@]}")
mid=$(TILEJIT="$TILEJIT" sb --parsable --dependency=afterok:"$jid" --cpus-per-task=1 --time=5 -o "$D/out1/merge.out" \
      "$SBATCH_SCRIPT" --merge "$D/p.json" "$D/w.safetensors" "$D/out1" cpu 8,64 "${opts[@]}")
[ -n "$jid" ] && [ -n "$mid" ] || { fail "sbatch failed"; exit 1; }
waitjobs 180 "$jid" "$mid"
[ "$(states "$jid")" = "COMPLETED 0:0 COMPLETED 0:0 COMPLETED 0:0 " ] || { fail "array tasks: $(states "$jid")"; cat out1/task-*.out; }
[ "$(states "$mid")" = "COMPLETED 0:0 " ] || { fail "merge job: $(states "$mid")"; cat out1/merge.out; }
total=0
for i in 0 1 2; do
    validjsonl "out1/shard-$i.jsonl" "$i/3" || fail "shard $i log"
    n=$(mlines "out1/shard-$i.jsonl")
    [ "$n" -eq 4 ] || fail "shard $i holds $n measurements, expected 4 (2 layers x 2 M x 3 configs over 3 shards)"
    grep -q -- "--budget 0*[1-9]" "out1/task-$i.out" || fail "task $i: no budget passed (see out1/task-$i.out)"
    total=$((total + n))
done
grep -q '^tune: .*measured 0 (0 failed), 12 already in' out1/merge.out || { fail "merge pass measured something"; cat out1/merge.out; }
# best.txt: a config for every (layer, M) workload; the model loads those configs
python3 - out1/best.txt p.json <<'PY' || fail "best.txt does not name a config for every workload"
import json, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip() and not l.startswith(("#", "layer "))]
names = [l["name"] for l in json.load(open(sys.argv[2]))["layers"]]
got = {(r[0], r[1]) for r in rows if r[-1].startswith("{")}
want = {(n, m) for n in names for m in ("8", "64")}
if got != want: sys.exit(f"best rows {sorted(got)} != workloads {sorted(want)}")
PY
"$TILEJIT" model p.json --weights w.safetensors --backend cpu --m 64 --tuning-log out1/tune.jsonl -v > model.out 2>&1 ||
    { fail "tilejit model --tuning-log failed"; cat model.out; }
python3 - out1/best.txt model.out <<'PY' || { fail "tilejit model did not load the best configs"; cat model.out; }
import re, sys
best = {}
for l in open(sys.argv[1]):
    r = l.split()
    if len(r) >= 6 and r[1] == "64" and r[-1].startswith("{"): best[r[0]] = r[-1]
used = dict(re.findall(r"tuning: layer '([^']+)' \(M \d+\): config (\{\S*\}) from ", open(sys.argv[2]).read()))
if not best or used != best: sys.exit(f"model used {used}, best says {best}")
PY

# --- 2. faults: a task cancelled mid-sweep, resubmitted with the same index --------------------
note "2: cancel task 1 mid-sweep, resubmit it, merge; compare with an uninterrupted sweep"
mkdir -p out2
fopts=(-- --search exhaustive --configs "$D/configs6.json" --min-time 0.25 --confirm 0)
export TILEJIT_TUNE_FAKE_TIME=1
jid=$(TILEJIT="$TILEJIT" sb --parsable --array=0-1 --cpus-per-task=1 --time=5 -o "$D/out2/task-%a.out" \
      "$SBATCH_SCRIPT" "$D/p.json" "$D/w.safetensors" "$D/out2" cpu 8,64 "${fopts[@]}")
# wait for task 1 to hold 3 of its 12 measurements, then cancel it
t=0
while [ "$(mlines out2/shard-1.jsonl)" -lt 3 ] && [ $t -lt 4800 ]; do sleep 0.1; t=$((t + 1)); done
scancel "${jid}_1"
waitjobs 60 "$jid"
# complete measurements only: a cancel landing mid-write would leave a torn line (never seen:
# one write(2) per record), which the resumed run ends and measures again
before=$(python3 -c '
import json, sys
n = 0
for l in open(sys.argv[1]):
    try: n += "workload" in json.loads(l)
    except ValueError: pass
print(n)' out2/shard-1.jsonl)
[[ "$(states "${jid}_1")" == CANCELLED* ]] || fail "task 1 was not cancelled: $(states "${jid}_1")"
[ "$before" -ge 3 ] && [ "$before" -lt 12 ] || fail "task 1 holds $before of 12 measurements after the cancel: not mid-sweep"
[ "$(states "${jid}_0")" = "COMPLETED 0:0 " ] || fail "task 0: $(states "${jid}_0")"
note "task 1 cancelled holding $before of its 12 measurements; resubmitting index 1"
jid2=$(TILEJIT="$TILEJIT" TILEJIT_SHARDS=2 sb --parsable --array=1 --cpus-per-task=1 --time=5 -o "$D/out2/resume-%a.out" \
       "$SBATCH_SCRIPT" "$D/p.json" "$D/w.safetensors" "$D/out2" cpu 8,64 "${fopts[@]}")
mid=$(TILEJIT="$TILEJIT" sb --parsable --dependency=afterok:"$jid2" --cpus-per-task=1 --time=5 -o "$D/out2/merge.out" \
      "$SBATCH_SCRIPT" --merge "$D/p.json" "$D/w.safetensors" "$D/out2" cpu 8,64 "${fopts[@]}")
waitjobs 120 "$jid2" "$mid"
[ "$(states "$jid2")" = "COMPLETED 0:0 " ] || { fail "resumed task: $(states "$jid2")"; cat out2/resume-1.out; }
[ "$(states "$mid")" = "COMPLETED 0:0 " ] || { fail "merge job: $(states "$mid")"; cat out2/merge.out; }
grep -q "measured $((12 - before)) (0 failed), $before already in" out2/resume-1.out ||
    { fail "the resumed task did not skip the $before measurements its log held"; cat out2/resume-1.out; }
validjsonl out2/shard-1.jsonl 1/2 torn-ok || fail "resumed shard log"
# the uninterrupted sweep, one process (fake timings do not depend on --min-time)
"$TILEJIT" tune p.json --weights w.safetensors --backend cpu --m 8,64 --search exhaustive --configs configs6.json \
    --min-time 0 --confirm 0 --log ref.jsonl > ref.out 2>&1 || { fail "uninterrupted sweep"; cat ref.out; }
unset TILEJIT_TUNE_FAKE_TIME
python3 - out2/tune.jsonl ref.jsonl <<'PY' || fail "merged records differ from the uninterrupted sweep"
import collections, json, sys
def keys(p):
    out = collections.Counter()
    for l in open(p):
        try: r = json.loads(l)
        except ValueError: continue                  # a torn line: readers skip it too
        if r.get("kind", "measurement") != "measurement": continue
        w, t, res = r["workload"], r["target"], r["result"]
        out[(t["backend"], t["device"], w["layer"], w["pattern_hash"], w["m"], json.dumps(r["config"], sort_keys=True),
             res["status"], res["median"])] += 1
    return out
a, b = keys(sys.argv[1]), keys(sys.argv[2])
if a != b or len(a) != 24 or max(a.values()) != 1: sys.exit(f"merged {sum(a.values())} records, reference {sum(b.values())}; differ: {set(a) ^ set(b)}")
PY
"$TILEJIT" tune --best ref.jsonl > ref-best.txt 2>&1
cmp -s out2/best.txt ref-best.txt || { fail "merged best differs from the uninterrupted sweep's"; diff out2/best.txt ref-best.txt; }
# a task killed mid-write leaves a torn last line: --best warns and reads the rest
cp out2/shard-0.jsonl torn.jsonl
tail -n 1 out2/shard-1.jsonl | head -c 100 >> torn.jsonl
"$TILEJIT" tune --best torn.jsonl out2/shard-1.jsonl > torn-best.txt 2> torn.err || fail "--best failed on a torn line"
grep -q "skipped 1 malformed line" torn.err || { fail "no warning about the torn line"; cat torn.err; }
cmp -s torn-best.txt ref-best.txt || { fail "--best with a torn line chose differently"; diff torn-best.txt ref-best.txt; }

# --- 3. one workload over two shards: an empty share still writes its log, and merges ---------
note "3: one layer, one M, two shards (adaptive: one shard has nothing to do)"
mkdir -p out3
export TILEJIT_TUNE_FAKE_TIME=1
o3=(-- --search adaptive --min-time 0 --fraction 0.05 --confirm 0) # what auto picks above 32 configs
jid=$(TILEJIT="$TILEJIT" sb --parsable --array=0-1 --cpus-per-task=1 --time=5 -o "$D/out3/task-%a.out" \
      "$SBATCH_SCRIPT" "$D/one.json" "$D/w.safetensors" "$D/out3" cpu 32 "${o3[@]}")
mid=$(TILEJIT="$TILEJIT" sb --parsable --dependency=afterok:"$jid" --cpus-per-task=1 --time=5 -o "$D/out3/merge.out" \
      "$SBATCH_SCRIPT" --merge "$D/one.json" "$D/w.safetensors" "$D/out3" cpu 32 "${o3[@]}")
waitjobs 120 "$jid" "$mid"
unset TILEJIT_TUNE_FAKE_TIME
[ "$(states "$jid")" = "COMPLETED 0:0 COMPLETED 0:0 " ] || { fail "one-workload tasks: $(states "$jid")"; cat out3/task-*.out; }
[ "$(states "$mid")" = "COMPLETED 0:0 " ] || { fail "one-workload merge: $(states "$mid")"; cat out3/merge.out; }
validjsonl out3/shard-0.jsonl 0/2 && validjsonl out3/shard-1.jsonl 1/2 || fail "one-workload shard logs"
n0=$(mlines out3/shard-0.jsonl) n1=$(mlines out3/shard-1.jsonl)
[ $((n0 > 0 && n1 == 0)) = 1 ] || fail "one-workload adaptive shards hold $n0 and $n1 measurements (expected some and none)"
grep -q "attention.self.query" out3/best.txt || { fail "one-workload best"; cat out3/best.txt out3/merge.out; }
"$TILEJIT" tune --best out3/shard-1.jsonl > empty-best.txt 2> empty-best.err || { fail "--best refused an empty log"; cat empty-best.err; }

# --- 4. the GPU form: Slurm accepts its resources; the commands each task would run -----------
note "4: GPU form (--gres=gpu:1, --backend cuda): sbatch --test-only and a dry run in Slurm"
mkdir -p out4
sb --test-only --array=0-3 --gres=gpu:1 --cpus-per-task=1 --time=5 "$SBATCH_SCRIPT" "$D/p.json" "$D/w.safetensors" \
   "$D/out4" cuda 1,128,512 > out4/test-only.out 2>&1 || { fail "sbatch --test-only rejected the GPU form"; cat out4/test-only.out; }
grep -q "to start at .* on nodes tjnode" out4/test-only.out || { fail "sbatch --test-only"; cat out4/test-only.out; }
jid=$(TILEJIT=/opt/tilejit/bin/tilejit TILEJIT_SLURM_DRY_RUN=1 TILEJIT_SHARDS=4 sb --parsable --array=2-3 --gres=gpu:1 --cpus-per-task=1 \
      --time=30 -o "$D/out4/task-%a.out" "$SBATCH_SCRIPT" "$D/p.json" "$D/w.safetensors" "$D/out4" cuda 1,128,512)
waitjobs 60 "$jid"
[ "$(states "$jid")" = "COMPLETED 0:0 COMPLETED 0:0 " ] || fail "GPU dry run: $(states "$jid")"
for i in 2 3; do # tasks 2 and 3 of an array 2-3 (SLURM_ARRAY_TASK_COUNT 2): the shard count comes from TILEJIT_SHARDS
    want="+ /opt/tilejit/bin/tilejit tune $D/p.json --weights $D/w.safetensors --backend cuda --m 1,128,512 --threads 1 --budget 1500 --shard $i/4 --log $D/out4/shard-$i.jsonl"
    got=$(grep '^+ ' "out4/task-$i.out")
    [ "$got" = "$want" ] || fail "GPU task $i would run: '$got', expected '$want'"
    grep -q "no GPU" "out4/task-$i.out" && fail "GPU task $i saw no GPU (--gres=gpu:1 not passed on)"
done
[ ! -e out4/shard-0.jsonl ] || fail "the dry run wrote a log"

note "done, $failures failure(s)"
[ $failures -eq 0 ]
