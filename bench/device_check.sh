#!/bin/bash
# device_check.sh [COMMIT] -- everything one device call checks, from the
# repository root with build/ carried: the GPU tests, compute-sanitizer, the
# demo, checked runs of the CLI and variant sweeps.  Logs go to $OUT (at most
# eight files come back); the summary is printed last.
set -u
out=${OUT:-/tmp/fj-out}
mkdir -p "$out"
. bench/device_env.sh
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
part() { [ -z "${PARTS:-}" ] || [[ " $PARTS " == *" $1 "* ]]; }

note "commit ${1:-unknown}; $(date -u +%Y-%m-%dT%H:%MZ)"
note "$(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader)"

# 0. The wgmma family first, each step under a timeout: the probe of its
#    layout tables, then its axes and cross product.  WGMMA_DEBUG=1 renders
#    from a copy of templates/ whose mbarrier waits trap after 2^26 tries,
#    so a wrong phase fails the launch instead of hanging the GPU.
# WGMMA_DEBUG=1: the templates' copy whose mbarrier waits trap (its
# directory in $tdir, for FLASHJIT_TEMPLATE_DIR; empty otherwise).
debug_templates() {
  tdir=""
  if [ "${WGMMA_DEBUG:-0}" = 1 ]; then
    tdir=/tmp/fj-templates-debug
    rm -rf "$tdir" && cp -r /work/main/templates "$tdir"
    sed -i 's/WGMMA_SPIN_LIMIT or 0/1 << 26/' "$tdir/attention_wgmma.cu"
  fi
}

# gpu_tests PART PATTERN TEST...: each test from $tdir's templates under a
# timeout, its log $out/PART_TEST.log, its summary line and the log's lines
# matching PATTERN; stops at the first that fails (rc its exit).
gpu_tests() {
  local name=$1 pat=$2 t
  shift 2
  for t in "$@"; do
    FLASHJIT_TEMPLATE_DIR=$tdir timeout ${WGMMA_TIMEOUT:-240} ./tests/fj_tests $t >"$out/${name}_$t.log" 2>&1
    rc=$?
    note "$name $t: exit $rc ($(grep -c ' ok$' "$out/${name}_$t.log") ok, $(grep -c 'FAIL' "$out/${name}_$t.log") FAIL lines)"
    grep -E "$pat" "$out/${name}_$t.log" | head -14 | tee -a "$summary"
    [ $rc = 0 ] || break
  done
}

if part wgmma; then
  debug_templates
  gpu_tests wgmma "wgmma.*(matches|holds|probe)|cross product|max rel_err|error|FAIL|check failed" \
    gpu_lut_probe gpu_wgmma_axes gpu_wgmma_cross gpu_wgmma_seqlens
fi

# 0b. Before and after a change: the library's own picks (the problems of
#     bench/ptx_compare_picks.txt: the 16k sweep, decode and serving shapes,
#     the modification cases; bf16 unless AB_ALL=1), timed by the landed
#     build (build-base/, carried beside build/) and by this one,
#     alternately (before, after, before, after), in one call.  AB_RUNS
#     (lines of `flashjit run` flags) replaces the list.
if part ab && [ -x /work/main/build-base/flashjit ]; then
  ab_pat='bf16|score-mod'
  [ "${AB_ALL:-0}" = 1 ] && ab_pat=.
  ab_list=${AB_RUNS:-$(grep -E "$ab_pat" /work/main/bench/ptx_compare_picks.txt)}
  while IFS= read -r args; do
    [ -n "$args" ] || continue
    : >"$out/ab.tmp"
    for b in build-base build build-base build; do
      ms=$(/work/main/$b/flashjit run $args --iters ${AB_ITERS:-50} 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      echo "$b ${ms:-?}" >>"$out/ab.tmp"
    done
    note "ab $args: before $(awk '$1 == "build-base" {print $2}' "$out/ab.tmp" | tr '\n' ' ')us | after $(awk '$1 == "build" {print $2}' "$out/ab.tmp" | tr '\n' ' ')us"
    rm -f "$out/ab.tmp"
  done <<<"$ab_list"
fi

# 0c. The backward: its GPU cases against the float64 reference, one case
#     under compute-sanitizer (memcheck, racecheck), the package's autograd
#     tests (PYTHONPATH=python, this build's library), and the backward
#     beside SDPA's cuDNN and flash (bench/bwd_compare.py; BWD_ARGS, default
#     --quick).
if part backward; then
  timeout ${BACKWARD_TIMEOUT:-300} ./tests/fj_tests gpu_backward >"$out/backward.log" 2>&1
  note "backward gpu_backward: exit $? ($(grep -c '^ok ' "$out/backward.log") ok, $(grep -c '^FAIL' "$out/backward.log") FAIL)"
  grep -E "^FAIL|cases,|error|backward:|reference:" "$out/backward.log" | head -12 | tee -a "$summary"
  timeout ${BACKWARD_TIMEOUT:-300} ./tests/fj_tests gpu_backward_deterministic >"$out/backward_det.log" 2>&1
  note "backward gpu_backward_deterministic: exit $? ($(grep -c '^ok ' "$out/backward_det.log") ok, $(grep -c '^FAIL' "$out/backward_det.log") FAIL)"
  grep -E "runs differ|^FAIL|error|backward:" "$out/backward_det.log" | head -24 | tee -a "$summary"
  if [ "${BACKWARD_SANITIZE:-1}" = 1 ]; then
    for tool in memcheck racecheck; do
      timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 ./tests/fj_tests gpu_sanitize_backward >>"$out/backward_sanitizer.log" 2>&1
      note "compute-sanitizer --tool $tool gpu_sanitize_backward: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/backward_sanitizer.log" | tail -1 | sed 's/=* //'))"
    done
  fi
  (cd /work/main/python/tests && PYTHONPATH=/work/main/python FLASHJIT_LIB=/work/main/build/libflashjit.so \
    timeout 400 python3 -m unittest -v test_gpu.Backward) >"$out/backward_py.log" 2>&1
  note "backward python test_gpu.Backward: exit $?"
  grep -E "^(FAIL|ERROR|OK|FAILED)|Error:|relative error" "$out/backward_py.log" | head -12 | tee -a "$summary"
  (cd /work/main && PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout 500 \
    python3 bench/bwd_compare.py ${BWD_ARGS:---quick} --out "$out") >"$out/bwd_compare.log" 2>&1
  note "bwd_compare: exit $?"
  grep -E "^bwd|^geomean|Error" "$out/bwd_compare.log" | cut -c1-330 | tee -a "$summary"
