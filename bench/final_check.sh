#!/bin/bash
# final_check.sh -- one device call's check of a session's kernels, from the
# repository root with build/ carried: the GPU tests the session touched
# (FP8, the integer-semantics and exactness checks, the families' axes,
# the backward) and the package's GPU tests for them.  FINAL_TESTS and
# PY_TESTS replace the lists.  Logs go to $OUT.
set -u
out=${OUT:-/tmp/fj-out}
mkdir -p "$out"
root=$(pwd)
if [ "$root" != /work/main ] && [ ! -e /work/main ]; then
  mkdir -p /work && ln -s "$root" /work/main
fi
export FLASHJIT_CACHE_DIR=/tmp/fj-cache FJT_DATA_DIR=/work/main/tests/data
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
cd /work/main/build || exit 1
for t in ${FINAL_TESTS:-gpu_lut_probe gpu_lut_e4m3 gpu_fp8_forward gpu_mods_int_ops gpu_exact_single_key gpu_cli gpu_wgmma_axes gpu_mma_axes gpu_mods_builtins gpu_attention_auto gpu_backward}; do
  if [ "$t" = gpu_cli ]; then
    timeout 300 ctest -R '^gpu_cli$' --output-on-failure >"$out/$t.log" 2>&1
  else
    timeout 300 ./tests/fj_tests "$t" >"$out/$t.log" 2>&1
  fi
  echo "$t: exit $? ($(grep -cE '(^| )ok( |$)' "$out/$t.log") ok lines, $(grep -c 'FAIL' "$out/$t.log") FAIL lines)"
  grep -E "FAIL|check failed" "$out/$t.log" | head -4
done
cd /work/main/python/tests
PYTHONPATH=/work/main/python FLASHJIT_LIB=/work/main/build/libflashjit.so timeout 400 \
  python3 -m unittest ${PY_TESTS:-test_gpu.Exact test_gpu.Fp8 test_train} >"$out/python.log" 2>&1
echo "python: exit $? $(grep -E '^Ran|^OK|^FAILED' "$out/python.log" | tr '\n' ' ')"
grep -E "^(FAIL|ERROR):" -A8 "$out/python.log" | head -30
