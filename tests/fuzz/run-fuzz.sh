#!/bin/sh
# Runs one libFuzzer target for a bounded time: run-fuzz.sh FUZZER SEED_DIR WORK_DIR
# TJ_FUZZ_SECONDS (default 60) bounds the run; TJ_FUZZ_ARGS adds libFuzzer flags. The seed corpus
# in the source tree is read only; new inputs go to WORK_DIR/corpus, crashes to WORK_DIR/.
# Exit 0 when the time ran out without a crash, leak, timeout or out-of-memory; else libFuzzer's
# nonzero code, with the reproducer's path in the log.
set -eu
fuzzer=$1 seeds=$2 work=$3
secs=${TJ_FUZZ_SECONDS:-60}
mkdir -p "$work/corpus"
# shellcheck disable=SC2086
exec "$fuzzer" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$work/" ${TJ_FUZZ_ARGS:-} "$work/corpus" "$seeds"