fi

# 0e. Training beyond the built-in masks and dense batches: the backward
#     with score and mask expressions and parameter gradients (TRAIN_TESTS),
#     memcheck on one expression case, and the package's autograd tests
#     (TRAIN_PY: varlen, expressions, the GPT example).
if part train; then
  for t in ${TRAIN_TESTS:-gpu_backward_mods gpu_backward_param_grads}; do
    timeout ${TRAIN_TIMEOUT:-240} ./tests/fj_tests "$t" >"$out/train_$t.log" 2>&1
    note "train $t: exit $? ($(grep -c '^ok ' "$out/train_$t.log") ok, $(grep -c '^FAIL' "$out/train_$t.log") FAIL)"
    grep -E "^FAIL|error|check failed" "$out/train_$t.log" | head -8 | tee -a "$summary"
  done
  if [ "${TRAIN_SANITIZE:-1}" = 1 ]; then
    timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 ./tests/fj_tests gpu_sanitize_backward_mods >"$out/train_sanitizer.log" 2>&1
    note "compute-sanitizer --tool memcheck gpu_sanitize_backward_mods: exit $? ($(grep -E 'ERROR SUMMARY' "$out/train_sanitizer.log" | tail -1 | sed 's/=* //'))"
  fi
  (cd /work/main/python/tests && PYTHONPATH=/work/main/python FLASHJIT_LIB=/work/main/build/libflashjit.so \
    TORCHINDUCTOR_CACHE_DIR=/tmp/fj-inductor timeout ${TRAIN_PY_TIMEOUT:-300} python3 -m unittest -v \
    ${TRAIN_PY:-test_train_varlen test_gpu.Backward test_train}) >"$out/train_py.log" 2>&1
  note "train python: exit $? ($(grep -E '^Ran [0-9]+ tests' "$out/train_py.log" | tail -1); $(grep -cE '\.\.\. ok$' "$out/train_py.log") ok, $(grep -cE '\.\.\. skipped' "$out/train_py.log") skipped)"
  grep -E "^(FAIL|ERROR):" -A14 "$out/train_py.log" | grep -E "^(FAIL|ERROR)|Error|assert|line [0-9]+" | head -30 | tee -a "$summary"
fi

# 0d. The other targets' picks (bench/arch_picks.txt, made by
#     bench/arch_picks.sh without a GPU): each as explicit variant flags,
#     checked against the float64 reference (sampled rows) on this GPU.
if part archpicks; then
  : >"$out/archpicks.log"
  n=0 bad=0
  while IFS= read -r line; do
    args=${line%%#*}
    [ -n "${args// }" ] || continue
    n=$((n + 1))
    r=$(timeout 120 ./flashjit run $args --check --iters ${ARCH_ITERS:-5} 2>&1)
    echo "$line => $(echo "$r" | grep -E 'median|rel_err|PASS|FAIL' | tr '\n' ' ' | cut -c1-300)" >>"$out/archpicks.log"
    echo "$r" | grep -q "PASS" || { bad=$((bad + 1)); echo "FAIL $line: $(echo "$r" | tail -2 | tr '\n' ' ')" | tee -a "$summary"; }
  done < <(if [ -n "${ARCH_LINES:-}" ]; then for l in $ARCH_LINES; do sed -n "${l}p" /work/main/bench/arch_picks.txt; done
           else sed -n "${ARCH_FROM:-1},\$p" /work/main/bench/arch_picks.txt; fi)
  note "archpicks: $n runs (${ARCH_LINES:+lines $ARCH_LINES}${ARCH_LINES:-from line ${ARCH_FROM:-1}}), $bad without PASS"
fi

# 1. GPU tests (ctest label gpu), verbose so every case's error is logged.
if part tests; then
  ctest -L gpu -R "${TESTS:-.}" -V --timeout 900 >"$out/ctest_gpu.log" 2>&1
  note "ctest -L gpu: exit $? ($(grep -c ' ok$' "$out/ctest_gpu.log") ok cases, $(grep -c 'FAIL' "$out/ctest_gpu.log") FAIL lines)"
  grep -E "tests passed|cases passed|cross product:|prepared|matches the reference|max rel_err" "$out/ctest_gpu.log" | sed 's/^[0-9]*: //' | tee -a "$summary"
fi

# 2. compute-sanitizer: one variant per (stages, swizzle, softmax), the probe.
if part sanitize; then
  for tool in memcheck racecheck synccheck; do
    for t in ${SANITIZE_TESTS:-gpu_sanitize_set gpu_sanitize_wgmma gpu_sanitize_serving gpu_sanitize_varlen gpu_sanitize_mods gpu_sanitize_block_mask gpu_lut_probe}; do
      [ $tool = synccheck ] && [ $t != gpu_sanitize_wgmma ] && continue
      timeout ${SANITIZE_TIMEOUT:-300} compute-sanitizer --tool $tool --error-exitcode 9 ./tests/fj_tests $t >>"$out/sanitizer.log" 2>&1
      note "compute-sanitizer --tool $tool fj_tests $t: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|SYNCCHECK SUMMARY' "$out/sanitizer.log" | tail -1 | sed 's/=* //'))"
    done
  done
fi

# 3. The demo and checked runs of the default variants (median of --iters).
if part runs; then
  ./flashjit-demo >"$out/runs.log" 2>&1
  note "demo: exit $?; $(tail -1 "$out/runs.log")"
  ./flashjit lut >>"$out/runs.log" 2>&1
  for args in "1,8,512,64" "1,8,512,64 --causal" "2,8,2048,64" "2,8,2048,64 --causal" \
              "2,8,2048,128" "2,8,2048,128 --dtype bf16" "4,16,4096,128" \
              "2,8,1024,128 --kv-dtype e4m3" "2,16,1024,64 --heads-kv 2 --causal"; do
    ./flashjit run --shape $args --check --iters 30 >"$out/run.tmp" 2>&1
    rc=$?
    note "run --shape $args: exit $rc | $(grep -E '^variant' "$out/run.tmp" | cut -c10-) | $(grep -oE 'median [0-9.]+ us|[0-9.]+ TFLOP/s|[0-9.]+ us per call' "$out/run.tmp" | tr '\n' ' ')| $(grep -oE 'rel_err=[^ ]+|PASS|FAIL' "$out/run.tmp" | head -2 | tr '\n' ' ')"
    cat "$out/run.tmp" >>"$out/runs.log"
  done
  rm -f "$out/run.tmp"
fi

# 3b. Checked runs of the mma family over its axes (the library's own GPU
#     tests cover it in depth; these are quick and print the times).
if part mma; then
  ./tests/fj_tests gpu_lut_probe >"$out/mma_runs.log" 2>&1
  note "gpu_lut_probe: exit $?; $(grep -c 'matches the reference table: yes' "$out/mma_runs.log") of 12 tables as the reference"
  while IFS= read -r args; do
    [ -n "$args" ] || continue
    ./flashjit run --mma mma --softmax regs $args --check --iters 20 >"$out/run.tmp" 2>&1
    rc=$?
    note "mma run $args: exit $rc | $(grep -E '^variant' "$out/run.tmp" | cut -c10-) | $(grep -oE 'median [0-9.]+ us|[0-9.]+ TFLOP/s' "$out/run.tmp" | tr '\n' ' ')| $(grep -oE 'rel_err=[^ ]+|PASS|FAIL|error.*' "$out/run.tmp" | head -2 | tr '\n' ' ')"
    cat "$out/run.tmp" >>"$out/mma_runs.log"
  done <<<"${MMA_RUNS:---shape 1,8,512,64
--shape 1,8,512,64 --causal
--shape 2,8,2048,64 --causal --tile-m 128 --warps 8 --tile-n 64
--shape 2,8,2048,128 --tile-m 128 --warps 8 --tile-n 64
--shape 2,8,2048,128 --dtype bf16 --causal=bottom-right --seq-kv 1000 --tile-m 128 --warps 4 --tile-n 32
--shape 1,4,1000,256 --tile-m 64 --warps 4 --tile-n 32 --swizzle xor --stages 3
--shape 2,16,777,96 --heads-kv 2 --causal --swizzle none --stages 1
--shape 2,8,1024,128 --kv-dtype e4m3 --stages 1
--shape 1,4,4097,32 --causal --tile-m 128 --warps 4 --tile-n 128 --layout bshd}"
  rm -f "$out/run.tmp"
