#!/bin/bash
# s29.sh OUTDIR -- the twenty-ninth session's device calls, from the
# repository root with build/ (main's build) carried, and for part mha
# build-mha/ too (main with backward.c's descends taking heads_q ==
# heads_kv as well: the descending walk without GQA, an experiment).
# Parts (S29_PARTS, default "f16 gqa gap gpt prof": what the next H200
# call should run; S29_SECONDS bounds the whole, default 560):
#   det    gpu_backward_deterministic (the descending walk now the default
#          for GQA under a bounded mask; its cases again with
#          FLASHJIT_BWD_DESCEND=0), bounded 240 s.
#   mha    build-mha: one checked run each at d96 and d128 causal without
#          GQA on the descending walk, then the deterministic backward
#          causal at (8,16,2048,D) and (2,16,8192,D), D 64..256: the
#          default mode, det plain (DESCEND=0), det descend.  Predicted:
#          no gain at d192 (per-step cost), up to a tenth off the plain
#          order's time at the long shape elsewhere.
#   gqa    bench/bwd_compare.py bf16 with the GQA cases (the bar's (1,
#          32/8, 8192, 128) causal first): the deterministic time's ratio
#          to the default, beside cuDNN's.
#   f16    the fp16 sweep and the GQA cases (H200 only).
#   gpt    examples/gpt_train.py --steps 300 (three runs: SDPA, flashjit,
#          float32 attention), then the package's training tests.
set -u
. bench/probes/parts_lib.sh
parts_start s29 "${1:-}" ${S29_SECONDS:-560}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)
echo "s29 gpu: $gpu"
GQA="1,32,8,8192,128,1;4,32,8,2048,128,1;2,16,4,8192,128,1;1,32,8,8192,128,0"
part_det() {
  gpu_tests /tmp/s29-det 'FAIL|descend|plain order' gpu_backward_deterministic:${S29_DET_SECONDS:-240}
}
mha_run() {  # TAG ENV SHAPE FLAGS
  local us
  us=$(cd build-mha && env $2 FLASHJIT_CACHE_DIR=/tmp/s29-mha timeout $(bound 60) ./flashjit run --backward $4 \
         --shape $3 --causal --dtype bf16 --iters 20 2>&1 | tee -a "$out/mha.log" |
         grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
  echo "${us:-?}"
}
part_mha() {
  local d s line
  for d in 96 128; do
    (cd build-mha && FLASHJIT_CACHE_DIR=/tmp/s29-mha timeout $(bound 60) ./flashjit run --backward --deterministic \
       --shape 2,4,1100,$d --causal --dtype bf16 --check --verbose) >"$out/mha_check$d.log" 2>&1
    echo "mha check d$d: exit $?; $(grep -cE -- '-> PASS' "$out/mha_check$d.log") PASS," \
         "$(grep -cE -- '-> FAIL' "$out/mha_check$d.log") FAIL; descending walk $(grep -c 'descending walk' "$out/mha_check$d.log")"
  done
  for d in 64 96 128 192 256; do
    for s in 8,16,2048 2,16,8192; do
      line="mha $s,$d causal: default $(mha_run d FLASHJIT_BWD_DESCEND=0 $s,$d '')"
      line="$line plain $(mha_run p FLASHJIT_BWD_DESCEND=0 $s,$d --deterministic)"
      line="$line descend $(mha_run e FLASHJIT_BWD_DESCEND=1 $s,$d --deterministic)"
      echo "$line"
    done
  done
}
part_gqa() {
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s29-gqa timeout $(bound 150) \
    python3 bench/bwd_compare.py --dims 128 --dtypes bf16 --gqa "$GQA" --out "$out/gqa" >"$out/gqa.log" 2>&1
  echo "gqa: exit $?"
  grep -E "geomean|gqa|Error" "$out/gqa.log" | cut -c1-400
}
part_f16() {
  case "$gpu" in *H200*) ;; *) echo "f16: skipped (not an H200)"; return;; esac
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s29-f16 timeout $(bound 200) \
    python3 bench/bwd_compare.py --dims 64,96,128,192,256 --dtypes f16 --gqa "$GQA" \
    --out "$out/f16" >"$out/f16.log" 2>&1
  echo "f16: exit $?"
  grep -E "geomean|gqa|Error" "$out/f16.log" | cut -c1-400
}
part_gpt() {
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s29-gpt timeout $(bound 150) \
    python3 examples/gpt_train.py --steps 300 >"$out/gpt_train.log" 2>&1
  echo "gpt_train: exit $?"; tail -9 "$out/gpt_train.log"
  (cd python/tests && PYTHONPATH=$root/python FLASHJIT_LIB=$root/build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s29-gpt \
     timeout $(bound 150) python3 -m unittest test_train >"$out/test_train.log" 2>&1
   echo "test_train: exit $?"; tail -3 "$out/test_train.log")
}
# Part prof (S29_PARTS=prof): bench/probes/train_prof.py full,causal --
# where the harness's autograd call spends the 380-480 us a call more
# than the backward op alone (PERF.md R9).
part_prof() {
  PROF_NO_FLEX=1 PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s29-prof timeout $(bound 200) \
    python3 bench/probes/train_prof.py full,causal 10 >"$out/prof.log" 2>&1
  echo "prof: exit $?"; grep -A9 "^prof" "$out/prof.log" | cut -c1-150
}
# Part gap (S29_PARTS=gap): bench/probes/bwd_gap.py -- the backward
# through autograd against the op alone, in one process, and both under
# the profiler (kernels, host ops).
part_gap() {
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s29-gap timeout $(bound 120) \
    python3 bench/probes/bwd_gap.py 20 >"$out/gap.log" 2>&1
  echo "gap: exit $?"; cut -c1-140 "$out/gap.log" | grep -v Warning | head -70
}
parts_run s29 ${S29_PARTS:-f16 gqa gap gpt prof}
