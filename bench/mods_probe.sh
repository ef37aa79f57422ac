#!/bin/bash
# mods_probe.sh OUTDIR -- where a score modification's cost goes on the
# wgmma family, from build/ on the GPU machine: (4, 16, 4096, 128) bf16
# causal, one explicit variant (128 x 128 tiles, 12 warps, 2 stages), each
# modification rendered from copies of templates/ that differ by one sed
# (VARIANTS: "name|file|sed expression" per line; "base" is templates/ as
# it is), timed twice, interleaved; then each case's SASS opcode counts
# (cuobjdump) and its pipes' utilisation under ncu (OUTDIR/mods_*.txt).
set -u
out=${1:-/tmp}
root=$(cd "$(dirname "$0")/.." && pwd)
# PROBE_V="" times each run's own flags alone (the library's pick, or any
# variant they name).
V=${PROBE_V-"--shape 4,16,4096,128 --dtype bf16 --causal --mma wgmma --tile-m 128 --warps 12 --tile-n 128 --stages 2 --swizzle xor --softmax regs"}
E="--head-dim 128 --dtype bf16 --causal --mma wgmma --tile-m 128 --warps 12 --tile-n 128 --stages 2 --swizzle xor --softmax regs"
ALIBI="--score-mod s+slopes(h)*(float)(kv-q) --param slopes:f32[16]"
BIAS="--score-mod s+bias(h,q-kv+4096) --param bias:f32[16,8192]"
# The default variants: ldg (a score's tensor reads all by __ldg under a
# branch, as before 26eaf96), sel-ldg (a score's per-score reads by
# __ldg at a clamped index and a select: no branch), magic ((float)(kv-q)
# as an integer add and a float subtraction instead of the conversion).
MAGIC='s/^{{ mods.score_text }}$/{{ (mods.score_text:gsub("%(float%)%(kv%-q%)", "(__int_as_float(0x4B400000 + kv - q) - 12582912.f)")) }}/'
variants=("base||")
while IFS= read -r v; do [ -n "$v" ] && variants+=("$v"); done <<<"${VARIANTS:-"ldg|mods.lua|s/p.shared = not per_score/p.shared = false/;s/p.read = per_score and .*$/p.read = LDG[p.type]/
sel-ldg|mods.lua|s/p.shared = not per_score/p.shared = true/
magic|mods.cuh|$MAGIC"}"
for v in "${variants[@]}"; do
  IFS='|' read -r name file expr <<<"$v"
  rm -rf "/tmp/fj-v-$name" && cp -r "$root/templates" "/tmp/fj-v-$name"
  [ -z "$expr" ] || sed -i "$expr" "/tmp/fj-v-$name/$file"
done
# "label|variant|flags" per line.
runs=${RUNS:-"plain|base|
softcap|base|--softcap 30
alibi|ldg|$ALIBI
alibi|base|$ALIBI
alibi|magic|$ALIBI
relbias|ldg|$BIAS
relbias|base|$BIAS
relbias|sel-ldg|$BIAS"}
for round in 1 2; do
  while IFS='|' read -r label name flags; do
    [ -n "$label" ] || continue
    log=$(FLASHJIT_TEMPLATE_DIR=/tmp/fj-v-$name ./flashjit run $V $flags --iters 30 --no-disk-cache 2>&1)
    us=$(grep -oE 'median [0-9.]+ us' <<<"$log" | grep -oE '[0-9.]+')
    echo "probe $round $label [$name]: ${us:-?} us"
    [ -n "$us" ] || tail -3 <<<"$log"
  done <<<"$runs"
done
# SASS and pipes of the cases named in SASS_RUNS (same form as RUNS).
while IFS='|' read -r label name flags; do
  [ -n "$label" ] || continue
  f="$out/mods_${label}_${name}.txt"
  FLASHJIT_TEMPLATE_DIR=/tmp/fj-v-$name ./flashjit emit $E $flags --what cubin -o /tmp/k.cubin --no-disk-cache
  {
    echo "== $label [$name] $flags"
    FLASHJIT_TEMPLATE_DIR=/tmp/fj-v-$name ./flashjit emit $E $flags --what resources --no-disk-cache | grep -E 'registers|spill'
    FLASHJIT_TEMPLATE_DIR=/tmp/fj-v-$name ./flashjit emit $E $flags --what log --no-disk-cache | grep -E 'ptxas' | head -4
    cuobjdump -sass /tmp/k.cubin | grep -oE '^\s+/\*[0-9a-f]{4,}\*/\s+[A-Z0-9_.]+' | awk '{print $2}' | sort | uniq -c | sort -rn | head -40
    FLASHJIT_TEMPLATE_DIR=/tmp/fj-v-$name ncu --metrics 'regex:sm__inst_executed_pipe_[a-z0-9_]+\.avg\.pct_of_peak_sustained_active$,regex:sm__pipe_[a-z0-9_]+_cycles_active\.avg\.pct_of_peak_sustained_active$,smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum' \
      -k regex:fj_attn -c 1 ./flashjit run $V $flags --iters 1 --warmup 0 --no-disk-cache 2>&1 | grep -vE '^==PROF==' | grep -E '%|usecond|msecond' | awk '$NF != "0" && $NF != "0.00"'
  } >"$f" 2>&1
  echo "$f: $(grep -cE 'pct|time' "$f") metric lines"
  grep -E 'MUFU|I2F|LDG|HGMMA|spill' "$f" | head -12
  grep -E 'xu|alu|fma|issue_active|lsu|time' "$f" | head -16
done <<<"${SASS_RUNS-"plain|base|
softcap|base|--softcap 30
alibi|ldg|$ALIBI
alibi|base|$ALIBI
alibi|magic|$ALIBI
relbias|base|$BIAS"}"