fi

# 4. flashjit beside PyTorch SDPA (bench/sdpa_compare.py, needs build/ made
#    with -DFLASHJIT_SHARED=ON), after tuning (4,16,4096,128).
if part bench; then
  (cd /work/main && FLASHJIT_LIB=build/libflashjit.so PYTHONUNBUFFERED=1 COMMIT=${1:-unknown} \
     python3 bench/sdpa_compare.py ${BENCH_ARGS:---tune} --out "$out" >"$out/sdpa_compare.log" 2>&1)
  note "sdpa_compare: exit $?"
  grep -E "^tune|^small shape|^jit|^geomean|fj/flash" "$out/sdpa_compare.log" | cut -c1-250 | tee -a "$summary"
fi

# 4c. Varlen prefill and the paged KV cache beside the dense problems they
#     should cost the same as (bench/varlen_compare.py).
if part varlen; then
  (cd /work/main && FLASHJIT_LIB=build/libflashjit.so PYTHONUNBUFFERED=1 \
     python3 bench/varlen_compare.py ${VARLEN_ARGS:-} --out "$out" >"$out/varlen_compare.log" 2>&1)
  note "varlen_compare: exit $?"
  grep -E "^varlen|Error|error" "$out/varlen_compare.log" | cut -c1-400 | tee -a "$summary"
fi

# 4d. Score and mask modifications beside FlexAttention
#     (bench/mods_compare.py).
if part mods; then
  (cd /work/main && FLASHJIT_LIB=build/libflashjit.so PYTHONUNBUFFERED=1 \
     python3 bench/mods_compare.py ${MODS_ARGS:-} --out "$out" >"$out/mods_compare.log" 2>&1)
  note "mods_compare: exit $?"
  grep -E "^mods|Error|error" "$out/mods_compare.log" | cut -c1-400 | tee -a "$summary"
fi

# 4e. Issue 33's bar: the forward and backward of each modification beside
#     FlexAttention's, cuDNN for the plain cases, and each modification's
#     first forward + backward on a fresh context with an empty disk cache
#     (bench/train_mods_compare.py from the repository root, PYTHONPATH=python,
#     this build's library; TRAINMODS_ARGS, e.g. "--quick --cases softcap").
#     The summary gets its lines and the markdown table.
if part trainmods; then
  (cd /work/main && PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so \
    TORCHINDUCTOR_CACHE_DIR=/tmp/fj-inductor timeout ${TRAINMODS_TIMEOUT:-540} \
    python3 -u bench/train_mods_compare.py ${TRAINMODS_ARGS:-} --commit "${1:-unknown}" --out "$out") \
    >"$out/train_mods_compare.log" 2>&1
  note "train_mods_compare: exit $?"
  grep -E "^train|^\||^[A-Za-z]*Error|Traceback" "$out/train_mods_compare.log" | cut -c1-700 | tee -a "$summary"
fi

# 4b. Serving shapes (decode, GQA, split-KV) beside SDPA and a copy
#     (bench/serving_compare.py).
if part serving; then
  (cd /work/main && FLASHJIT_LIB=build/libflashjit.so PYTHONUNBUFFERED=1 \
     python3 bench/serving_compare.py ${SERVING_ARGS:-} --out "$out" >"$out/serving_compare.log" 2>&1)
  note "serving_compare: exit $?"
  grep -E "^serving|Error|error" "$out/serving_compare.log" | cut -c1-300 | tee -a "$summary"
