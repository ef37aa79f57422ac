#!/bin/bash
# s18.sh OUTDIR -- the eighteenth session's device calls, from the
# repository root with build-c/ (main's slimmed build: start with
# `rm -rf build && mv build-c build`), build-rot/ (branch bwdrot2's
# slimmed build: the deterministic backward's rotation, host and
# templates), build-vt/templates (branch vtfast's templates: FP8's _vt
# pass with 4 x 4 byte transposes), build-fp8/ (main with
# bench/probes/fp8wide.patch applied, built and slimmed, its templates in
# build-fp8/templates) and .whl/ (the
# cudnn-frontend wheel, ../shared/anchors/README.md) carried, as each
# part needs them.  The first call ran vt and fp8 (main at 3d76b0d with
# vtfast's templates), the second rot; both branches then merged (5f1a213).  Parts (S18_PARTS; S18_SECONDS
# bounds the whole):
#   vt     vtfast's templates under main's build: checked FP8 calls (d64
#          to d256, tails, GQA, both causal corners, e4m3 O) with waits
#          that trap, memcheck and racecheck on one call, the FP8 tests,
#          then FP8 forward time main / vtfast, two rounds.  Predicted: the
#          _vt pass from 33 us to under 20 us on the H100, 2-3% off FP8
#          d128 and 3-4% off d256 at S = 4096.
#   fp8    bench/fp8_compare.py beside cuDNN's FP8 at d64, d128, d256
#          (S18_FP8_DIMS) with build/'s library (S18_FP8_LIB=build-fp8 for
#          the patch's; S18_FP8_TEMPLATES: a templates folder;
#          S18_FP8_ARGS: more of fp8_compare.py's arguments, as --alt
#          tile_n=224+fp8_flush=-1 --long): issue 32
#   rot    bench/probes/bwd_rot.sh with build-rot as build/: issue 31's
#          deterministic bar (predicted 1.38-1.40x -> <= 1.15x at S 2048)
#   d64    bench/probes/fp8wide.patch (landed 2026-12-06 as branch
#          fp8wide's merge; build-fp8/: a build to set beside build/'s,
#          slimmed, its templates in build-fp8/templates): FP8
#          head dims 64 and 192 with P V and O at their own width, and
#          opt-in key tiles of 192 and 256 with fp8_flush -1:
#          checked calls with waits that trap, memcheck, the FP8 tests,
#          forward time main (build/, 5f1a213 or later) / the patch's, two
#          rounds, d64 at 2, 3 and 4 stages, and d128 with key tiles of
#          192 and 224 beside 128 (each with fp8_flush -1, and the
#          default), d64 and d192 with 160 (FlashAttention-3's FP8 tiles).
#          Predicted: FP8 d64 20-30% faster, d192 10-15%, d128 and d256
#          unchanged; tiles of 192 a few percent off d128 (fewer waits,
#          turns and shuffles a key).
#   bwd    bench/bwd_compare.py --quick at d256 (issue 31's d256 bar)
#   short  sdpa_compare's S 512 and 1024 cells (issue 34)
set -u
. bench/probes/parts_lib.sh
parts_start s18 "${1:-}" ${S18_SECONDS:-570}
vt=$root/build-vt/templates
# trap_checks TAG BIN TEMPLATES ARGS...: each ARGS (one string) as a checked
# FP8 call of BIN under a copy of TEMPLATES whose mbarrier waits trap.
trap_checks() {
  local tag=$1 bin=$2 t=$out/trap_$1 args
  shift 2
  rm -rf "$t" && cp -r "$1" "$t" && shift
  sed -i 's/WGMMA_SPIN_LIMIT or 0/1 << 26/' "$t/attention_wgmma.cu"
  for args in "$@"; do
    FLASHJIT_TEMPLATE_DIR=$t timeout $(bound 90) "$bin" run $args --dtype e4m3 --check --iters 3 >"$out/${tag}_check.log" 2>&1
    echo "$tag check $args: exit $?; $(grep -E '^check' "$out/${tag}_check.log" | grep -oE 'rel_err=[^ ]+|-> [A-Z]+' | tr '\n' ' ')"
    grep -iE "error|trap|invalid|illegal" "$out/${tag}_check.log" | head -2
  done
}
part_vt() {
  (
  . bench/device_env.sh
  local tool
  trap_checks vt ./flashjit "$vt" "--shape 1,4,1000,128" "--shape 1,4,1000,128 --causal" "--shape 2,8,700,64 --causal" \
    "--shape 1,8,777,128 --heads-kv 2" "--shape 1,4,300,128 --causal=bottom-right" "--shape 3,4,129,64" \
    "--shape 1,4,700,256 --causal" "--shape 1,4,333,192" "--shape 1,4,500,128 --causal --softcap 30" \
    "--shape 2,4,1000,128 --o-dtype e4m3 --o-scale 8"
  for tool in memcheck racecheck; do
    FLASHJIT_TEMPLATE_DIR=$vt timeout $(bound 120) compute-sanitizer --tool $tool --error-exitcode 9 ./flashjit run \
      --shape 1,4,640,128 --seq-kv 333 --dtype e4m3 --causal=bottom-right --iters 1 --warmup 0 >"$out/vt_$tool.log" 2>&1
    echo "vt $tool: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/vt_$tool.log" | tail -1))"
  done
  . ../bench/probes/ab_lib.sh
  ab_tests vt "$out" "${VT_TESTS-gpu_fp8_forward:150 gpu_fp8_out:60}" FLASHJIT_TEMPLATE_DIR=$vt
  ab_shapes vt "${VT_SHAPES:-4,16,4096,128;4,8,4096,256;1,16,16384,128;4,32,4096,64;4,16,4096,128 --causal}" \
    "--dtype e4m3" main "FLASHJIT_CACHE_DIR=/tmp/fj-cache" vtfast "FLASHJIT_TEMPLATE_DIR=$vt"
  ) 2>&1 | cut -c1-240
}
part_d64() {
  (
  . bench/device_env.sh
  local db=$root/build-fp8
  . ../bench/probes/ab_lib.sh
  (cd "$db" && ab_tests d64 "$out" "${D64_TESTS-gpu_fp8_forward:150 gpu_fp8_out:60 gpu_fp8_mods:90}")
  trap_checks d64 "$db/flashjit" "$db/templates" "--shape 2,8,700,64 --causal" "--shape 3,4,129,64" \
    "--shape 1,8,777,64 --heads-kv 2" "--shape 1,4,300,64 --seq-kv 1000 --causal=bottom-right --stages 4" \
    "--shape 1,4,1000,64 --stages 3" "--shape 1,4,333,192" "--shape 1,4,700,192 --causal" \
    "--shape 2,4,1000,64 --o-dtype e4m3 --o-scale 8" "--shape 1,4,500,64 --causal --softcap 30" "--shape 1,4,1000,128" \
    "--shape 1,4,1000,128 --tile-n 192 --fp8-flush -1" "--shape 2,8,700,128 --heads-kv 2 --causal --tile-n 192 --fp8-flush -1" \
    "--shape 1,4,333,64 --seq-kv 900 --causal=bottom-right --tile-n 256 --fp8-flush -1" \
    "--shape 1,4,1000,128 --tile-n 224 --fp8-flush -1" "--shape 2,8,700,128 --heads-kv 2 --causal --tile-n 224 --fp8-flush -1" \
    "--shape 1,4,1000,64 --causal --tile-n 160" "--shape 1,4,777,192 --tile-n 160"
  timeout $(bound 120) compute-sanitizer --tool memcheck --error-exitcode 9 "$db/flashjit" run \
    --shape 1,4,640,64 --seq-kv 333 --dtype e4m3 --causal=bottom-right --iters 1 --warmup 0 >"$out/d64_memcheck.log" 2>&1
  echo "d64 memcheck: exit $? ($(grep -E 'ERROR SUMMARY' "$out/d64_memcheck.log" | tail -1))"
  fp8_rows "d64" "${D64_SHAPES:-4,32,4096,64;4,32,4096,64 --causal;8,32,2048,64;2,10,8192,192;2,10,8192,192 --causal;4,16,4096,128}" \
    "main=./flashjit" "d64=$db/flashjit"
  fp8_rows "d64 stages" "${D64_STAGES-4,32,4096,64;4,32,4096,64 --causal;2,32,8192,64}" \
    "s2=$db/flashjit --stages 2" "s3=$db/flashjit --stages 3" "s4=$db/flashjit --stages 4"
  fp8_rows "d64 wide" "${D64_WIDE-4,16,4096,128;4,16,4096,128 --causal;1,16,16384,128}" \
    "default=$db/flashjit" "never=$db/flashjit --fp8-flush -1" "n192=$db/flashjit --tile-n 192 --fp8-flush -1" \
    "n224=$db/flashjit --tile-n 224 --fp8-flush -1"
  fp8_rows "d64 n160" "${D64_N160-4,32,4096,64;4,32,4096,64 --causal;2,10,8192,192;2,10,8192,192 --causal}" \
    "default=$db/flashjit" "n160=$db/flashjit --tile-n 160"
  ) 2>&1 | cut -c1-240
}
part_fp8() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$root"/.whl/nvidia_cudnn_frontend-*.whl || return
  local lib=${S18_FP8_LIB:-build} t=${S18_FP8_TEMPLATES-}
  mkdir -p "$out/fp8_$lib"
  (cd /work/main && PYTHONPATH=/tmp/site:python FLASHJIT_LIB=$lib/libflashjit.so FLASHJIT_TEMPLATE_DIR=$t \
    timeout $(bound 300) python3 bench/fp8_compare.py --dims ${S18_FP8_DIMS:-64,128,256} --iters 20 ${S18_FP8_ARGS-} --out "$out/fp8_$lib") \
    >"$out/fp8_$lib.log" 2>&1
  echo "s18 fp8 ($lib${t:+, templates $t}): exit $?"
  grep -E "geomean|Error|^keys" "$out/fp8_$lib.log" | cut -c1-240 | head -60
}
part_rot() {
  [ -x "$root/build-rot/flashjit" ] || { echo "rot: no build-rot"; return; }
  mv "$root/build" "$root/build-main" && mv "$root/build-rot" "$root/build"
  (cd "$root/build" && FLASHJIT_CACHE_DIR=/tmp/fj-cache-rot LD_LIBRARY_PATH=/usr/local/cuda/lib64 \
    FJT_DATA_DIR=/work/main/tests/data timeout $(bound 560) bash ../bench/probes/bwd_rot.sh "$out/rot") 2>&1 | cut -c1-240
  mv "$root/build" "$root/build-rot" && mv "$root/build-main" "$root/build"
}
part_bwd() {
  (cd /work/main && PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout $(bound 300) \
    python3 bench/bwd_compare.py --quick --dims ${S18_BWD_DIMS:-256} --out "$out/bwd") >"$out/bwd.log" 2>&1
  echo "s18 bwd: exit $?"
  grep -E "geomean|Error|^\|" "$out/bwd.log" | cut -c1-240 | head -20
}
part_short() {
  mkdir -p "$out/short"
  (cd /work/main && PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout $(bound 200) \
    python3 bench/sdpa_compare.py --sweep-only --dims 64,128,256 --seqs 512,1024 --dtype bf16 --out "$out/short") \
    >"$out/short.log" 2>&1
  echo "s18 short: exit $?"
  grep -E "geomean|Error" "$out/short.log" | cut -c1-240 | head -20
}
(cd "$root" && . bench/device_env.sh >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/s18 gpu: /')
parts_run s18 ${S18_PARTS:-vt fp8}
