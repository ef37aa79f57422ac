#!/bin/bash
# device_check.sh [COMMIT] -- everything one device call checks, from the
# repository root with build/ carried: the GPU tests, compute-sanitizer on a
# GPU test, the demo, and timed, checked runs of the CLI.  Full logs go to
# $OUT; the summary is printed last.
set -u
out=${OUT:-/tmp/fj-out}
mkdir -p "$out"
root=$(pwd)
# The build folder was configured at /work/main on the build machine; ctest
# and the tests find their files there.
if [ "$root" != /work/main ] && [ ! -e /work/main ]; then
  mkdir -p /work && ln -s "$root" /work/main
fi
export FLASHJIT_CACHE_DIR=/tmp/fj-cache FJT_DATA_DIR=/work/main/tests/data
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
cd /work/main/build || exit 1
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

note "commit ${1:-unknown}; $(date -u +%Y-%m-%dT%H:%MZ)"
note "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader)"

# 1. GPU tests (ctest label gpu), verbose so every case's error is logged.
ctest -L gpu -V --timeout 900 >"$out/ctest_gpu.log" 2>&1
note "ctest -L gpu: exit $? ($(grep -c ' ok$' "$out/ctest_gpu.log") ok lines, $(grep -c 'FAIL' "$out/ctest_gpu.log") FAIL lines)"
grep -E "tests passed|cases passed|matches the reference|slots 0-7" "$out/ctest_gpu.log" | tee -a "$summary"
awk '/rel_err=/ {split($0, a, "rel_err="); split(a[2], b, " "); if (b[1] + 0 > m) m = b[1] + 0} END {print "largest rel_err over the GPU cases: " m}' "$out/ctest_gpu.log" | tee -a "$summary"

# 2. compute-sanitizer on the LUT probe and the automatic-variant test.
for tool in memcheck racecheck; do
  for t in gpu_lut_probe gpu_attention_auto; do
    compute-sanitizer --tool $tool --error-exitcode 9 ./tests/fj_tests $t >"$out/san_${tool}_$t.log" 2>&1
    note "compute-sanitizer --tool $tool fj_tests $t: exit $? ($(grep -m1 'ERROR SUMMARY' "$out/san_${tool}_$t.log" | sed 's/=* //'))"
  done
done

# 3. The demo, then timed runs with --check (median of --iters, events).
./flashjit-demo >"$out/demo.log" 2>&1
note "demo: exit $?; $(tail -1 "$out/demo.log")"
./flashjit lut >"$out/lut.log" 2>&1
for args in "1,8,512,64" "1,8,512,64 --causal" "2,8,2048,64" "2,8,2048,64 --causal" \
            "2,8,2048,128" "2,8,2048,128 --dtype bf16" "4,16,4096,128"; do
  ./flashjit run --shape $args --check --iters 30 >"$out/run.log" 2>&1
  rc=$?
  note "run --shape $args: exit $rc | $(grep -E '^variant' "$out/run.log" | cut -c10-) | $(grep -E '^time' "$out/run.log") | $(grep -oE 'rel_err=[^ ]+|PASS|FAIL' "$out/run.log" | tr '\n' ' ')"
  cat "$out/run.log" >>"$out/runs.log"
done
