#!/bin/bash
# qkvviews.sh OUTDIR -- bench/probes/qkvviews.patch (prepared without a
# GPU on 2026-12-07; Python only): an eager backward (the built-in masks'
# and the expressions') reads q, k and v of a fused QKV projection where
# they are (no dense copies; strided views whose elements do not overlap)
# and lays dq, dk, dv out as views of one buffer the projection's size.  No GPU has run a backward on such
# strided inputs (the package copied them dense): this checks it.  From
# the repository root with build/ carried.  Parts (QV_PARTS; QV_SECONDS
# bounds the whole, default 560):
#   tests  the patched package's GPU tests of the backward (test_gpu's
#          Backward, with test_bshd_and_views: packed qkv against the
#          float32 reference), test_train (gpt_train.py's 20 steps, whose
#          gradients are checked against a float32 run's) and
#          test_train_varlen (packed varlen views)
#   time   bench/probes/qkv_views.py under main's package and the
#          patched one, alternately, two rounds: fwd+bwd of a fused QKV
#          at (8,512,8/2,64), (4,4096,16,128), (1,8192,32/8,128) causal.
#          Predicted: three copies of the projection's size fewer a call
#          (about 3 x 3.8 us at the first shape, 3 x 50 us at the second).
#   gpt    examples/gpt_train.py --steps 300 under the patched package.
set -u
. bench/probes/parts_lib.sh
parts_start qkvviews "${1:-}" ${QV_SECONDS:-560}
echo "qkvviews gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
qv=/tmp/qv-root
rm -rf $qv && mkdir -p $qv && cp -r python examples $qv/ && (cd $qv && { git apply "$root/bench/probes/qkvviews.patch" 2>/dev/null || patch -p1 -s <"$root/bench/probes/qkvviews.patch"; }) ||
  { echo "qkvviews: the patch does not apply"; exit 1; }
part_tests() {
  (cd $qv/python/tests && PYTHONPATH=$qv/python FLASHJIT_LIB=$root/build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/qv-cache \
     timeout $(bound 300) python3 -m unittest test_gpu test_train test_train_varlen test_calls >"$out/tests.log" 2>&1
   echo "tests (patched): exit $?"; grep -E "^(FAIL|ERROR):|^Ran|^OK|^FAILED" "$out/tests.log" | head -12)
}
part_time() {
  local round
  for round in 1 2; do
    QV_TAG=" main" PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/qv-cache \
      timeout $(bound 90) python3 bench/probes/qkv_views.py 2>&1 | grep -v Warning | tee -a "$out/time.log" | grep "^qkv_views"
    QV_TAG=" patched" PYTHONPATH=$qv/python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/qv-cache \
      timeout $(bound 90) python3 bench/probes/qkv_views.py 2>&1 | grep -v Warning | tee -a "$out/time.log" | grep "^qkv_views"
  done
}
part_gpt() {
  PYTHONPATH=$qv/python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/qv-cache timeout $(bound 150) \
    python3 examples/gpt_train.py --steps 300 >"$out/gpt_train.log" 2>&1
  echo "gpt_train (patched): exit $?"; tail -8 "$out/gpt_train.log"
}
parts_run qkvviews ${QV_PARTS:-tests time gpt}
