#!/bin/bash
# fp8_poly.sh OUTDIR -- the FP8 forward's exponentials partly on the FMA
# pipe (fp8_poly.patch, branch fp8poly: common.cuh's poly_exp2, a cubic of
# max relative error 1.0e-4; softmax_regs.cuh's exp_poly = k sends one
# exponential in k there), against the tree's templates, from build/ on
# the GPU machine.  Prepared 2026-12-05 without a GPU: at head dim 128 the
# FP8 softmax keeps the SFU busier than the products keep the tensor cores
# (docs/PERF.md's FP8 section: tensor pipe 43%); with k = 4 the d128
# kernel's SASS has 100 MUFU.EX2 instead of 132 (+96 FFMA, +96 FADD), 168
# registers, no spills.  Prediction: 5-12% less time at d128, none at 256
# (untouched).
# (1) gpu_fp8_forward, gpu_fp8_out, gpu_fp8_needle with k = 4 (the test
# binary is the tree's); (2) `flashjit run --dtype e4m3` medians, the tree
# and k = 2, 4, 8 in turn, two rounds.  FP8_POLY_TEST_TIMEOUT (default
# 100 s) a test.
set -u
out=${1:-/tmp}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
for k in 2 4 8; do
  rm -rf /tmp/fj-poly$k && mkdir /tmp/fj-poly$k && cp -r "$here/../../templates" /tmp/fj-poly$k/
  (cd /tmp/fj-poly$k && git apply "$here/fp8_poly.patch") || { echo "fp8_poly: the patch does not apply"; exit 1; }
  sed -i "s/FP8 and D <= 128 and 4 or nil/FP8 and D <= 128 and $k or nil/" /tmp/fj-poly$k/templates/attention_wgmma.cu
  grep -q "D <= 128 and $k or nil" /tmp/fj-poly$k/templates/attention_wgmma.cu || { echo "fp8_poly: k=$k not set"; exit 1; }
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
for t in ${FP8_POLY_TESTS-gpu_fp8_forward gpu_fp8_out gpu_fp8_needle}; do
  FLASHJIT_TEMPLATE_DIR=/tmp/fj-poly4/templates timeout ${FP8_POLY_TEST_TIMEOUT:-100} ./tests/fj_tests $t >"$out/poly_$t.log" 2>&1
  echo "fp8 poly4 $t: exit $? ($(grep -c ' ok$\|^ok ' "$out/poly_$t.log") ok, $(grep -c FAIL "$out/poly_$t.log") FAIL)"
  grep -E "FAIL|max rel" "$out/poly_$t.log" | head -6
done
for round in 1 2; do
  while IFS= read -r args; do
    line="fp8 r$round $args:"
    for t in tree 2 4 8; do
      dir=$([ "$t" = tree ] || echo "/tmp/fj-poly$t/templates")
      us=$(FLASHJIT_TEMPLATE_DIR=$dir timeout 60 ./flashjit run $args --dtype e4m3 --iters 30 2>&1 |
           tee -a "$out/poly_run_$t.log" | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      line="$line k$t ${us:-?}"
    done
    echo "$line us" | sed 's/ ktree / tree /' | tee -a "$out/poly_times.txt"
  done <<EOF2
--shape 8,16,2048,128
--shape 8,16,2048,128 --causal
--shape 2,16,8192,128
--shape 2,16,8192,128 --causal
--shape 8,32,2048,64
--shape 2,8,8192,256
EOF2
done
