#!/bin/bash
# vtin.sh OUTDIR -- branch vtin (FP8's V transposed inside the kernel, up to
# head dim 128 without a score function: no _vt pass, no workspace), from
# the repository root (device_env.sh's conventions) with build/ (main's)
# and build-vtin/ (the branch's slimmed build, its templates/ beside it:
# `git archive vtin templates | tar -x -C build-vtin`) carried.
#   1. checked calls with the branch's templates whose mbarrier waits trap
#      (a wrong phase fails instead of hanging): in-kernel (d64, d128; GQA,
#      tails, both causal corners) and the _vt pass (d256, d128 softcap);
#   2. racecheck and synccheck on one in-kernel call;
#   3. the FP8 GPU tests with the branch's build (VTIN_TESTS);
#   4. forward time, main's build then the branch's, two rounds (VTIN_SHAPES);
#   5. the branch's opt-in FP8 key tiles of 192 and 224 (fp8_flush -1: one
#      accumulator) beside its default and fp8_flush -1 at 128 (VTIN_WIDE).
set -u
out=${1:-/tmp/fj-vtin}
mkdir -p "$out"
root=$(pwd)
. bench/device_env.sh
vb=$root/build-vtin
[ -x "$vb/flashjit" ] && [ -f "$vb/templates/attention_wgmma.cu" ] || { echo "vtin: no build or templates at $vb"; exit 2; }
trap_t=$out/trap_templates
rm -rf "$trap_t" && cp -r "$vb/templates" "$trap_t"
sed -i 's/WGMMA_SPIN_LIMIT or 0/1 << 26/' "$trap_t/attention_wgmma.cu"
nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/vtin gpu: /'
for args in "--shape 1,4,1000,128" "--shape 1,4,1000,128 --causal" "--shape 2,8,700,64 --causal" \
            "--shape 1,8,777,128 --heads-kv 2" "--shape 1,4,300,128 --causal=bottom-right" \
            "--shape 3,4,129,64" "--shape 1,4,700,256 --causal" "--shape 1,4,500,128 --causal --softcap 30" \
            "--shape 1,4,1000,128 --tile-n 192 --fp8-flush -1" "--shape 2,8,700,64 --causal --tile-n 192 --fp8-flush -1" \
            "--shape 1,8,1000,128 --heads-kv 2 --causal --tile-n 224 --fp8-flush -1"; do
  FLASHJIT_TEMPLATE_DIR=$trap_t timeout 90 "$vb/flashjit" run $args --dtype e4m3 --check >"$out/check.log" 2>&1
  echo "vtin check $args: exit $?; $(grep -oE 'fj_attn[a-z0-9_]+' "$out/check.log" | head -1) $(grep -E '^check' "$out/check.log" | grep -oE 'rel_err=[^ ]+|-> [A-Z]+' | tr '\n' ' ')"
  grep -iE "error|trap|invalid|illegal" "$out/check.log" | head -2
done
for tool in racecheck synccheck; do
  timeout 120 compute-sanitizer --tool $tool --error-exitcode 9 "$vb/flashjit" run --shape 1,4,640,128 --dtype e4m3 --causal --iters 1 >"$out/$tool.log" 2>&1
  echo "vtin $tool: exit $? ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tail -1))"
done
. ../bench/probes/ab_lib.sh
(cd "$vb" && ab_tests vtin "$out" "${VTIN_TESTS-gpu_fp8_forward:150 gpu_fp8_out:60 gpu_fp8_needle:90 gpu_fp8_mods:90}")
IFS=';' read -ra shapes <<<"${VTIN_SHAPES:-4,16,4096,128;4,16,4096,128 --causal;4,32,4096,64;1,16,16384,128;4,8,4096,256}"
for shape in "${shapes[@]}"; do
  line="vtin $shape:"
  for round in 1 2; do
    for b in "$root/build" "$vb"; do
      us=$(timeout 60 "$b/flashjit" run --dtype e4m3 --shape $shape --iters 30 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      line="$line $( [ "$b" = "$vb" ] && echo vtin || echo main)=${us:-?}"
    done
  done
  echo "$line"
done
IFS=';' read -ra shapes <<<"${VTIN_WIDE:-4,16,4096,128;4,16,4096,128 --causal;1,16,16384,128;4,32,4096,64}"
for shape in "${shapes[@]}"; do
  line="vtin wide $shape:"
  for round in 1 2; do
    for v in "" "--fp8-flush -1" "--tile-n 192 --fp8-flush -1" "--tile-n 224 --fp8-flush -1"; do
      us=$(timeout 60 "$vb/flashjit" run --dtype e4m3 --shape $shape $v --iters 30 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      line="$line [${v:-default}]=${us:-?}"
    done
  done
  echo "$line"
done
