#!/bin/bash
# s34a.sh OUTDIR -- the thirty-fourth session's calls, from the repository
# root with build/ carried (main's build, slimmed, with
# libflashjit_torch.so).  S34A_PARTS (default "f16 cmp gptc gpt varlen":
# what the thirty-fourth session could not run on an H200, about 450 s
# there), the whole bounded by S34A_SECONDS (540):
#   ttest  the package's test_train (test_compile_fullgraph_backward now
#          runs both the Python ops and the compiled graphs' C++ ops).
#   f16    s29.sh's f16 part: the backward's fp16 sweep and GQA rows (issue
#          31's bar, its fp16 half; H200 only, skipped elsewhere).
#   f16any the same sweep on whatever GPU came (an H100's figures: not the
#          bar's, which is the H200's).
#   ntest  s33a.sh's ntest: the package's test_native (the C++ paths).
#   gptc   s33a.sh's gptc: the compiled GPT step, Python ops then C++ ops.
#   gpt    s33a.sh's gpt: the eager GPT step, the C++ call.
#   varlen bench/varlen_py.py: attention_varlen against the equal-FLOP
#          dense attention() (issue 34's 5% bar, through the package).
#   cmp    s33a.sh's cmp: issue 33's table beside FlexAttention.
#   cmpd   the same, the document and causal cases only.
set -u
. bench/probes/parts_lib.sh
parts_start s34a "${1:-}" ${S34A_SECONDS:-540}
part_ttest() {
  (cd python/tests && PYTHONPATH=../ FLASHJIT_LIB=../../build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s34a \
    timeout $(bound 120) python3 -m unittest -v test_train >"$out/ttest.log" 2>&1)
  echo "ttest: exit $?"; grep -E "^(Ran|OK|FAIL|ERROR)|Error" "$out/ttest.log" | cut -c1-200 | tail -20
}
part_f16() { S29_PARTS=f16 S29_SECONDS=$(bound 220) bash bench/probes/s29.sh "$out/s29"; }
part_f16any() {
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s34a-f16 timeout $(bound 220) \
    python3 bench/bwd_compare.py --dims 64,96,128,192,256 --dtypes f16 \
    --gqa "1,32,8,8192,128,1;4,32,8,2048,128,1;2,16,4,8192,128,1;1,32,8,8192,128,0" \
    --out "$out/f16" >"$out/f16.log" 2>&1
  echo "f16any: exit $?"; grep -E "geomean|gqa|Error" "$out/f16.log" | cut -c1-400
}
part_varlen() {
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s34a \
    timeout $(bound 60) python3 bench/varlen_py.py >"$out/varlen.log" 2>&1
  echo "varlen: exit $?"; grep -E "varlen_py|Error" "$out/varlen.log" | cut -c1-300
}
s33a() { S33A_PARTS=$1 S33A_SECONDS=$2 bash bench/probes/s33a.sh "$out/s33a"; }
part_gptc() { s33a gptc $(bound 170); }
part_ntest() { s33a ntest $(bound 60); }
part_gpt() { s33a gpt $(bound 120); }
part_cmp() { s33a cmp $(bound 320); }
part_cmpd() {
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s34a \
    timeout $(bound 200) python3 bench/train_mods_compare.py --cases document,causal \
    --out "$out/cmpd" >"$out/cmpd.log" 2>&1
  echo "cmpd: exit $?"; grep -E "^train|Error" "$out/cmpd.log" | cut -c1-400 | head -12
}
parts_run s34a ${S34A_PARTS:-f16 cmp gptc gpt varlen}
