#!/usr/bin/env bash
# The GPU check of epcomm's CUDA path, in one command, on a machine with an
# NVIDIA GPU (sm_90: H100/H200) and the CUDA toolkit (NCCL optional):
#
#   bench/gpu/check.sh [epcomm_gpu_check options]     (see docs/cuda.md)
#
# Builds epcomm_gpu_check with -arch=sm_90 (Release), then runs it: the copy
# roofline, correctness of every kernel against the host reference and the
# host engine on 1, 2 and 4 ranks (processes sharing the GPUs), bf16 / fp8 /
# fp32, the failure paths, and the timing table (CUDA events, median of >= 20
# timed iterations after warm-up) against the roofline and NCCL; then the same
# for the low-latency kernels (bf16 and fp8 wire, against the host
# low-latency engine) with a table of each phase's time, and kernels that
# drive libfabric and UCX through the proxy ring (when their -dev packages
# are installed; loopback unless FI_PROVIDER / UCX_TLS say otherwise). Exits
# non-zero on any mismatch or failure. Budget: under 8 minutes on one H200
# (build about 1-2 minutes with all cores, run about 2-4).
#
# EPCOMM_GPU_BUILD_DIR  build directory (default: <repo>/build/gpu-check)
# EPCOMM_GPU_RUN_LIMIT  seconds the run may take before it is killed (default 420)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${EPCOMM_GPU_BUILD_DIR:-$repo/build/gpu-check}
limit=${EPCOMM_GPU_RUN_LIMIT:-420}
start=$SECONDS

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_mode --format=csv
fi

generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$repo" -B "$build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release \
  -DEPCOMM_ENABLE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DEPCOMM_BUILD_TESTS=OFF \
  -DEPCOMM_BUILD_EXAMPLES=OFF \
  -DEPCOMM_BUILD_BENCH=ON \
  -DEPCOMM_INSTALL=OFF >/dev/null
cmake --build "$build" --target epcomm_gpu_check -j "$(nproc)"
echo "check.sh: built in $((SECONDS - start)) s"

rc=0
timeout --signal=TERM --kill-after=10 "$limit" "$build/bench/gpu/epcomm_gpu_check" "$@" || rc=$?
if [[ $rc -eq 124 ]]; then
  echo "check.sh: FAIL: the run exceeded ${limit} s" >&2
fi
echo "check.sh: total $((SECONDS - start)) s, exit $rc"
exit "$rc"
