#!/usr/bin/env bash
# scripts/gpu-check --dry-run on this machine: exits 0 and shows what the device would run —
# the product's rank entry (the `meshrun` binary's `train`, rank::RunRank in rank/rank_main.cc),
# never a second trainer binary — and the files it would carry, each with its size, within the
# 64 MiB a device call may carry. Argument: the meshrun binary of this build.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:?usage: gpu_check_plan_test.sh MESHRUN_BINARY}
tmp="${TMPDIR:-/tmp}/meshrun-gpu-check-plan.$$"
mkdir -p "$tmp"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- output"; cat "$tmp/stdout"; exit 1; }

# Not packed: the plan lists what --pack would carry, from the binary's libraries.
GPU_CHECK_RANK_BIN="$bin" GPU_CHECK_CARRY="$tmp/carry" \
  bash "$root/scripts/gpu-check" --dry-run > "$tmp/stdout" 2>&1
rc=$?
[ $rc -eq 0 ] || fail "exit status $rc, expected 0"
grep -q "rank/rank_main.cc" "$tmp/stdout" || fail "the plan does not name the rank entry"
grep -qE "/rank/bin/meshrun train -f .* --set resources.device=cuda .* -o json" "$tmp/stdout" ||
  fail "no cuda run of the carried \`meshrun train\`"
grep -qE "/rank/bin/meshrun train -f .* --set resources.device=cpu --set train.precision=fp32" \
  "$tmp/stdout" || fail "no cpu reference run of the carried \`meshrun train\`"
grep -q "meshrun-train" "$tmp/stdout" && fail "the plan names meshrun-train"
grep -qE "^ +[0-9]+ bin/meshrun " "$tmp/stdout" || fail "bin/meshrun is not listed with its size"
grep -qE "^ +[0-9]+ lib/ld-linux-x86-64.so.2 " "$tmp/stdout" || fail "the loader is not carried"
grep -qE "lib/lib(cudart|nccl)" "$tmp/stdout" && fail "CUDA's runtime or NCCL would be carried"
echo "ok: the unpacked plan names the rank entry and lists the carried files with sizes"

# Packed (only where the binary has the CUDA path): the plan shows the bundle and its contents.
if ldd "$bin" | grep -q libcudart; then
  GPU_CHECK_RANK_BIN="$bin" GPU_CHECK_CARRY="$tmp/carry" GPU_CHECK_BUILD_DIR="$tmp/build" \
    bash "$root/scripts/gpu-check" --pack > "$tmp/stdout" 2>&1 || fail "--pack failed"
  GPU_CHECK_RANK_BIN="$bin" GPU_CHECK_CARRY="$tmp/carry" \
    bash "$root/scripts/gpu-check" --dry-run > "$tmp/stdout" 2>&1 || fail "--dry-run failed"
  grep -qE "^  [0-9]+ $tmp/carry/rank.tar.gz$" "$tmp/stdout" || fail "the bundle is not listed"
  grep -qE "^    [0-9]+ bin/meshrun$" "$tmp/stdout" || fail "the bundle's meshrun is not listed"
  grep -q "meshrun-train" "$tmp/stdout" && fail "the plan names meshrun-train"
  echo "ok: the packed plan lists the bundle"
else
  echo "note: $bin has no CUDA path; --pack not tried"
fi
