#!/usr/bin/env bash
# scripts/gpu-check on a machine without a GPU, in a budget too small to build: every step must
# fail on its own (reported, the next one still run) and the summary table must still come last,
# with exit status 1. Skips (77) where nvidia-smi works: there the real check is the test.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
if nvidia-smi >/dev/null 2>&1; then
  echo "skipped: nvidia-smi works here (run scripts/gpu-check itself)"
  exit 77
fi
tmp="${TMPDIR:-/tmp}/meshrun-gpu-check-dry-run.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
GPU_CHECK_BUDGET=15 JOBS=1 GPU_CHECK_DIRECT=1 GPU_CHECK_BUILD_DIR="$tmp/build" OUT="$tmp/out" \
  GPU_CHECK_CARRY="$tmp/no-carry" \
  bash "$root/scripts/gpu-check" > "$tmp/stdout" 2>&1
rc=$?
fail() { echo "FAIL: $*"; echo "--- output"; cat "$tmp/stdout"; exit 1; }
[ $rc -eq 1 ] || fail "exit status $rc, expected 1"
summary="$tmp/out/gpu-check/summary.txt"
[ -s "$summary" ] || fail "no $summary"
# The table is the last thing printed.
[ "$(tail -n "$(wc -l < "$summary")" "$tmp/stdout")" = "$(cat "$summary")" ] ||
  fail "the summary is not the end of the output"
for row in "gpu" "nccl" "build" "tests (ctest -L gpu)" "rank (carried meshrun)" \
           "loss cuda bf16 vs cpu" "rank run (cuda bf16)" "rank tokens/s" "rank MFU" \
           "kernel bench tokens/s" \
           "torch tokens/s" "ratio meshrun/torch" "logs"; do
  grep -q "^$row " "$summary" || fail "no '$row' row in the summary"
done
grep -q "^build .*FAIL" "$summary" || fail "the build should fail here"
grep -q "^rank (carried meshrun) .*none carried" "$summary" || fail "no rank was carried here"
grep -q "^loss cuda bf16 vs cpu .*not run" "$summary" || fail "the rank comparison should not run"
for step in "environment" "build" "tests (label gpu)" "product rank" "bench/gpu_train_step" \
            "bench/gpu_torch_baseline.py"; do
  grep -q "^=== \[ *[0-9]*s\] $step" "$tmp/stdout" || fail "step '$step' did not run"
done
echo "ok: every step ran and failed on its own; the table came last"
