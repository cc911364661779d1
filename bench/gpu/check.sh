#!/usr/bin/env bash
# The GPU check of epcomm's CUDA path, in one command, on a machine with an
# NVIDIA GPU (sm_90: H100/H200) and the CUDA toolkit (NCCL optional):
#
#   bench/gpu/check.sh [epcomm_gpu_check options]     (see docs/cuda.md)
#
# Builds epcomm_gpu_check as the gpu-release preset says (Release,
# -arch=sm_90; CI compiles the same), then runs it twice: a first pass of the
# quick correctness scenarios without timing and with a 10 s deadline on every
# wait, so that a hang costs seconds and a broken kernel is reported before
# anything slow runs; then, if that passed, the full check (the roofline,
# every kernel against the host reference and the host engine on 1, 2 and 4
# ranks, bf16 / fp8 / fp32, the failure paths, the timing tables against the
# roofline and NCCL, the low-latency kernels, and the GPU-fed proxy over
# libfabric and UCX when their -dev packages are installed). Exits non-zero on
# any mismatch or failure. The whole script stays under 8 minutes on one H200
# (build about 1-2 minutes with all cores): each pass is killed when the
# budget runs out.
#
# Ranks are processes; with fewer GPUs than ranks several share one, which in
# Exclusive_Process compute mode fails and otherwise time-slices every spin
# handshake. So when ranks share a GPU the script starts MPS (its own control
# daemon, pipes under the output folder, stopped at exit) and leaves the
# GPU's settings alone.
#
# OUT                    folder for the logs (default: <build>/check-out)
# EPCOMM_GPU_BUILD_DIR   build directory (default: <repo>/build/gpu-release)
# EPCOMM_GPU_BUDGET      seconds for the whole script (default 480)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${EPCOMM_GPU_BUILD_DIR:-$repo/build/gpu-release}
out=${OUT:-$build/check-out}
budget=${EPCOMM_GPU_BUDGET:-480}
start=$SECONDS
mkdir -p "$out"
exec > >(tee -a "$out/check.log") 2>&1

left() { echo $((budget - (SECONDS - start))); }

gpus=0
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,compute_mode --format=csv |
    tee "$out/gpus.csv"
  gpus=$(($(wc -l <"$out/gpus.csv") - 1))
fi

# The most ranks any case uses: --ranks when given, else 4.
max_ranks=4
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; ++i)); do
  if [[ ${args[i]} == --ranks ]]; then
    max_ranks=$(tr ',' '\n' <<<"${args[i + 1]}" | sort -n | tail -1)
  fi
done

if ((gpus > 0 && gpus < max_ranks)); then
  if command -v nvidia-cuda-mps-control >/dev/null; then
    export CUDA_MPS_PIPE_DIRECTORY=$out/mps-pipe CUDA_MPS_LOG_DIRECTORY=$out/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
      trap 'echo quit | nvidia-cuda-mps-control || true' EXIT
      echo "check.sh: up to $max_ranks ranks on $gpus GPU(s): MPS started"
    else
      echo "check.sh: up to $max_ranks ranks on $gpus GPU(s): MPS did not start; shared cases may fail or crawl"
    fi
  elif grep -q Exclusive_Process "$out/gpus.csv"; then
    echo "check.sh: Exclusive_Process and no MPS: cases with ranks sharing a GPU will fail at start"
  fi
fi

cd "$repo"
generator=()
if ! command -v ninja >/dev/null; then generator=(-G "Unix Makefiles"); fi
# Warnings stay warnings here: a toolkit or host compiler newer than CI's must
# not lose the run at the build (CI builds the same preset with -Werror).
cmake --preset gpu-release -B "$build" "${generator[@]}" -DEPCOMM_WARNINGS_AS_ERRORS=OFF \
  >"$out/configure.log"
cmake --build "$build" --target epcomm_gpu_check -j "$(nproc)" >"$out/build.log" 2>&1 || {
  tail -50 "$out/build.log"
  echo "check.sh: FAIL: build (log: $out/build.log)"
  exit 1
}
echo "check.sh: built in $((SECONDS - start)) s"

# One pass of the check program, killed when the budget runs out.
run() {
  local name=$1 limit
  shift
  limit=$(left)
  if ((limit < 30)); then
    echo "check.sh: FAIL: no time left for the $name pass"
    return 1
  fi
  echo "check.sh: $name pass: $*  (limit ${limit} s)"
  local rc=0
  timeout --signal=TERM --kill-after=10 "$limit" "$build/bench/gpu/epcomm_gpu_check" "$@" \
    >"$out/$name.log" 2>&1 || rc=$?
  cat "$out/$name.log"
  if ((rc == 124)); then echo "check.sh: FAIL: the $name pass ran out of time"; fi
  echo "check.sh: $name pass exit $rc"
  return "$rc"
}

rc=0
EPCOMM_TIMEOUT_MS=10000 run quick --quick --no-timing "$@" || rc=$?
if ((rc == 0)); then run full "$@" || rc=$?; fi
echo "check.sh: total $((SECONDS - start)) s, exit $rc; logs in $out"
exit "$rc"
