#!/bin/bash
# s30c.sh OUTDIR -- the next call's parts (prepared by the thirtieth
# session, which ran out of device time), from the repository root with
# build/ (main's) carried.  S30C_PARTS (default "f16 gqa gpt gptc"), the
# whole bounded by S30C_SECONDS (default 560):
#   f16   s29.sh's f16 part: the backward's fp16 sweep and the GQA rows
#         (the bar's other half; H200 only, skipped elsewhere), ~200 s.
#   gqa   s29.sh's gqa part: bf16 GQA rows and the d128 sweep, ~60 s.
#   gpt   examples/gpt_train.py --steps 100 with 16 rounds of 10 steps,
#         SDPA's and flashjit's steps alternating one by one (G2's method
#         since its last commit), twice.
#   gptc  the same under torch.compile (both models compiled: the step
#         without most of the eager call's host time), once.
set -u
. bench/probes/parts_lib.sh
parts_start s30c "${1:-}" ${S30C_SECONDS:-560}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)
echo "s30c gpu: $gpu"
part_f16() { S29_PARTS=f16 S29_SECONDS=$(bound 220) bash bench/probes/s29.sh "$out/s29"; }
part_gqa() { S29_PARTS=gqa S29_SECONDS=$(bound 120) bash bench/probes/s29.sh "$out/s29"; }
gpt_run() {  # TAG FLAGS...
  local tag=$1; shift
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s30c-gpt timeout $(bound 150) \
    python3 examples/gpt_train.py --steps 100 --time-rounds 16 --time-steps 10 "$@" >"$out/$tag.log" 2>&1
  echo "$tag: exit $?"; grep -E "median step|interleaved|PASS|FAIL|Error" "$out/$tag.log" | cut -c1-300
}
part_gpt() { gpt_run gpt1; gpt_run gpt2; }
part_gptc() { gpt_run gptc --compile; }
parts_run s30c ${S30C_PARTS:-f16 gqa gpt gptc}
