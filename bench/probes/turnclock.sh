#!/bin/bash
# turnclock.sh: how much of the deterministic backward's extra time is spent
# spinning in the dQ turn waits (bwd_common.cuh's dq_turn_wait) of the wgmma
# kernel.  With FLASHJIT_BWD_TURNCLOCK=1 the patched library renders the main
# kernel with `turnclock` (symbol suffix _tclk): each waiting thread (narrow
# kernel, D <= 128: the dQ writer, one per block; wide kernel, D 192/256:
# lane 0 of each of the 8 consumer warps) times its waits with clock(); the
# walk's clocks of those threads are summed too; a one-thread kernel
# <symbol>_report launched after each backward prints
#   turnclock: kernel ... hd D det N blocks B waiters W/W waits .. spun ..
#   wait_cycles C loop_cycles L (wait/loop X%, Y cycles/wait)
# (det: 1 plain, 2 rotated, 3 descending walk; spun: waits whose first read
# saw the turn short).  One summary per shape: the last line printed.
# Caveats: D 96/128 without a mask spill 8 bytes in the instrumented kernel;
# the narrow writer's waits go to global atomics per wait.
#
# Build build-tc (on any machine with the CUDA toolkit headers; no GPU):
#   git worktree add /tmp/tc HEAD && cd /tmp/tc && git apply bench/probes/turnclock.patch
#   (or: git apply /path/to/turnclock.patch)
#   cmake -S . -B build -DFLASHJIT_WERROR=ON && cmake --build build -j
#   slim: rm -rf build/CMakeFiles build/tests/CMakeFiles build/tests/consumer \
#         build/fj_templates.c build/Testing; find build -name '*.a' -delete
#   copy /tmp/tc/build to <repo>/build-tc, run this script from the repo root.
set -u
cd "$(dirname "$0")/../.." || exit 1
[ -x build-tc/flashjit ] || { echo "turnclock.sh: build-tc/flashjit missing (see header)"; exit 1; }
cd build-tc || exit 1
START=$(date +%s)
BUDGET=${TURNCLOCK_BUDGET:-500}
run() {  # run SHAPE-ARGS...
  local now=$(date +%s)
  if (( now - START > BUDGET - 60 )); then echo "skip (budget): $*"; return; fi
  local out
  out=$(FLASHJIT_BWD_TURNCLOCK=1 FLASHJIT_CACHE_DIR=/tmp/tc-cache timeout 60 \
        ./flashjit run --backward --deterministic --dtype bf16 --iters 5 "$@" 2>&1)
  local rc=$?
  local line=$(printf '%s\n' "$out" | grep '^turnclock:' | tail -1)
  echo "shape $* rc=$rc lines=$(printf '%s\n' "$out" | grep -c '^turnclock:')"
  echo "  ${line:-NO turnclock LINE; tail: $(printf '%s\n' "$out" | tail -2 | tr '\n' ' ')}"
}
# The bar's misses first (GQA, d96, d192), then the head dims that meet it.
run --shape 1,32,8192,128 --heads-kv 8 --causal
for D in 96 192 128 64 256; do
  for S in "8,16,2048,$D" "2,16,8192,$D"; do
    run --shape "$S"
    run --shape "$S" --causal
  done
done
echo "total $(( $(date +%s) - START )) s"