fi

# 4d. Split decode: the pick with the splits forced, eager and replayed
#     (bench/decode_probe.py), then each kernel's time under ncu (clocks
#     and caches as they are) for a few split counts.
if part decode; then
  (cd /work/main && FLASHJIT_LIB=build/libflashjit.so PYTHONUNBUFFERED=1 \
     python3 bench/decode_probe.py ${DECODE_ARGS:-} >"$out/decode_probe.log" 2>&1)
  note "decode_probe: exit $?"
  grep -E "^decode|Error|error" "$out/decode_probe.log" | cut -c1-240 | tee -a "$summary"
  for s in ${DECODE_SPLITS:-8 16 32}; do
    ncu --metrics gpu__time_duration.sum --clock-control none --cache-control none -k regex:fj_ \
      ./flashjit run --shape 1,32,1,128 --seq-kv 4096 --heads-kv 8 --splits $s --iters 2 --warmup 1 \
      >"$out/decode_ncu.tmp" 2>&1
    note "ncu splits=$s: $(grep -E '^  fj_|gpu__time_duration' "$out/decode_ncu.tmp" | tail -4 | awk '{print $1, $NF}' | tr '\n' ' ')"
  done
  rm -f "$out/decode_ncu.tmp"
fi

# 4c. Any commands, one per line in $CMDS, run from build/ (exploration:
#     ncu kernel times, flag sweeps); each one's output goes to cmds.log.
if part cmds; then
  while IFS= read -r cmd; do
    [ -n "$cmd" ] || continue
    echo "== $cmd" >>"$out/cmds.log"
    timeout ${CMD_TIMEOUT:-120} bash -c "$cmd" >>"$out/cmds.log" 2>&1
    note "cmd $cmd: exit $?"
  done <<<"${CMDS:-}"
fi

# 5. Sweeps: every tile/warps/stages/swizzle/softmax combination, timed
#    (shapes one per line in $SWEEPS; PARTS="tests sanitize runs sweeps"
#    selects parts).
if part sweeps; then
  while IFS= read -r args; do
    [ -n "$args" ] || continue
    echo "== run --sweep --shape $args" >>"$out/sweeps.log"
    ./flashjit run --sweep --shape $args --iters 10 --workers 16 >"$out/sweep.tmp" 2>/dev/null
    cat "$out/sweep.tmp" >>"$out/sweeps.log"
    best=$(grep '^fastest' "$out/sweep.tmp")
    s2=$(grep -E '_s1_pad_smem_' "$out/sweep.tmp" | grep -E '_m64_n64_w4_' | awk '{print $2}')
    s3=$(grep -E '_s2_pad_regs_' "$out/sweep.tmp" | grep -E '_m64_n64_w4_' | awk '{print $2}')
    note "sweep $args: ${best:-none} | stage-2 (m64 n64 s1 pad smem) ${s2:-?} us | stage-3 (m64 n64 s2 pad regs) ${s3:-?} us"
  done <<<"${SWEEPS:-1,8,512,64
1,8,512,64 --causal
2,8,2048,64
2,8,2048,64 --causal
2,8,2048,128}"
  rm -f "$out/sweep.tmp"
fi

# 6. Template A/B: the library's choice rendered from templates/ and from
#    copies with one switch flipped (ALT: "name|sed expression" per line,
#    applied to ALT_FILE, default attention_wgmma.cu), each shape timed
#    with every copy in turn, in one call.
if part alt; then
  alts=("default|")
  while IFS= read -r a; do [ -n "$a" ] && alts+=("$a"); done <<<"${ALT:-no-pingpong|s/local PINGPONG = C >= 2 and D <= 128/local PINGPONG = false/
