#!/bin/bash
# s25.sh OUTDIR -- the twenty-fifth session's device calls, from the
# repository root with build/ carried.  Parts (S25_PARTS; S25_SECONDS
# bounds the whole, default 570):
#   unrun  what ran on no GPU yet: b84e869's gpu_backward_param_grads_sets,
#          gpu_backward_mods and gpu_backward_param_grads with the
#          backward's list of recent launches (3e45dd1), gpu_cli (run
#          --backward --deterministic --check), then the package's tests
#          with TrainCall / ModsCall's cached entries (4dab5bf, 3e8de4c).
#   fuse   the narrow wgmma backward converting dQ in its main kernel
#          (CONV; plan.dq_fused: no postprocess; off by default until this
#          runs, FLASHJIT_BWD_FUSE=1 on): gpu_backward_fused (its cases
#          fused, the deterministic ones' dQ compared bit for bit with the
#          postprocess'), gpu_backward (the default path), then `flashjit
#          run --backward` medians with FLASHJIT_BWD_FUSE=0 (the
#          postprocess, as before) and =1, alternately, two rounds.
#          Predicted: 0.95-0.97 of the time at (4, 16, 4096, 128) causal
#          (the postprocess was 87 of ~2050 us by ncu), 0.96-0.98 without
#          a mask, d64 alike; GQA and the deterministic mode alike.
#   fusencu  where fuse misses: ncu's duration and stall reasons of the
#          main kernel, fused and not, at (4, 16, 4096, 128) causal (key
#          tile 0's block converts nearly every tile of its head there).
#   bwd, train  bench/probes/s24.sh's parts of those names (the H200's
#          bar figures: T12 and R2 again).
set -u
. bench/probes/parts_lib.sh
parts_start s25 "${1:-}" ${S25_SECONDS:-570}
out=$(cd "$out" && pwd)
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
part_fuse() {
  # shellcheck disable=SC2086
  gpu_tests /tmp/s25-fuse 'FAIL|failed|differs' ${S25_FUSE_TESTS:-gpu_backward_fused:200 gpu_backward:200}
  grep -c "same bits as the main kernel" "$out/gpu_backward_fused.log" | sed 's/^/fused = postprocess bits: /'
  local w
  for w in post:0 fused:1; do
    printf '#!/bin/sh\nFLASHJIT_BWD_FUSE=%s exec %s/build/flashjit "$@"\n' "${w#*:}" "$root" >"$root/build/flashjit-${w%%:*}"
    chmod +x "$root/build/flashjit-${w%%:*}"
  done
  (cd build && FLASHJIT_CACHE_DIR=/tmp/s25-fuse timeout $(bound 60) ./flashjit-fused run --backward \
     --shape 2,4,1000,128 --causal --dtype bf16 --check --iters 3 2>&1 | grep -E 'check|error' | head -2)
  local shapes=${S25_FUSE_SHAPES:-"4,16,4096,128 --causal;4,16,4096,128;8,16,2048,128 --causal;2,16,8192,128;8,32,2048,64 --causal;2,32,8192,64;1,32,8192,128 --heads-kv 8 --causal;8,21,2048,96;4,16,4096,128 --causal --window 1024,0;4,16,4096,128 --causal --deterministic"}
  FLASHJIT_CACHE_DIR=/tmp/s25-fuse rows fuse bf16 "$shapes" "post=build/flashjit-post --backward" "fused=build/flashjit-fused --backward"
}
part_fusencu() {
  local w
  for w in 0 1; do
    FLASHJIT_BWD_FUSE=$w FLASHJIT_CACHE_DIR=/tmp/s25-fuse timeout $(bound 120) ncu --section SpeedOfLight \
      --section WarpStateStats --section LaunchStats -k regex:fj_bwd --launch-count 3 \
      build/flashjit run --backward --shape 4,16,4096,128 --causal --dtype bf16 --iters 1 --warmup 0 \
      >"$out/ncu_fuse$w.txt" 2>&1
    echo "ncu fuse=$w: $(grep -E 'fj_bwd|Duration' "$out/ncu_fuse$w.txt" | tr -s ' ' | tr '\n' ';' | cut -c1-600)"
  done
}
part_bwd() { S24_PARTS=bwd S24_BWD_DIMS=${S25_BWD_DIMS:-64,128,256} S24_SECONDS=$(bound 560) bash bench/probes/s24.sh "$out/s24"; }
part_train() { S24_PARTS=train S24_SECONDS=$(bound 560) bash bench/probes/s24.sh "$out/s24"; }
parts_run s25 ${S25_PARTS:-unrun}
