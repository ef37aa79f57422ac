#!/bin/bash
# s19.sh OUTDIR -- the next device calls after the nineteenth session, from
# the repository root with build/ (main's slimmed build) and .whl/ (the
# cudnn-frontend wheel, ../shared/anchors/README.md) carried.  Parts
# (S19_PARTS; S19_SECONDS bounds the whole, default 570):
#   fp8chk  what the nineteenth session landed without running it: the FP8
#           tests (gpu_fp8_forward's library-choice cases at d64: 256 keys
#           unmasked, 192 causal, never flushed), checked calls of the
#           library's own FP8 choice at every head dim and mask (a window
#           at d64 among them) with mbarrier waits that trap, memcheck on
#           one d64 call.  Any GPU.
#   fp8     bench/fp8_compare.py beside cuDNN's FP8 at d64, d128, d256
#           with --long at d64 and d128: issue 32's ratios and long-context
#           curves with the wider tiles, never flushed (d64's not yet
#           measured) beside 128-key tiles flushed (S19_FP8_ARGS: more
#           arguments).  The H200 only
#           for a figure.
#   fp8mods FP8 with the softcap at d64 and d128: the library's 128-key
#           tiles beside 192 and 256 never flushed (no spills at either;
#           not yet run), each checked once, then timed two rounds.
#           Predicted: 1.1-1.25x at d64 unmasked (what the wider tiles
#           gave without a modification), less at d128.
#   bwd     bench/bwd_compare.py --quick at d64, d128, d256 (issue 31's
#           ratios; S19_BWD_DIMS)
#   short   bench/sdpa_compare.py's S 512 and 1024 cells (issue 34)
#   comb    branch comb (the split-KV combine in column slices of 128,
#           build-comb/ carried, slimmed): gpu_mla_paged, gpu_wide_heads and
#           gpu_serving_varlen under its build, then bench/mla_compare.py
#           under main's build and comb's, twice, each its own disk cache.
#           Predicted: the single MLA decode 1-3 us faster (16 combine
#           blocks -> 64), the batched ones unchanged.
#   shortn  the two short cells below 1 in H4 (d96, d128 without a mask at
#           S = 1024: the 160-key pick) beside 128-key tiles, bf16, two
#           rounds of `flashjit run` medians (us)
#   shorttune  flashjit tune --no-save on the short cells below 1 in H2
#           (d256 none at 512 and 1024, d64 causal at 512; bf16): how far
#           the heuristic's pick is from the best candidate (S20_TUNE:
#           shapes, ';'-separated, each with its flags)
set -u
. bench/probes/parts_lib.sh
parts_start s19 "${1:-}" ${S19_SECONDS:-570}
out=$(cd "$out" && pwd)  # the parts change directory (device_env.sh: build/)
fj=$root/build/flashjit
# checked TAG TEMPLATES ARGS...: each ARGS (one string) as a checked FP8
# call under a copy of TEMPLATES whose mbarrier waits trap.
checked() {
  local tag=$1 t=$out/trap_$1 args i=0 log
  rm -rf "$t" && cp -r "$2" "$t" && shift 2
  sed -i 's/WGMMA_SPIN_LIMIT or 0/1 << 26/' "$t/attention_wgmma.cu"
  for args in "$@"; do
    i=$((i + 1)) log=$out/${tag}_check_$i.log
    FLASHJIT_TEMPLATE_DIR=$t timeout $(bound 90) "$fj" run $args --dtype e4m3 --check --iters 3 >"$log" 2>&1
    echo "$tag check $args: exit $?; $(grep -oE 'variant=[^ ]+' "$log" | head -1) $(grep -E '^check' "$log" | grep -oE 'rel_err=[^ ]+|-> [A-Z]+' | tr '\n' ' ')"
    grep -iE "error|trap|invalid|illegal" "$log" | head -2
  done
}
part_fp8chk() {
  (
  . bench/device_env.sh
  . ../bench/probes/ab_lib.sh
  ab_tests fp8 "$out" "${S19_TESTS-gpu_fp8_forward:150 gpu_fp8_out:60 gpu_fp8_mods:90}"
  checked own "$root/templates" "--shape 2,8,700,64" "--shape 2,8,700,64 --causal" \
    "--shape 1,8,777,64 --heads-kv 2 --causal=bottom-right --seq-kv 1500" "--shape 1,4,1000,64 --window 256,0" \
    "--shape 3,4,129,64" "--shape 1,4,1000,128" "--shape 2,8,700,128 --heads-kv 2 --causal" \
    "--shape 1,8,1,128 --heads-kv 2 --seq-kv 5000" "--shape 1,8,1,64 --heads-kv 2 --seq-kv 5000 --causal=bottom-right" \
    "--shape 1,4,333,192 --causal" "--shape 1,4,500,256" "--shape 2,4,1000,64 --o-dtype e4m3 --o-scale 8"
  timeout $(bound 120) compute-sanitizer --tool memcheck --error-exitcode 9 "$fj" run \
    --shape 1,4,640,64 --seq-kv 333 --dtype e4m3 --causal=bottom-right --iters 1 --warmup 0 >"$out/memcheck.log" 2>&1
  echo "fp8chk memcheck: exit $? ($(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1))"
  ) 2>&1 | cut -c1-260
}
part_fp8() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$root"/.whl/nvidia_cudnn_frontend-*.whl || return
  mkdir -p "$out/fp8"
  (cd "$root" && PYTHONPATH=/tmp/site:python FLASHJIT_LIB=build/libflashjit.so \
    timeout $(bound 300) python3 bench/fp8_compare.py --dims ${S19_FP8_DIMS:-64,128,256} --iters 20 --long --long-dims 64,128 \
      ${S19_FP8_ARGS-} --out "$out/fp8") >"$out/fp8.log" 2>&1
  echo "s19 fp8: exit $?"
  grep -E "geomean|Error|^keys" "$out/fp8.log" | cut -c1-240 | head -60
}
part_fp8mods() {
  (
  . bench/device_env.sh
  checked mods "$root/templates" "--shape 1,4,1000,64 --softcap 30 --tile-n 192 --fp8-flush -1" \
    "--shape 2,8,700,64 --causal --softcap 30 --tile-n 192 --fp8-flush -1" \
    "--shape 1,4,1000,64 --softcap 30 --tile-n 256 --fp8-flush -1" \
    "--shape 1,4,1000,128 --softcap 30 --tile-n 192 --fp8-flush -1"
  fp8_rows mods "4,32,4096,64 --softcap 30;4,32,4096,64 --causal --softcap 30" \
    "own=$fj" "n192=$fj --tile-n 192 --fp8-flush -1" "n256=$fj --tile-n 256 --fp8-flush -1"
  fp8_rows mods "4,16,4096,128 --softcap 30;4,16,4096,128 --causal --softcap 30" \
    "own=$fj" "n192=$fj --tile-n 192 --fp8-flush -1"
  ) 2>&1 | cut -c1-260
}
part_bwd() {
  (cd "$root" && PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout $(bound 300) \
    python3 bench/bwd_compare.py --quick --dims ${S19_BWD_DIMS:-64,128,256} --out "$out/bwd") >"$out/bwd.log" 2>&1
  echo "s19 bwd: exit $?"
  grep -E "^bwd|geomean|Error" "$out/bwd.log" | cut -c1-240 | head -30
}
part_short() {
  mkdir -p "$out/short"
  (cd "$root" && PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout $(bound 200) \
    python3 bench/sdpa_compare.py --sweep-only --dims ${S19_SHORT_DIMS:-64,128,256} --seqs 512,1024 --dtype bf16 --iters 30 --out "$out/short") \
    >"$out/short.log" 2>&1
  echo "s19 short: exit $?"
  grep -E "geomean|Error" "$out/short.log" | cut -c1-240 | head -20
}
part_comb() {
  [ -n "${S20_COMB_TESTS-x}" ] && (
  . bench/device_env.sh
  cd "$root/build-comb" && . "$root/bench/probes/ab_lib.sh" &&
    ab_tests comb "$out" "${S20_COMB_TESTS-gpu_mla_paged:90 gpu_wide_heads:90 gpu_serving_varlen:60}"
  ) 2>&1 | cut -c1-260
  local lib round
  for round in 1 2; do
    for lib in ${S20_COMB_ORDER:-build build-comb}; do
      (cd "$root" && FLASHJIT_CACHE_DIR=/tmp/fjc-$lib PYTHONPATH=python FLASHJIT_LIB=$lib/libflashjit.so \
        timeout $(bound 100) python3 bench/mla_compare.py --iters 50 --out "$out/mla_${lib}_$round") \
        >"$out/mla_${lib}_$round.log" 2>&1
      echo "comb mla $lib round $round: exit $?"
      grep -E "^mla" "$out/mla_${lib}_$round.log" | cut -c1-200
    done
  done
}
part_shortn() {
  rows shortn bf16 "16,21,1024,96;16,16,1024,128;32,21,512,96" "own=$fj" "n128=$fj --mma wgmma --tile-n 128"
}
part_shorttune() {
  local shape i=0
  IFS=';' read -ra shapes <<<"${S20_TUNE:-32,8,512,256;16,8,1024,256;32,32,512,64 --causal;16,32,1024,64 --causal}"
  for shape in "${shapes[@]}"; do
    i=$((i + 1))
    timeout $(bound 150) "$fj" tune --dtype bf16 --shape $shape --iters 20 --no-save --no-disk-cache \
      >"$out/tune_$i.log" 2>&1
    echo "s19 tune $shape: exit $?"
    grep -E "^best|^heuristic|^candidates|^compile" "$out/tune_$i.log" | cut -c1-200
  done
}
(cd "$root" && . bench/device_env.sh >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/s19 gpu: /')
parts_run s19 ${S19_PARTS:-fp8chk fp8}
