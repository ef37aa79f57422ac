#!/bin/bash
# s28.sh OUTDIR -- the twenty-eighth session's device calls, from the
# repository root with build/ carried.  Parts (S28_PARTS; S28_SECONDS
# bounds the whole, default 570):
#   check  what ran on no GPU: s27.sh's tune (gpu_tune_split with
#          e407ea2's fix, f1f85d8's loose-plan refusal, the padded
#          deterministic d40/d72, the package's split-dims tune test),
#          then gpu_backward and gpu_backward_block_mask_deterministic
#          (c38e0b5's launch, 48f5f31's moves).
#   bwd    the backward's table beside cuDNN and flash on the H200
#          (bench/bwd_compare.py --quick, S28_BWD_DIMS, default 64,128,256).
#   train  issue 33's table (bench/train_mods_compare.py, every case).
set -u
. bench/probes/parts_lib.sh
parts_start s28 "${1:-}" ${S28_SECONDS:-570}
echo "s28 gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
part_check() {
  S27_PARTS=tune S27_SECONDS=$(bound 330) bash bench/probes/s27.sh "$out/s27"
  gpu_tests /tmp/s28-bwd 'FAIL|failed' gpu_backward:200 gpu_backward_block_mask_deterministic:90
}
part_bwd() {
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s28-bwd timeout $(bound 540) \
    python3 bench/bwd_compare.py --quick --dims ${S28_BWD_DIMS:-64,128,256} --out "$out/bwd" >"$out/bwd.log" 2>&1
  echo "s28 bwd: exit $?"
  grep -E "^bwd|geomean|Error" "$out/bwd.log" | cut -c1-260 | head -40
}
part_train() {
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s28-train timeout $(bound 560) \
    python3 bench/train_mods_compare.py --commit ${S28_COMMIT:-HEAD} --out "$out/train" >"$out/train.log" 2>&1
  echo "s28 train: exit $?"
  grep -E "^train|Error" "$out/train.log" | cut -c1-300 | head -30
}
parts_run s28 ${S28_PARTS:-check}
