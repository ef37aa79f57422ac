#!/bin/bash
# s27.sh OUTDIR -- the twenty-seventh session's device call, from the
# repository root with build/ carried.  Parts (S27_PARTS; S27_SECONDS
# bounds the whole, default 570):
#   detpg  the parameters' gradients in the deterministic mode (ba3c89c:
#          fixed point in the workspace): gpu_backward_param_grads_
#          deterministic (against the reference, the same bits twice),
#          gpu_backward_param_grads and _sets (the default mode, whose
#          kernel now branches on the words' pointer), the package's
#          test_train.Training.test_deterministic_param_grads, then
#          bench/probes/detpg_time.py (its cost: predicted about 1.0-1.1x
#          the default mode's relbias call beside the plain call's own
#          deterministic cost, two 64-bit atomics where one float32 was).
#   tune   gpu_tune_split (fj_tune on 192 / 128 with e407ea2's fix: wgmma
#          candidates alone), gpu_backward_param_grads_deterministic (with
#          f1f85d8's loose-plan refusal), gpu_backward_deterministic (its
#          padded d40/d72 cases), the package's tune test for split dims.
#          (detpg ran on an H100: PERF.md C41, R8; gpu_backward whole at
#          2caa448: C42.)
set -u
. bench/probes/parts_lib.sh
parts_start s27 "${1:-}" ${S27_SECONDS:-570}
echo "s27 gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
part_detpg() {
  gpu_tests /tmp/s27-pg 'FAIL|failed|differ|DIFFER|deterministic:' gpu_backward_param_grads_deterministic:200 \
    gpu_backward_param_grads:120 gpu_backward_param_grads_sets:60
  (cd python/tests && PYTHONPATH=..:. FLASHJIT_LIB=$root/build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s27-py \
    timeout $(bound 120) python3 -m unittest test_train.Training.test_deterministic_param_grads >"$out/py.log" 2>&1
   echo "py: exit $?"; tail -3 "$out/py.log"; grep -E '^(FAIL|ERROR):|Error:' "$out/py.log" | head -8)
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s27-py \
    timeout $(bound 150) python3 bench/probes/detpg_time.py 2>&1 | tail -5
}
part_tune() {
  gpu_tests /tmp/s27-tune 'FAIL|failed|differ|tuned|refused' gpu_tune_split:150 \
    gpu_backward_param_grads_deterministic:150 gpu_backward_deterministic:150
  (cd python/tests && PYTHONPATH=..:. FLASHJIT_LIB=$root/build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s27-py \
    timeout $(bound 100) python3 -m unittest test_gpu.Inspection.test_tune_split_head_dims >"$out/pytune.log" 2>&1
   echo "pytune: exit $?"; tail -3 "$out/pytune.log")
}
parts_run s27 ${S27_PARTS:-detpg tune}
