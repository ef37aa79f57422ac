#!/bin/bash
# s25.sh OUTDIR -- the twenty-fifth session's device calls, from the
# repository root with build/ carried.  Parts (S25_PARTS; S25_SECONDS
# bounds the whole, default 570):
#   unrun  what ran on no GPU yet: b84e869's gpu_backward_param_grads_sets,
#          gpu_backward_mods and gpu_backward_param_grads with the
#          backward's list of recent launches (3e45dd1), gpu_cli (run
#          --backward --deterministic --check), then the package's tests
#          with TrainCall / ModsCall's cached entries (4dab5bf, 3e8de4c).
#   bwd, train  bench/probes/s24.sh's parts of those names (the H200's
#          bar figures: T12 and R2 again).
# Its parts fuse and fusencu (the dQ conversion in the main kernel,
# docs/PERF.md T16 and C40) went with the conversion in the
# twenty-seventh session.
set -u
. bench/probes/parts_lib.sh
parts_start s25 "${1:-}" ${S25_SECONDS:-570}
echo "s25 gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
part_unrun() {
  # shellcheck disable=SC2086
  gpu_tests /tmp/s25-unrun 'FAIL|failed' ${S25_UNRUN_TESTS:-gpu_backward_param_grads_sets:120 \
    gpu_backward_param_grads:150 gpu_backward_mods:200}
  (FLASHJIT_CACHE_DIR=/tmp/s25-cli timeout $(bound 200) sh tests/cli_gpu.sh build/flashjit >"$out/gpu_cli.log" 2>&1
   echo "gpu_cli: exit $?"; grep -E 'FAIL|deterministic' "$out/gpu_cli.log" | head -6 | cut -c1-200)
  (cd python/tests && PYTHONPATH=..:. FLASHJIT_LIB=$root/build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s25-py \
    timeout $(bound 240) python3 -m unittest test_train test_train_varlen test_calls test_gpu \
    >"$out/pytests.log" 2>&1; echo "pytests: exit $?"; tail -4 "$out/pytests.log"
   grep -E '^(FAIL|ERROR):' "$out/pytests.log" | head -8)
}
part_bwd() { S24_PARTS=bwd S24_BWD_DIMS=${S25_BWD_DIMS:-64,128,256} S24_SECONDS=$(bound 560) bash bench/probes/s24.sh "$out/s24"; }
part_train() { S24_PARTS=train S24_SECONDS=$(bound 560) bash bench/probes/s24.sh "$out/s24"; }
parts_run s25 ${S25_PARTS:-unrun}
