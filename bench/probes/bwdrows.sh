#!/bin/bash
# bwdrows.sh OUTDIR -- branch bwdrows (the backward's pre- and postprocess
# with 4-element vectors, 16 rows a block; it changes the host's launch, so
# it needs its own build): build-rows/ (the branch's build, slimmed as
# build/ is) beside build/ (main's).  From the repository root
# (device_env.sh's conventions): checked calls with the branch's build
# (every accumulator layout: the narrow and wide wgmma kernels' tiles, the
# mma family's rows at head dim 32; varlen, sinks, GQA, MQA, bshd; the
# one-at-a-time path is the tests'), its gpu_backward (ROWS_TESTS), then
# both builds' backward times in one process each, alternately, two rounds
# (ROWS_SHAPES, ';' between).
set -u
out=${1:-/tmp/fj-rows}
mkdir -p "$out"
root=$(pwd)
. bench/device_env.sh
rb=$root/build-rows
[ -x "$rb/flashjit" ] || { echo "bwdrows: no build at $rb"; exit 2; }
nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/bwdrows gpu: /'
for args in "--shape 2,4,300,128 --dtype bf16" "--shape 1,8,333,64 --heads-kv 2 --causal --dtype f16" \
            "--shape 1,4,257,256 --sinks 0.5 --dtype bf16" "--shape 1,4,200,192 --causal --dtype f16" \
            "--shape 3,4,257,96 --heads-kv 2 --varlen 257:100,0:50,100:257 --dtype bf16" \
            "--shape 1,3,100,32 --dtype f16" "--shape 2,3,77,64 --heads-kv 1 --dtype f16" \
            "--shape 2,4,300,128 --dtype bf16 --layout bshd"; do
  timeout 60 "$rb/flashjit" run --backward $args --check >"$out/check.log" 2>&1
  echo "bwdrows check $args: exit $?; $(grep -E '^check' "$out/check.log" | grep -oE 'd[qkv] rel_err=[^ ]+|-> [A-Z]+' | tr '\n' ' ')"
  grep -iE "error|invalid|unknown" "$out/check.log" | head -2
done
for tb in ${ROWS_TESTS-gpu_backward:200}; do
  t=${tb%%:*}
  (cd "$rb" && timeout ${tb##*:} ./tests/fj_tests "$t") >"$out/$t.log" 2>&1
  echo "bwdrows $t: exit $? ($(grep -c '^ok\| ok$' "$out/$t.log") ok, $(grep -c '^FAIL' "$out/$t.log") FAIL)"
  grep -E "^FAIL|check failed" "$out/$t.log" | head -6
done
IFS=';' read -ra shapes <<<"${ROWS_SHAPES:-8,16,2048,128;2,16,8192,128;8,32,2048,64;8,8,2048,256;4,16,4096,128 --causal}"
for shape in "${shapes[@]}"; do
  line="bwdrows $shape:"
  for round in 1 2; do
    for b in "$root/build" "$rb"; do
      us=$(timeout 60 "$b/flashjit" run --backward --dtype bf16 --shape $shape --iters 30 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      line="$line $([ "$b" = "$rb" ] && echo after || echo before)=${us:-?}"
    done
  done
  echo "$line"
done
