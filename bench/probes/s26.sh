#!/bin/bash
# s26.sh OUTDIR -- the twenty-sixth session's device call for the next
# one, from the repository root with build/ carried.  Parts (S26_PARTS;
# S26_SECONDS bounds the whole, default 570):
#   fuseparts  which part of the dQ conversion costs the converting
#          backward its time (FLASHJIT_BWD_FUSE=1 ran 1.19x slower than
#          the postprocess on the H100, C40).  The variants of
#          bench/probes/fuse_variants.py (D: no conversion work; F1: the
#          converter counts every step but never converts; F2: F1 without
#          the writer's arrivals; F3: F2 without the count) beside post
#          (FLASHJIT_BWD_FUSE=0) and fused, each `flashjit run --backward`
#          --iters 30, two rounds, causal (4, 16, 4096, 128) and
#          (2, 16, 8192, 128).  The variants' dQ is wrong (no
#          postprocess): only their times mean anything.  Predicted from
#          C40: D 0.95 of post causal (no postprocess), F1 near fused
#          causal if key tile 0's block's conversions (every tile of its
#          head) are the cost there.
#   py     the package's GPU tests of this session's Python (FP8 k/v
#          under a 16-bit q through attention(); head dims padded to 8):
#          test_gpu.Fp8KV, Shapes.test_head_dims_not_multiples_of_8,
#          Backward.test_head_dim_not_multiple_of_8, LibraryErrors.
#   pad    gpu_backward whole (every case on sm_90a, then on plain sm_90:
#          the mma backward, with its padded head dims 8, 40, 56, 72, 120,
#          200 and the 80-240 cases, which skipped there before 736cc8f),
#          then gpu_backward_deterministic (its d40 and d72 cases).
set -u
. bench/probes/parts_lib.sh
parts_start s26 "${1:-}" ${S26_SECONDS:-570}
out=$(cd "$out" && pwd)
echo "s26 gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
part_fuseparts() {
  python3 bench/probes/fuse_variants.py /tmp/s26-fv >/dev/null || return
  local v args=()
  for v in post:0 fused:1; do
    printf '#!/bin/sh\nFLASHJIT_BWD_FUSE=%s exec %s/build/flashjit "$@"\n' "${v#*:}" "$root" >"$root/build/flashjit-${v%%:*}"
    chmod +x "$root/build/flashjit-${v%%:*}"
    args+=("${v%%:*}=build/flashjit-${v%%:*} --backward")
  done
  for v in D F1 F2 F3; do
    printf '#!/bin/sh\nFLASHJIT_BWD_FUSE=1 FLASHJIT_TEMPLATE_DIR=/tmp/s26-fv/tmpl-%s exec %s/build/flashjit "$@"\n' "$v" "$root" >"$root/build/flashjit-$v"
    chmod +x "$root/build/flashjit-$v"
    args+=("$v=build/flashjit-$v --backward")
  done
  FLASHJIT_CACHE_DIR=/tmp/s26-fp rows parts bf16 "${S26_SHAPES:-4,16,4096,128 --causal;2,16,8192,128}" "${args[@]}"
}
part_py() {
  (cd python/tests && PYTHONPATH=..:. FLASHJIT_LIB=$root/build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s26-py \
    timeout $(bound 240) python3 -m unittest test_gpu.Fp8KV test_gpu.Shapes.test_head_dims_not_multiples_of_8 \
    test_gpu.Backward.test_head_dim_not_multiple_of_8 test_gpu.LibraryErrors >"$out/py.log" 2>&1
   echo "py: exit $?"; tail -3 "$out/py.log"; grep -E '^(FAIL|ERROR):|Error:' "$out/py.log" | head -8)
}
part_pad() {
  gpu_tests /tmp/s26-pad 'FAIL|failed|differ' gpu_backward:330 gpu_backward_deterministic:150
}
parts_run s26 ${S26_PARTS:-py pad fuseparts}
