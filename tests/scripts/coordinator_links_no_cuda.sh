#!/bin/bash
# The coordinator links no CUDA library: the planner and its memory model reach it through
# meshrun_planning, which holds no device code (with cuBLASLt and cudart linked in, its metrics
# server once failed to start on any port). Usage: coordinator_links_no_cuda.sh BIN_DIR CUDA_ENABLED
set -u
bin="$1"
if [ "$2" != "ON" ]; then
  echo "skipped: this tree is built without CUDA, so nothing could link it"
  exit 77
fi
status=0
for exe in meshrun-coordinator; do
  if [ ! -x "$bin/$exe" ]; then
    echo "skipped: $bin/$exe is not built"
    exit 77
  fi
  found=$(ldd "$bin/$exe" | grep -E 'libcudart|libcublas|libnccl|libcuda\.so' || true)
  if [ -n "$found" ]; then
    echo "FAIL: $exe links CUDA libraries:"
    echo "$found"
    status=1
  else
    echo "ok: $exe links no CUDA library"
  fi
done
exit $status