not-persistent|s/local PERSISTENT = true/local PERSISTENT = false/}"
  for a in "${alts[@]}"; do
    name=${a%%|*} expr=${a#*|}
    # "name|@DIR": the templates of DIR (relative to the repository root),
    # e.g. another branch's, carried as an untracked folder.
    src=/work/main/templates
    [[ "$expr" == @* ]] && src=/work/main/${expr#@} expr=""
    rm -rf "/tmp/fj-alt-$name" && cp -r "$src" "/tmp/fj-alt-$name"
    [ -z "$expr" ] || sed -i "$expr" "/tmp/fj-alt-$name/${ALT_FILE:-attention_wgmma.cu}"
  done
  while IFS= read -r args; do
    [ -n "$args" ] || continue
    line="alt $args:"
    for a in "${alts[@]}"; do
      name=${a%%|*}
      ms=$(FLASHJIT_TEMPLATE_DIR=/tmp/fj-alt-$name ./flashjit run $args --iters 30 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      line="$line $name ${ms:-?}"
    done
    note "$line us"
  done <<<"${ALT_RUNS:---shape 4,16,4096,128
--shape 4,16,4096,128 --causal
--shape 8,32,2048,64
--shape 2,8,8192,256 --causal}"
fi

# 7. Several GPUs (run on nvidia-h200-x2; with one device the tests skip,
#    saying so): two contexts in one process, each probing its own layout
#    tables; two threads launching on both devices at once; memory of the
#    wrong device refused with its message and nothing written; two
#    `flashjit tune` processes on devices 0 and 1 into one database.  Then
#    the host time per call with the pointer check (both devices visible)
#    and without it (one visible), alternately.
if part multi; then
  note "devices: $(nvidia-smi -L | wc -l)"
  : >"$out/multi.log"
  for t in gpu_multi_contexts gpu_multi_threads gpu_multi_wrong_device gpu_multi_tunedb; do
    echo "== $t" >>"$out/multi.log"
    timeout ${MULTI_TIMEOUT:-600} ./tests/fj_tests $t >"$out/multi.tmp" 2>&1
    rc=$?
    cat "$out/multi.tmp" >>"$out/multi.log"
    note "multi $t: exit $rc"
    grep -E "SKIP|^refused:|^context [01]:|agree|^thread [01]:|called from|^entry:|flashjit tune on|^note:|managed|check failed|FAIL|crashed" "$out/multi.tmp" | head -16 | tee -a "$summary"
  done
  rm -f "$out/multi.tmp"
  while IFS= read -r args; do
    [ -n "$args" ] || continue
    for vis in 0 0,1 0 0,1; do
      us=$(CUDA_VISIBLE_DEVICES=$vis ./flashjit run --shape $args --iters 30 2>&1 | grep -oE '[0-9.]+ us per call')
      note "host time, run --shape $args, CUDA_VISIBLE_DEVICES=$vis: ${us:-?}"
    done
  done <<<"${MULTI_RUNS:-2,8,2048,64
1,8,512,64 --causal}"
fi

# 8. Issue 11's dispatch bar: the host time of a memory-hit call beside
#    bare cuLaunchKernel calls of the very kernels, grids and arguments it
#    launched (its launch record), in one program, the two taking turns
#    (`flashjit run`'s host line, best of 9 rounds of 128 calls each), three
#    runs a shape: the mma family and the wgmma family as the library
#    picks them, the split decode (two launches), modifications, and a
#    given variant (fj_attention_fwd_variant's path); then the GPU test
#    that replays the records and checks the replay writes what the call
#    wrote.  PARTS=launch runs this part alone.
if part launch; then
  : >"$out/launch.log"
  while IFS= read -r args; do
    [ -n "$args" ] || continue
    for i in 1 2 3; do
      ./flashjit run $args --iters 30 >"$out/run.tmp" 2>&1
      rc=$?
      cat "$out/run.tmp" >>"$out/launch.log"
      note "launch $args: exit $rc | $(grep -E '^variant' "$out/run.tmp" | cut -c10- | cut -d' ' -f1) | $(grep -E '^host:' "$out/run.tmp" | sed -e 's/^host: //' -e 's/ (memory hit, cuLaunchKernel included)//' -e 's/ (best of .*//')"
    done
  done <<<"${LAUNCH_RUNS:---shape 1,8,512,64
--shape 2,8,2048,128 --dtype bf16
--shape 1,32,1,128 --seq-kv 4096 --heads-kv 8
--shape 2,8,2048,128 --dtype bf16 --softcap 30 --score-mod s+tb(h) --param tb:f32[8]
--shape 2,8,2048,128 --dtype bf16 --mma mma}"
  rm -f "$out/run.tmp"
  ./tests/fj_tests gpu_launch_record >"$out/launch_test.log" 2>&1
  note "gpu_launch_record: exit $?"
  grep -E "launch(es)?: library|check failed|SKIP" "$out/launch_test.log" | tee -a "$summary"
fi

# 9. The Python package as a user gets it: the wheel that `pip wheel ./python
#    -w .whl` built on the build machine (the GPU machine has no Lua to build
#    one; .whl travels in `carry`), installed into /tmp/fj-site, then the
#    package's suite -- its GPU tests run here -- and the GPT example, both
#    with FLASHJIT_LIB unset, so that the installed package's own
#    libflashjit.so loads.  PARTS=python runs this part alone.
if part python; then
  whl=$(ls /work/main/.whl/flashjit-*.whl 2>/dev/null | head -1)
  if [ -z "$whl" ]; then
    note "python: no wheel in .whl/ (pip wheel ./python -w .whl, and carry .whl)"
  else
    rm -rf /tmp/fj-site
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --target /tmp/fj-site "$whl" >"$out/python.log" 2>&1
    note "python: pip install $(basename "$whl"): exit $?"
    (cd /tmp && env -u FLASHJIT_LIB PYTHONPATH=/tmp/fj-site python3 -c \
      'import flashjit, os; print("flashjit from", os.path.dirname(flashjit.__file__), "library", flashjit.library_path())') \
      2>&1 | tee -a "$out/python.log" | tee -a "$summary"
    (cd /work/main && env -u FLASHJIT_LIB PYTHONPATH=/tmp/fj-site timeout ${PYTHON_TIMEOUT:-400} \
      python3 -m unittest discover -s python/tests -v) >>"$out/python.log" 2>&1
    note "python: unittest: exit $? ($(grep -E '^Ran [0-9]+ tests' "$out/python.log" | tail -1); $(grep -cE '\.\.\. skipped' "$out/python.log") skipped)"
    grep -E '^(FAILED|OK)|^(FAIL|ERROR):' "$out/python.log" | head -12 | tee -a "$summary"
    grep -oE "skipped '.*'" "$out/python.log" | sort | uniq -c | tee -a "$summary"
    for a in "" "--compile"; do
      (cd /work/main && env -u FLASHJIT_LIB PYTHONPATH=/tmp/fj-site timeout 300 \
        python3 examples/gpt_flashjit.py $a) >"$out/gpt.tmp" 2>&1
      note "python: examples/gpt_flashjit.py $a: exit $?"
      tail -4 "$out/gpt.tmp" | tee -a "$summary"
      cat "$out/gpt.tmp" >>"$out/python.log"
    done
    rm -f "$out/gpt.tmp"
  fi
fi

