#!/bin/bash
# s26.sh OUTDIR -- the twenty-sixth session's device call for the next
# one, from the repository root with build/ carried.  Parts (S26_PARTS;
# S26_SECONDS bounds the whole, default 570):
#   py     the package's GPU tests of this session's Python (FP8 k/v
#          under a 16-bit q through attention(); head dims padded to 8):
#          test_gpu.Fp8KV, Shapes.test_head_dims_not_multiples_of_8,
#          Backward.test_head_dim_not_multiple_of_8, LibraryErrors.
#   pad    gpu_backward whole (every case on sm_90a, then on plain sm_90:
#          the mma backward, with its padded head dims 8, 40, 56, 72, 120,
#          200 and the 80-240 cases, which skipped there before 736cc8f),
#          then gpu_backward_deterministic (its d40 and d72 cases).
# Its third part, fuseparts (the dQ conversion's variants, from
# bench/probes/fuse_variants.py), went unrun with the conversion in the
# twenty-seventh session (docs/PERF.md, T16).
set -u
. bench/probes/parts_lib.sh
parts_start s26 "${1:-}" ${S26_SECONDS:-570}
echo "s26 gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
part_py() {
  (cd python/tests && PYTHONPATH=..:. FLASHJIT_LIB=$root/build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s26-py \
    timeout $(bound 240) python3 -m unittest test_gpu.Fp8KV test_gpu.Shapes.test_head_dims_not_multiples_of_8 \
    test_gpu.Backward.test_head_dim_not_multiple_of_8 test_gpu.LibraryErrors >"$out/py.log" 2>&1
   echo "py: exit $?"; tail -3 "$out/py.log"; grep -E '^(FAIL|ERROR):|Error:' "$out/py.log" | head -8)
}
part_pad() {
  gpu_tests /tmp/s26-pad 'FAIL|failed|differ' gpu_backward:330 gpu_backward_deterministic:150
}
parts_run s26 ${S26_PARTS:-py pad}
