#!/bin/bash
# widepipe.sh OUTDIR -- the wide backward's roles issuing each step's first
# product a step ahead (issue 31; branch widepipe: its templates/ copied to
# build-wp/templates here and carried with build/).  From the repository
# root (device_env.sh's conventions).  Two checked calls, the GPU tests of
# the wgmma backward with those templates, then before (the build's own
# templates) against after, in one process each, alternately, two rounds,
# backward time (WP_SHAPES, ';' between shapes; WP_TESTS).
set -u
out=${1:-/tmp/fj-widepipe}
mkdir -p "$out"
root=$(pwd)
wp=${WP_TEMPLATES:-$root/build-wp/templates}
. bench/device_env.sh
[ -f "$wp/attention_bwd_wgmma.cu" ] || { echo "widepipe: no templates at $wp"; exit 2; }
nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/widepipe gpu: /'
for args in "--shape 1,2,640,256 --causal --dtype bf16" "--shape 1,4,500,192 --heads-kv 2 --seq-kv 700 --dtype f16"; do
  FLASHJIT_TEMPLATE_DIR=$wp timeout 60 ./flashjit run --backward $args --check >"$out/check.log" 2>&1
  echo "widepipe check $args: exit $?; $(grep -oE 'fj_bwd_attn[a-z0-9_]+' "$out/check.log" | head -1) $(grep -E '^check' "$out/check.log" | grep -oE 'dq rel_err=[^ ]+|-> [A-Z]+' | tr '\n' ' ')"
  grep -q -- '-> PASS' "$out/check.log" || { echo "widepipe: a check did not pass; no more"; exit 1; }
done
. ../bench/probes/ab_lib.sh
ab_tests widepipe "$out" "${WP_TESTS-gpu_backward:200}" FLASHJIT_TEMPLATE_DIR="$wp"
ab_shapes widepipe "${WP_SHAPES:-8,8,2048,256 --causal;2,8,8192,256 --causal;8,10,2048,192;8,10,2048,192 --causal;8,8,2048,256}" \
  "--backward --dtype bf16" before "FLASHJIT_BWD_PAIR=0 FLASHJIT_TEMPLATE_DIR=" after "FLASHJIT_BWD_PAIR=0 FLASHJIT_TEMPLATE_DIR=$wp"
