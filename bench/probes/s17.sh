#!/bin/bash
# s17.sh OUTDIR -- the seventeenth session's calls, from the repository
# root with build/ carried (device_env.sh's conventions), build-rows/
# (branch bwdrows's slimmed build) and build-fdpw/templates,
# build-fdpwl/templates (those branches' templates/).  Parts:
#   rows    bench/probes/bwdrows.sh (checks, gpu_backward, A/B against main)
#   cmp     bench/bwd_compare.py --quick over S17_DIMS (default 64,128,256)
#           with main's library: the backward's ratio to cuDNN
#   cmprows the same with build-rows/'s library, over S17_ROWS_DIMS (64,128)
#   short   bench/sdpa_compare.py's short sweep (head dims 64, 128, 256 at
#           S = 512, 1024, bf16) with main's templates, then each of
#           S17_SHORT_TEMPLATES (build-X names; build-fdpw in its session)
#   fdpw, fdpwl, pair, ncuf, l   s16.sh's parts of those names
#   py      the package's training tests changed by cb8c394
#   S17_PARTS picks and orders them; S17_SECONDS bounds the whole.
set -u
. bench/probes/parts_lib.sh
parts_start s17 "${1:-}" ${S17_SECONDS:-570}
part_rows() { (cd "$root" && ROWS_TESTS=${ROWS_TESTS-gpu_backward:200} timeout $(bound 400) bash bench/probes/bwdrows.sh "$out/rows") 2>&1 | cut -c1-240; }
cmp() {  # cmp TAG LIB DIMS
  (cd /work/main && PYTHONPATH=python FLASHJIT_LIB=$2 timeout $(bound 300) \
    python3 bench/bwd_compare.py --quick --dims $3 --out "$out") >"$out/cmp_$1.log" 2>&1
  echo "s17 cmp $1: exit $?"
  grep -E "^bwd|^geomean|Error" "$out/cmp_$1.log" | sed -E 's/(rel_d[qkv]|Hkv|dtype|flash_tflops|det_us)=[^ ]+ //g' | cut -c1-260
}
part_cmp() { cmp main /work/main/build/libflashjit.so "${S17_DIMS:-64,128,256}"; }
part_cmprows() { cmp rows /work/main/build-rows/libflashjit.so "${S17_ROWS_DIMS:-64,128}"; }
part_short() {
  local t
  for t in "" ${S17_SHORT_TEMPLATES-}; do
    mkdir -p "$out/short_${t:-main}"
    (cd /work/main && PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so \
     FLASHJIT_TEMPLATE_DIR=${t:+/work/main/$t/templates} timeout $(bound 150) \
     python3 bench/sdpa_compare.py --sweep-only --dims 64,128,256 --seqs 512,1024 --dtype bf16 \
       --iters 30 --out "$out/short_${t:-main}") >"$out/short_${t:-main}.log" 2>&1
    echo "s17 short ${t:-main}: exit $?"
    grep -E "geomean|^ *[0-9]+ |Error" "$out/short_${t:-main}.log" | tail -30
  done
}
part_py() {
  (cd /work/main/python/tests && PYTHONPATH=.. FLASHJIT_LIB=/work/main/build/libflashjit.so timeout $(bound 200) \
    python3 -m unittest -v test_ring test_train test_train_varlen.VarlenBackward) >"$out/py.log" 2>&1
  echo "s17 py: exit $? ($(grep -E '^Ran [0-9]+ tests' "$out/py.log" | tail -1); $(grep -cE '\.\.\. ok$' "$out/py.log") ok, $(grep -cE 'skipped' "$out/py.log") skipped)"
  grep -E "^(FAIL|ERROR):|Error|^OK|^FAILED" "$out/py.log" | head -8
}
s16() { (cd "$root" && S16_PARTS=$1 S16_SECONDS=$(bound ${2:-300}) bash bench/probes/s16.sh "$out") 2>&1 | grep -v "^s16 gpu"; }
part_fdpw() { s16 fdpw; }
part_fdpwl() { s16 fdpwl; }
part_pair() { s16 pair 120; }
part_ncuf() { s16 ncuf 200; }
part_l() { s16 l 170; }
parts_run s17 ${S17_PARTS:-rows cmp cmprows}
