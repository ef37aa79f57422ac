#!/bin/bash
# fp8_mods.sh OUTDIR -- FP8 attention with score expressions and the
# softcap (branch fp8mods: the descales join the score function's input
# scale per work tile; head dims up to 128), prepared 2026-12-05 without a
# GPU.  fp8_mods.patch is the branch's templates against main; the
# branch's tests (gpu_fp8_mods, the family test) need its build.  From
# build/ on the GPU machine with main's build: `flashjit run --check`
# (the float64 reference of the dequantised inputs; the CLI's problem
# check does not refuse these, only the template did) with the patched
# templates, then each case's median beside the same call without the
# modification (the softcap's cost), one round.
set -u
out=${1:-/tmp}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
rm -rf /tmp/fj-fp8mods && mkdir /tmp/fj-fp8mods && cp -r "$here/../../templates" /tmp/fj-fp8mods/
(cd /tmp/fj-fp8mods && git apply "$here/fp8_mods.patch") || { echo "fp8_mods: the patch does not apply"; exit 1; }
export FLASHJIT_TEMPLATE_DIR=/tmp/fj-fp8mods/templates
while IFS='|' read -r args mods; do
  line=$(eval "timeout 60 ./flashjit run $args --dtype e4m3 $mods --check --iters 20" 2>&1 | tee -a "$out/fp8_mods.log" |
         grep -E '^check:|median|flashjit run:' | sed -E 's/.*(rel_err=[^ ]+).*(nonfinite=[0-9]+ -> [A-Z]+).*/\1 \2/; s/.*median ([0-9.]+ us).*/\1/' | tr '\n' ' ')
  plain=$(eval "timeout 60 ./flashjit run $args --dtype e4m3 --iters 20" 2>&1 | grep -oE 'median [0-9.]+ us')
  echo "fp8 mods $args $mods: $line| without: $plain"
done <<'EOF2'
--shape 2,8,2048,128|--softcap 30
--shape 2,8,2048,128 --causal|--softcap 5
--shape 1,8,1000,128 --heads-kv 2 --causal=bottom-right --seq-kv 1700|--score-mod 's - 0.125f * (float)(q - kv) / 16.f'
--shape 1,4,700,128 --causal|--score-mod 's * 1.5f' --softcap 20
--shape 1,4,333,64 --seq-kv 400|--score-mod 's * 1.5f' --mask-mod 'kv % 5 != 2' --softcap 20
--shape 4,16,4096,128|--softcap 30
--shape 4,16,4096,128 --causal|--softcap 30
EOF2
