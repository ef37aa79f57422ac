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
# (1) gpu_fp8_forward, gpu_fp8_out, gpu_fp8_needle, gpu_wgmma_axes with
# set w4 (the test binary is the tree's); (2) `flashjit run` medians (FP8,
# then bf16 at d64), the tree and each set in turn, two rounds (the bf16
# rows change only under w4: their spread).  FP8_POLY_TEST_TIMEOUT (default
# 100 s) a test.
set -u
out=${1:-/tmp}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
# Sets: 2, 4, 8 (FP8 at head dims up to 128, one exponential in k), and
# w4 (k = 4 there and for 16-bit head dims up to 64 too: d64's 16-bit
# products take as long per exponential as d128's FP8 ones).
for k in 2 4 8 w4; do
  rm -rf /tmp/fj-poly$k && mkdir /tmp/fj-poly$k && cp -r "$here/../../templates" /tmp/fj-poly$k/
  (cd /tmp/fj-poly$k && git apply "$here/fp8_poly.patch") || { echo "fp8_poly: the patch does not apply"; exit 1; }
  if [ $k = w4 ]; then
    sed -i "s/FP8 and D <= 128 and 4 or nil/(FP8 and D <= 128 or not FP8 and D <= 64) and 4 or nil/" /tmp/fj-poly$k/templates/attention_wgmma.cu
  else
    sed -i "s/FP8 and D <= 128 and 4 or nil/FP8 and D <= 128 and $k or nil/" /tmp/fj-poly$k/templates/attention_wgmma.cu
  fi
  grep -q "D <= 128 and ${k#w} or nil\|D <= 64) and 4 or nil" /tmp/fj-poly$k/templates/attention_wgmma.cu || { echo "fp8_poly: set $k not made"; exit 1; }
done
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
for t in ${FP8_POLY_TESTS-gpu_fp8_forward gpu_fp8_out gpu_fp8_needle gpu_wgmma_axes}; do
  FLASHJIT_TEMPLATE_DIR=/tmp/fj-polyw4/templates timeout ${FP8_POLY_TEST_TIMEOUT:-100} ./tests/fj_tests $t >"$out/poly_$t.log" 2>&1
  echo "poly w4 $t: exit $? ($(grep -c ' ok$\|^ok ' "$out/poly_$t.log") ok, $(grep -c FAIL "$out/poly_$t.log") FAIL)"
  grep -E "FAIL|max rel" "$out/poly_$t.log" | head -6
done
for round in 1 2; do
  while IFS= read -r args; do
    line="r$round $args:"
    for t in tree 2 4 8 w4; do
      dir=$([ "$t" = tree ] || echo "/tmp/fj-poly$t/templates")
      us=$(FLASHJIT_TEMPLATE_DIR=$dir timeout 60 ./flashjit run $args --iters 30 2>&1 |
           tee -a "$out/poly_run_$t.log" | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      line="$line k$t ${us:-?}"
    done
    echo "$line us" | sed 's/ ktree / tree /; s/ kw4 / w4 /' | tee -a "$out/poly_times.txt"
  done <<EOF2
--shape 8,16,2048,128 --dtype e4m3
--shape 8,16,2048,128 --dtype e4m3 --causal
--shape 2,16,8192,128 --dtype e4m3
--shape 2,16,8192,128 --dtype e4m3 --causal
--shape 8,32,2048,64 --dtype e4m3
--shape 2,8,8192,256 --dtype e4m3
--shape 8,32,2048,64 --dtype bf16
--shape 8,32,2048,64 --dtype bf16 --causal
--shape 2,32,8192,64 --dtype bf16
EOF2
done