# 10. Issue 36's JIT bar: where a cold compile's time goes and the kernel
#     package.  (a) NVRTC per phase (front end, NVVM, ptxas; NVRTC's own
#     --time table) on the sources of every family's picks and the
#     backward's kernels (bench/pick_sources.c all, bench/compile_cost.sh,
#     5 fresh programs each); (b) the library's cold compile of each pick
#     of bench/ptx_compare_picks.txt and of the backward (`flashjit emit
#     --what resources --no-disk-cache`, a fresh process each, NVRTC's own
#     cache off; COMPILE_ROUNDS rounds, default 3), median and worst; (c)
#     the package: `flashjit cache prewarm --package` (sm_80 and sm_90a),
#     its size and time, the GPU test of a first call from it, and the
#     first call's wall time (`flashjit run --iters 1`, fresh cache
#     directory) with and without it.  Kernel times: PARTS="ab compile"
#     with build-base/ carried.  PARTS=compile runs this part alone.
if part compile; then
  cc -O2 ../bench/nvrtc_time.c -I/usr/local/cuda/include -L/usr/local/cuda/lib64 \
    -lnvrtc -Wl,-rpath,/usr/local/cuda/lib64 -o /tmp/nvrtc_time &&
  cc -O2 ../bench/pick_sources.c -I../include -L. -lflashjit -Wl,-rpath,"$PWD" \
    -o /tmp/pick_sources
  note "compile: tools built: exit $?"
  rm -rf /tmp/fj-srcs /tmp/fj-ps && mkdir -p /tmp/fj-srcs
  FLASHJIT_CACHE_DIR=/tmp/fj-ps /tmp/pick_sources /tmp/fj-srcs all >"$out/compile_sources.txt" 2>&1
  bash ../bench/compile_cost.sh /tmp/fj-srcs 5 >"$out/compile_phases.md" 2>&1
  note "compile (a): NVRTC phases of $(ls /tmp/fj-srcs | wc -l) kernels, median of 5 (ms): total / front end / NVVM / ptxas"
  awk -F'|' 'NR > 2 { gsub(/ /, "", $3); split($4, t, " "); print t[1], $5, $6, $7, $2, $3 }' \
    "$out/compile_phases.md" | sort -n | tee -a "$summary"
  : >"$out/compile_lib.txt"
  picks=$(grep -vE 'mod |score-mod|block-mask' ../bench/ptx_compare_picks.txt)
  for round in $(seq ${COMPILE_ROUNDS:-3}); do
    while IFS= read -r args; do
      [ -n "$args" ] || continue
      ms=$(./flashjit emit $args --what resources --no-disk-cache 2>/dev/null | grep -oE '^compile_ms=[0-9.]+' | cut -d= -f2)
      echo "fwd ${ms:-?} $args" >>"$out/compile_lib.txt"
    done <<<"$picks"
    for d in 64 128 256; do
      ./flashjit emit --backward --shape 2,16,4096,$d --causal --dtype bf16 --what resources --no-disk-cache 2>/dev/null |
        awk -v d=$d '/^variant=/ { v = substr($0, 9) } /^compile_ms=/ { print "bwd", substr($0, 12), v, "d" d }' >>"$out/compile_lib.txt"
    done
  done
  for k in fwd bwd; do
    note "compile (b): $k cold compiles, $(grep -c "^$k " "$out/compile_lib.txt") runs: median $(awk -v k=$k '$1 == k { print $2 }' "$out/compile_lib.txt" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }') ms, worst $(awk -v k=$k '$1 == k { print $2 }' "$out/compile_lib.txt" | sort -n | tail -1) ms"
  done
  sort -k2 -n -r "$out/compile_lib.txt" | head -5 | tee -a "$summary"
  rm -rf /tmp/fj-pkg
  t0=$(date +%s.%N)
  ./flashjit cache prewarm --package /tmp/fj-pkg --workers 16 >"$out/compile_package.log" 2>&1
  rc=$?
  note "compile (c): package built: exit $rc in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s; $(du -sb /tmp/fj-pkg | cut -f1) bytes, $(ls /tmp/fj-pkg | grep -c '\.fjc$') entries"
  grep -E '^(prewarm|package) ' "$out/compile_package.log" | tee -a "$summary"
  FLASHJIT_CACHE_DIR=/tmp/fj-pkgtest timeout 600 ./tests/fj_tests gpu_package_first_call >"$out/compile_gpu_test.log" 2>&1
  note "compile (c): gpu_package_first_call: exit $? $(grep -E 'NVRTC calls' "$out/compile_gpu_test.log")"
  for with in no yes no yes; do
    rm -rf /tmp/fj-first
    pkg=""
    [ $with = yes ] && pkg=/tmp/fj-pkg
    t0=$(date +%s.%N)
    FLASHJIT_CACHE_DIR=/tmp/fj-first FLASHJIT_PACKAGE_DIR=$pkg ./flashjit run --shape 2,8,4096,128 --dtype bf16 --causal --iters 1 >/dev/null 2>&1
    note "compile (c): first call (fresh process and cache, run --iters 1), package $with: exit $? in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }') s"
  done
fi

# FP8 attention (dtype e4m3, issue 32): the layout probe with the FP8 kinds,
# the FP8 forward's GPU test (WGMMA_DEBUG=1: mbarrier waits that trap), a
# checked run of the library's choice, then bench/fp8_compare.py beside
# cuDNN's FP8 (its wheel carried in .whl/: ../shared/anchors/README.md;
# FP8_ARGS for the script, e.g. "--dims 128 --seqs 4096 --long").
if part fp8; then
  debug_templates
  gpu_tests fp8 "max rel_err|error|FAIL|check failed|skipped|holds|probe" \
    gpu_lut_probe gpu_lut_e4m3 gpu_fp8_forward
  if [ "${rc:-1}" = 0 ]; then
    for c in "" "--causal"; do
      timeout 120 ./flashjit run --dtype e4m3 --shape 1,16,4096,128 $c --check --iters 20 2>&1 | tail -4 | tee -a "$summary"
    done
    if ls /work/main/.whl/nvidia_cudnn_frontend-*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --target /tmp/site /work/main/.whl/nvidia_cudnn_frontend-*.whl
      (cd /work/main && PYTHONPATH=/tmp/site:python FLASHJIT_LIB=build/libflashjit.so \
        timeout ${FP8_TIMEOUT:-400} python3 bench/fp8_compare.py ${FP8_ARGS:-} --out "$out" >"$out/fp8_compare.log" 2>&1)
      note "fp8 compare: exit $?"
      grep -E "geomean|keys|D=" "$out/fp8_compare.log" | tail -40 | tee -a "$summary"
    fi
  fi
fi

