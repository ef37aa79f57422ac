#!/bin/bash
# s22.sh OUTDIR -- the twenty-second session's device calls, from the
# repository root with build/ carried.  Parts (S22_PARTS; S22_SECONDS
# bounds the whole, default 570):
#   fwdsparse  why the document case's forward (issue 33's table: 312 us
#              on an H100 where its block density, 0.21 of causal's,
#              predicts ~130) costs what it does: `flashjit run` of the
#              forward, (4, 16, 4096, 128) bf16 causal, plain, window 1024,
#              documents with and without the 128 x 128 block mask, a block
#              mask of the causal mask alone; ncu's sections of one
#              document and one causal forward; then the package's
#              forward's host time per call (eager, graph built, no grad).
#   pytrain    after caf9d14 (calls with parameters and block masks from the
#              call table; eager training with expressions through
#              _TrainMods): the package's training tests (test_train,
#              test_train_varlen, test_calls, test_bad_inputs) on the GPU,
#              bench/probes/fwd_host.py, then bench/train_mods_compare.py
#              (issue 33's table).  Predicted: the document case's forward
#              with grad 529 -> ~200 us (its kernel's 188), fwd+bwd 1159 ->
#              ~950; the others within 3%.
set -u
. bench/probes/parts_lib.sh
parts_start s22 "${1:-}" ${S22_SECONDS:-570}
echo "s22 gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
doc="--mod documents --param doc:i32[4096]@$root/bench/probes/doc8_4096.i32"
base="--shape 4,16,4096,128 --dtype bf16 --causal"
part_fwdsparse() {
  local c args
  declare -A cases=([causal]="" [window]="--window 1024,0" [docbm]="$doc --block-mask 128,128"
                    [docnobm]="$doc" [causalbm]="--block-mask 128,128"
                    [docbm64]="$doc --block-mask 128,64")
  for c in causal window docbm docnobm causalbm docbm64; do
    # shellcheck disable=SC2086
    timeout $(bound 60) build/flashjit run $base ${cases[$c]} --iters 20 >"$out/run_$c.log" 2>&1
    echo "fwd $c: $(grep -iE 'variant|median|TFLOP' "$out/run_$c.log" | tr '\n' ' ' | cut -c1-260)"
  done
  for c in docbm causal; do
    # shellcheck disable=SC2086
    timeout $(bound 90) ncu --section SpeedOfLight --section Occupancy --section SchedulerStats \
      --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
      -k regex:fj_attn --launch-count 1 build/flashjit run $base ${cases[$c]} --iters 1 --warmup 0 \
      >"$out/ncu_$c.txt" 2>&1
    echo "ncu $c: $(grep -E 'Duration|Elapsed Cycles|SM Busy|Achieved Occupancy|Issued Warp|No Eligible|Stall|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Dynamic Shared' "$out/ncu_$c.txt" | tr -s ' ' | tr '\n' ';' | cut -c1-900)"
  done
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout $(bound 120) python3 bench/probes/fwd_host.py \
    >"$out/fwd_host.log" 2>&1
  echo "host: exit $?"; cat "$out/fwd_host.log" | tail -20
}
part_pytrain() {
  (cd python/tests && PYTHONPATH=..:. FLASHJIT_LIB=$root/build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s22-py \
    timeout $(bound 200) python3 -m unittest test_train test_train_varlen test_calls test_bad_inputs \
    >"$out/pytests.log" 2>&1; echo "pytests: exit $?"; tail -4 "$out/pytests.log"
   grep -E '^(FAIL|ERROR):' "$out/pytests.log" | head -8)
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout $(bound 60) python3 bench/probes/fwd_host.py \
    >"$out/fwd_host.log" 2>&1
  echo "host: exit $?"; tail -8 "$out/fwd_host.log"
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so TORCHINDUCTOR_CACHE_DIR=/tmp/s22-inductor \
    timeout $(bound 300) python3 -u bench/train_mods_compare.py --commit "${S22_COMMIT:-unknown}" --out "$out" \
    >"$out/train_mods_compare.log" 2>&1
  echo "trainmods: exit $?"
  grep -E "^\|" "$out/train_mods_compare.log" | cut -c1-330
  grep -E "^train .*fj_fwd_us" "$out/train_mods_compare.log" | while read -r l; do
    echo "fwd $(grep -oE 'key=[^ ]+|fj_fwd_us=[0-9.]+|flex_fwd_us=[0-9.]+' <<<"$l" | paste -sd' ')"
  done
}
# bwdpre: the backward's distance-table lines asked for before the wait
# for a step's products (this tree) against the templates before it
# (build/tmpl-base): `flashjit run --backward`, (4, 16, 4096, 128) bf16
# causal, plain, the bias table (issue 33's relbias), ALiBi, softcap,
# documents with the block mask, two rounds; then the backward's GPU tests
# with expressions.  Predicted: relbias / causal 1.28 -> ~1.1; the rest
# unchanged (within 2%).
part_bwdpre() {
  local c cfg round env
  declare -A cases=([causal]="" [relbias]="--score-mod s+bias(h,q-kv+4096) --param bias:f32[16,8192]"
                    [alibi]="--mod alibi --param slopes:f32[16]" [softcap]="--softcap 30"
                    [docbm]="$doc --block-mask 128,128")
  for round in 1 2; do
    for c in causal relbias alibi softcap docbm; do
      for cfg in base new; do
        env=X=1
        [ $cfg = base ] && env=FLASHJIT_TEMPLATE_DIR=$root/build/tmpl-base
        # shellcheck disable=SC2086
        env $env FLASHJIT_CACHE_DIR=/tmp/s22-$cfg timeout $(bound 60) build/flashjit run --backward $base \
          ${cases[$c]} --iters 20 >"$out/bwd_${c}_$cfg.log" 2>&1
        echo "bwd r$round $c $cfg: $(grep -oE 'median [0-9.]+ us' "$out/bwd_${c}_$cfg.log")"
      done
    done
  done
  gpu_tests /tmp/s22-tests 'FAIL|check failed' gpu_backward_mods:150 gpu_backward_param_grads:150 \
    gpu_backward_block_mask:150
}
# bwddoc: ncu's sections of the backward's main kernel, documents with the
# block mask beside causal (the documents' backward is 0.44 of causal's
# time at 0.21 of its blocks).
part_bwddoc() {
  local c
  declare -A cases=([causal]="" [docbm]="$doc --block-mask 128,128")
  for c in docbm causal; do
    # shellcheck disable=SC2086
    timeout $(bound 90) ncu --section SpeedOfLight --section Occupancy --section SchedulerStats \
      --section WarpStateStats --section LaunchStats -k regex:fj_bwd_attn --launch-count 1 \
      build/flashjit run --backward $base ${cases[$c]} --iters 1 --warmup 0 >"$out/ncu_bwd_$c.txt" 2>&1
    echo "ncu bwd $c: $(grep -E 'Duration|Elapsed Cycles|Achieved Occupancy|Issued Warp|No Eligible|Compute \(SM\) Throughput|Memory Throughput|Grid Size|Registers Per' "$out/ncu_bwd_$c.txt" | tr -s ' ' | tr '\n' ';' | cut -c1-700)"
    grep -E 'Stall|stall' "$out/ncu_bwd_$c.txt" | head -6 | cut -c1-200
  done
}
# pyquick: pytrain's tests and fwd_host.py alone (after the ModsCall's
# cached forward entry).
part_pyquick() {
  (cd python/tests && PYTHONPATH=..:. FLASHJIT_LIB=$root/build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s22-py \
    timeout $(bound 200) python3 -m unittest test_train test_train_varlen test_calls test_bad_inputs test_gpu \
    >"$out/pytests.log" 2>&1; echo "pytests: exit $?"; tail -4 "$out/pytests.log"
   grep -E '^(FAIL|ERROR):' "$out/pytests.log" | head -8)
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout $(bound 60) python3 bench/probes/fwd_host.py \
    >"$out/fwd_host.log" 2>&1
  echo "host: exit $?"; tail -8 "$out/fwd_host.log"
}
# sweeps: every wgmma variant the sweep compiles for the document case's
# forward (block mask 128 x 128) and the window's, timed; then the
# backward's tuner on the documents (its candidates' times).
part_sweeps() {
  local c
  declare -A cases=([docbm]="$doc --block-mask 128,128" [window]="--window 1024,0")
  for c in docbm window; do
    # shellcheck disable=SC2086
    FLASHJIT_CACHE_DIR=/tmp/s22-sw timeout $(bound 120) build/flashjit run $base ${cases[$c]} --mma wgmma --sweep \
      >"$out/sweep_$c.log" 2>&1
    echo "sweep $c: exit $?"; grep -E 'fj_attn' "$out/sweep_$c.log" | sort -t' ' -k2 | tail -12 | cut -c1-130
  done
  # shellcheck disable=SC2086
  FLASHJIT_CACHE_DIR=/tmp/s22-sw timeout $(bound 150) build/flashjit tune --backward \
    $base ${cases[docbm]} >"$out/tune_bwd_docbm.log" 2>&1
  echo "tune bwd docbm: exit $?"; grep -E 'fj_bwd|us' "$out/tune_bwd_docbm.log" | tail -14 | cut -c1-130
}
# tin: fj_variant.table_inside on the GPU: the mods tests with its cases
# (table inside: prefill and decode), the relative bias's forward compile
# with and without the proof (a table one element short), then
# train_mods_compare.py's bias-table case (its first call).
part_tin() {
  local e
  gpu_tests /tmp/s22-tin 'inside|FAIL|check failed' gpu_mods_user:100 gpu_mods_decode:80
  for e in "bias:f32[16,8192]" "bias:f32[16,8191]"; do
    rm -rf /tmp/s22-c1
    # shellcheck disable=SC2086
    FLASHJIT_CACHE_DIR=/tmp/s22-c1 timeout $(bound 30) build/flashjit emit $base --score-mod 's+bias(h,q-kv+4096)' \
      --param "$e" --what resources 2>&1 | grep -A16 'variant=fj_attn' | grep -E 'variant|compile_ms|spill_store' | tr '\n' ' '
    echo
  done
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so TORCHINDUCTOR_CACHE_DIR=/tmp/s22-inductor \
    timeout $(bound 150) python3 -u bench/train_mods_compare.py --cases relbias --commit "${S22_COMMIT:-unknown}" \
    --out "$out" >"$out/train_relbias.log" 2>&1
  echo "trainmods relbias: exit $?"; grep -E "^\|" "$out/train_relbias.log" | tail -1 | cut -c1-330
}
parts_run s22 ${S22_PARTS:-fwdsparse}
