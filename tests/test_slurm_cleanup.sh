#!/usr/bin/env bash
# The Slurm test's cluster does not outlive the test (tests/test_slurm.sh's watchdog). The test runs
# under a parent shell that writes its output to a file; once the cluster runs the first sweep's
# jobs, (a) the parent is killed with SIGKILL, orphaning the test, (b) the parent and the test's
# shell are both killed with SIGKILL, so the test's own cleanup never runs. Each time, within 30 s
# (120 s under a sanitizer), nothing of the test may run: no munged, slurmctld, slurmd, slurmstepd
# or job process of its cluster (scripts/slurm-local check, and no process naming the cluster's
# directory), neither the test nor its watchdog. Exit 0 pass, 1 fail, 77 skipped (where
# tests/test_slurm.sh skips).
set -uo pipefail

SRC=${TJ_SOURCE_ROOT:-$(cd "$(dirname "$0")/.." && pwd)}
SLURM_LOCAL="$SRC/scripts/slurm-local"
TEST="$SRC/tests/test_slurm.sh"
export PATH="$PATH:/usr/sbin:/sbin"
for prog in munged mungekey slurmctld slurmd sbatch setsid; do
    if ! command -v "$prog" > /dev/null 2>&1; then
        echo "SKIP: '$prog' is not installed (Debian packages slurm-wlm and munge; scripts/install-deps installs them)"
        exit 77
    fi
done

W=$(mktemp -d "${TMPDIR:-/tmp}/tj_slurm_cleanup_XXXXXX") || exit 1
chmod 755 "$W" # munged wants every directory above its socket traversable by all
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
gone() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null); [ -z "$st" ] || [ "${st:0:1}" = Z ]; }
# processes whose command line names DIR (the daemons name their slurm.conf, socket or files)
naming() { pgrep -a -f "$1/" | grep -v -e '^[0-9]* pgrep ' -e "^$$ "; }

# one_case NAME KILL_TEST(0|1)
one_case() {
    local name=$1 kill_test=$2 w="$W/$1" parent tpid wpid d=""
    mkdir -p "$w" && chmod 755 "$w"
    TMPDIR="$w" bash -c '"$1" > "$2" 2>&1 & echo $! > "$3"; wait' parent "$TEST" "$w/test.out" "$w/test.pid" &
    parent=$!
    for _ in $(seq 900); do # the first sweep's jobs running: 180 s at most
        d=$(ls -d "$w"/tj_slurm_* 2>/dev/null | head -n 1)
        [ -n "$d" ] && compgen -G "$d/out1/task-*.out" > /dev/null && break
        gone "$parent" && break
        sleep 0.2
    done
    tpid=$(cat "$w/test.pid" 2>/dev/null)
    wpid=$(cat "$d/watchdog.pid" 2>/dev/null)
    if [ -z "$d" ] || ! compgen -G "$d/out1/task-*.out" > /dev/null || [ -z "$tpid" ]; then
        fail "$name: the test did not get to run jobs"
        cat "$w/test.out"
        kill -KILL "$parent" ${tpid:+"$tpid"} 2>/dev/null
        [ -n "$d" ] && "$SLURM_LOCAL" stop "$d/cluster"
        return
    fi
    [ -n "$wpid" ] || fail "$name: the test started no watchdog"
    echo "$name: test $tpid (watchdog ${wpid:-none}) runs its cluster $d/cluster: $(naming "$d" | grep -c -E 'munged|slurmctld|slurmd') daemons, jobs $(SLURM_CONF=$d/cluster/slurm.conf squeue -h -o '%i:%T' | tr '\n' ' ')"
    if [ "$kill_test" = 1 ]; then
        echo "$name: kill -KILL $parent (the test's parent) $tpid (the test)"
        kill -KILL "$parent" "$tpid"
    else
        echo "$name: kill -KILL $parent (the test's parent)"
        kill -KILL "$parent"
    fi
    wait "$parent" 2>/dev/null
    local t0=$SECONDS limit=30
    [ -n "${TJ_SANITIZER:-}" ] && limit=120 # the jobs' tilejit under a sanitizer winds down slower
    while [ $((SECONDS - t0)) -lt $limit ]; do
        gone "$tpid" && { [ -z "$wpid" ] || gone "$wpid"; } && [ -z "$(naming "$d")" ] && "$SLURM_LOCAL" check "$d/cluster" 2> /dev/null && break
        sleep 0.5
    done
    echo "$name: after $((SECONDS - t0)) s: test $(gone "$tpid" && echo gone || echo running), watchdog $([ -z "$wpid" ] && echo none || { gone "$wpid" && echo gone || echo running; }), $(naming "$d" | grep -c .) processes naming $d"
    gone "$tpid" || fail "$name: the test still runs $limit s after the kill"
    [ -z "$wpid" ] || gone "$wpid" || fail "$name: the watchdog still runs $limit s after the kill"
    "$SLURM_LOCAL" check "$d/cluster" || fail "$name: processes of the cluster still run $limit s after the kill"
    [ -z "$(naming "$d")" ] || { fail "$name: processes naming $d still run"; naming "$d"; }
    sed 's/^/  watchdog.log: /' "$d/watchdog.log" 2>/dev/null
    # whatever this case left behind, by pid
    gone "$tpid" || kill -KILL "$tpid" 2>/dev/null
    [ -z "$wpid" ] || gone "$wpid" || kill -KILL "$wpid" 2>/dev/null
    "$SLURM_LOCAL" stop "$d/cluster" > /dev/null 2>&1
}

one_case orphaned 0
one_case killed 1
if [ $failures -eq 0 ]; then
    rm -rf "$W"
    echo "PASS"
    exit 0
fi
echo "files kept in $W"
exit 1