# FP8 KV caches under 16-bit queries (issue 32's item 4: the mma family's
# FP8 ring, templates/tile_fp8.cuh): its GPU tests (FP8KV_TESTS), memcheck
# and racecheck on its small cases, a checked run of the library's decode
# choice, then bench/fp8_kv_compare.py (FP8KV_ARGS) beside the 16-bit
# decode, cuDNN and a copy.
if part fp8kv; then
  # Each case compiles its own kernel and runs the float64 reference: on
  # the H200 gpu_fp8_kv took about 6 s a case, gpu_fp8_kv_paged 19.
  tdir=""
  WGMMA_TIMEOUT=${FP8KV_TEST_TIMEOUT:-600} gpu_tests fp8kv "cases passed|fp8 library|max rel_err|error|FAIL|check failed" \
    ${FP8KV_TESTS:-gpu_fp8_kv gpu_fp8_kv_paged}
  if [ "${FP8KV_SANITIZE:-1}" = 1 ]; then
    for tool in memcheck racecheck; do
      timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 ./tests/fj_tests gpu_sanitize_fp8_kv >>"$out/fp8kv_sanitizer.log" 2>&1
      note "compute-sanitizer --tool $tool gpu_sanitize_fp8_kv: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/fp8kv_sanitizer.log" | tail -1 | sed 's/=* //'))"
    done
  fi
  timeout 120 ./flashjit run --shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16 --kv-dtype e4m3 --check --iters 20 2>&1 | tail -3 | tee -a "$summary"
  (cd /work/main && FLASHJIT_LIB=build/libflashjit.so PYTHONUNBUFFERED=1 timeout ${FP8KV_TIMEOUT:-400} \
     python3 bench/fp8_kv_compare.py ${FP8KV_ARGS:-} --out "$out" >"$out/fp8_kv_compare.log" 2>&1)
  note "fp8_kv_compare: exit $?"
  grep -E "^fp8kv|Error|error" "$out/fp8_kv_compare.log" | cut -c1-400 | tee -a "$summary"
fi

# Wide heads and MLA's latent decode (issue 34, item 3): the GPU tests
# (head dims above 256, V read from K's rows, paged), memcheck and
# racecheck on small cases (MLA_SANITIZE=0: not), the single decode with
# each of MLA_SPLITS, a checked run of the library's MLA decode, then
# bench/mla_compare.py (MLA_ARGS) beside a copy.
if part mla; then
  tdir=""
  WGMMA_TIMEOUT=${MLA_TEST_TIMEOUT:-240} gpu_tests mla "cases passed|max rel_err|error|FAIL|check failed|refused" \
    ${MLA_TESTS:-gpu_wide_heads gpu_mla_paged}
  if [ "${MLA_SANITIZE:-1}" = 1 ]; then
    for tool in memcheck racecheck; do
      timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 ./tests/fj_tests gpu_sanitize_wide >>"$out/mla_sanitizer.log" 2>&1
      note "compute-sanitizer --tool $tool gpu_sanitize_wide: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/mla_sanitizer.log" | tail -1 | sed 's/=* //'))"
    done
  fi
  for sp in ${MLA_SPLITS:-}; do
    timeout 60 ./flashjit run --shape 1,16,1,576 --heads-kv 1 --seq-kv 32768 --head-dim-v 512 --latent \
      --dtype bf16 --splits $sp --iters 30 2>&1 | grep -E "^time" | sed "s/^/mla single decode splits $sp: /" | tee -a "$summary"
  done
  timeout 120 ./flashjit run --shape 64,16,1,576 --heads-kv 1 --seq-kv 4096 --head-dim-v 512 --latent \
    --dtype bf16 --check --iters 20 2>&1 | tail -3 | tee -a "$summary"
  (cd /work/main && FLASHJIT_LIB=build/libflashjit.so PYTHONUNBUFFERED=1 timeout ${MLA_TIMEOUT:-300} \
     python3 bench/mla_compare.py ${MLA_ARGS:---tile-m 32} --out "$out" >"$out/mla_compare.log" 2>&1)
  note "mla_compare: exit $?"
  grep -E "^mla|Error|error" "$out/mla_compare.log" | cut -c1-400 | tee -a "$summary"
fi

# Every head dim (issue 34): the padded wgmma head dims, the mma
# family's multiples of 16 and split head dims (head_dim_v: MLA's 192/128
# and kin) against the reference (WGMMA_DEBUG=1: waits that trap), then
# bench/sdpa_compare.py's sweep beside SDPA (DIMS_ARGS, default head dims
# 80 and 96 in bf16 at S >= 2048).
if part dims; then
  debug_templates
  gpu_tests dims "max rel_err|error|FAIL|check failed|not run" gpu_head_dims gpu_head_dim_v
  (cd /work/main && FLASHJIT_LIB=build/libflashjit.so timeout ${DIMS_TIMEOUT:-300} \
    python3 bench/sdpa_compare.py ${DIMS_ARGS:---sweep-only --dims 80,96 --dtype bf16} --out "$out" \
    >"$out/dims_compare.log" 2>&1)
  note "dims compare: exit $?"
  grep -E "geomean|^ *[0-9]+ " "$out/dims_compare.log" | tail -40 | tee -a "$summary"
fi

