#!/usr/bin/env bash
# Compiler launcher for the CUDA objects whose kernels CI checks for stack
# use (tests/cuda/check_stack_frames.cmake): runs the compile, which carries
# -Xptxas=-v, keeps ptxas's per-function report next to the object as
# <object>.ptxas, and passes every other line of output through, so the
# build log stays as it was.
set -uo pipefail

object=
args=("$@")
for ((i = 0; i + 1 < ${#args[@]}; ++i)); do
  if [[ ${args[i]} == -o ]]; then object=${args[i + 1]}; fi
done

output=$("$@" 2>&1)
rc=$?
report='^(ptxas info *:|[[:space:]]+[0-9]+ bytes stack frame)'
if [[ -n $object ]]; then
  grep -E "$report" <<<"$output" >"$object.ptxas" || true
fi
grep -Ev "$report" <<<"$output" >&2 || true
exit "$rc"