# Short sequences (issue 34): what the tuner finds beside the library's
# pick for the shapes of 16k tokens at S = 512 and 1024 (SHORT_SHAPES:
# "B,H,S,D:causal ..."; nothing is saved).
if part short; then
  for sc in ${SHORT_SHAPES:-32,32,512,64:top-left 16,32,1024,64:top-left 32,16,512,128:none 32,16,512,128:top-left 32,8,512,256:none 32,8,512,256:top-left}; do
    timeout 200 ./flashjit tune --no-save --dtype bf16 --shape "${sc%%:*}" --causal="${sc##*:}" --iters 20 \
      >"$out/short_${sc//[,:]/_}.log" 2>&1
    note "short $sc: exit $? $(grep -E 'best|default|fastest|library' "$out/short_${sc//[,:]/_}.log" | tail -3 | tr '\n' ' ')"
  done
fi

# 11. Context parallelism (issue 39): the merge kernel against its float64
#     form (gpu_merge), then the package's ring tests from python/ with
#     build/'s library (python/tests/test_ring.py: the ring simulated in one
#     process on flashjit's kernels, world sizes 1-4, forward and backward,
#     against flashjit.attention over the whole sequence; flashjit.merge on
#     the GPU; ring_attention in a process group of one; the schedule's and
#     the Gloo processes' CPU tests with them).  On two GPUs or more
#     (nvidia-h200-x2) also bench/ring_bench.py under torchrun: (1, 32/8,
#     131072, 128) causal bf16 over 2 ranks beside one GPU (RING_BENCH_ARGS;
#     RING_BENCH=0 leaves it out, RING_TESTS=0 the tests).  PARTS=ring runs
#     this part alone: PARTS=ring RING_BENCH=0 on one GPU, PARTS=ring
#     RING_TESTS=0 on two (each within one call's ten minutes).
if part ring && [ "${RING_TESTS:-1}" = 1 ]; then
  tdir=""
  gpu_tests ring "^(ok|FAIL)|check failed|SKIP" gpu_merge
  (cd /work/main/python/tests && PYTHONPATH=/work/main/python FLASHJIT_LIB=/work/main/build/libflashjit.so \
    timeout ${RING_TIMEOUT:-500} python3 -m unittest -v test_ring) >"$out/ring_python.log" 2>&1
  note "ring python test_ring: exit $? $(grep -E '^Ran|^OK|^FAILED' "$out/ring_python.log" | tr '\n' ' ')"
  grep -E "^(FAIL|ERROR):|skipped '" "$out/ring_python.log" | head -20 | tee -a "$summary"
  note "ring simulated on the GPU: $(grep -c '^world ' "$out/ring_python.log") cases; the largest errors:"
  awk '/^world / { m = 0; for (i = 1; i < NF; i++) if ($i ~ /^(out|dq|dk|dv)$/ && $(i + 1) + 0 > m) m = $(i + 1) + 0
                   print m, $0 }' "$out/ring_python.log" | sort -g | tail -4 | cut -d' ' -f2- | tee -a "$summary"
fi
if part ring; then
  ngpu=$(nvidia-smi -L | wc -l)
  if [ "$ngpu" -ge 2 ] && [ "${RING_BENCH:-1}" = 1 ]; then
    (cd /work/main && PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so PYTHONUNBUFFERED=1 \
      timeout ${RING_BENCH_TIMEOUT:-500} python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
      bench/ring_bench.py ${RING_BENCH_ARGS:-} --out "$out") >"$out/ring_bench.log" 2>&1
    note "ring_bench (2 of $ngpu GPUs): exit $?"
    grep -E "^(ring|single|speedup|rel_err)|Error" "$out/ring_bench.log" | head -12 | tee -a "$summary"
  else
    note "ring_bench: not run ($ngpu GPU; it needs 2: nvidia-h200-x2, or RING_BENCH=0)"
  fi
fi

# A session's final check: the GPU tests it touched (FINAL_TESTS; gpu_cli
# runs through ctest, being a script), then the package's GPU tests for
# them (PY_TESTS), from python/ with build/'s library.
if part final; then
  tdir=""
  for t in ${FINAL_TESTS:-gpu_lut_probe gpu_lut_e4m3 gpu_fp8_forward gpu_mods_int_ops gpu_exact_single_key gpu_wgmma_axes gpu_mma_axes gpu_mods_builtins gpu_attention_auto gpu_backward}; do
    gpu_tests final "FAIL|check failed" $t
  done
  timeout 300 ctest -R '^gpu_cli$' --output-on-failure >"$out/final_gpu_cli.log" 2>&1
  note "final gpu_cli: exit $? ($(grep -oE 'Passed|Failed|Skipped' "$out/final_gpu_cli.log" | head -1))"
  (cd /work/main/python/tests && PYTHONPATH=/work/main/python FLASHJIT_LIB=/work/main/build/libflashjit.so \
    timeout 400 python3 -m unittest ${PY_TESTS:-test_gpu.Exact test_gpu.Fp8 test_train test_train_varlen}) >"$out/final_python.log" 2>&1
  note "final python: exit $? $(grep -E '^Ran|^OK|^FAILED' "$out/final_python.log" | tr '\n' ' ')"
  grep -E "^(FAIL|ERROR):" -A8 "$out/final_python.log" | head -30 | tee -a "$summary"
fi

# 11. Issue 37 (the Python call's host time) and issue 34's serving calls,
#     from python/ with build/'s library: bench/host_cost.py (the bars
#     beside SDPA, eager and compiled, the phases of one call, the GPT
#     example's model eager / torch.compile / mode="reduce-overhead";
#     HOST_COST_ARGS, default --rounds 5), then the package's GPU tests
#     (PYHOST_TESTS, default the cached calls, the serving calls, test_gpu
#     whole, test_train and test_train_varlen).  PARTS=pyhost runs this part alone.
if part pyhost; then
  (cd /work/main && PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so \
    TORCHINDUCTOR_CACHE_DIR=/tmp/fj-inductor timeout ${HOST_COST_TIMEOUT:-220} \
    python3 -u bench/host_cost.py ${HOST_COST_ARGS:---rounds 5} --out "$out") >"$out/pyhost_host_cost.log" 2>&1
  note "pyhost bench/host_cost.py: exit $?"
  grep -E "^ |^Host|^Phases|^examples" "$out/pyhost_host_cost.log" | cut -c1-150 | tee -a "$summary"
  (cd /work/main/python/tests && PYTHONPATH=/work/main/python FLASHJIT_LIB=/work/main/build/libflashjit.so \
    TORCHINDUCTOR_CACHE_DIR=/tmp/fj-inductor timeout ${PYHOST_TIMEOUT:-330} python3 -m unittest -v \
    ${PYHOST_TESTS:-test_calls test_serving test_gpu test_train test_train_varlen}) >"$out/pyhost_tests.log" 2>&1
  note "pyhost tests: exit $? ($(grep -E '^Ran [0-9]+ tests' "$out/pyhost_tests.log" | tail -1); $(grep -cE '\.\.\. ok$' "$out/pyhost_tests.log") ok, $(grep -cE '\.\.\. skipped' "$out/pyhost_tests.log") skipped)"
  grep -E '^(FAILED|OK)|^(FAIL|ERROR):' "$out/pyhost_tests.log" | head -20 | tee -a "$summary"
  grep -E "^(FAIL|ERROR):" -A12 "$out/pyhost_tests.log" | grep -E "Error|assert|line [0-9]+" | head -30 | tee -a "$summary"
fi
