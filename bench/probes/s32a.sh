#!/bin/bash
# s32a.sh OUTDIR -- the thirty-second session's next call, from the
# repository root with build/ (main's) and build-tc/ (turnclock.patch's
# build, slimmed; the patch as of this commit) carried.  S32A_PARTS
# (default "f16 gattn prof tc"; gptc in a second call), the whole bounded
# by S32A_SECONDS (470):
#   f16   s29.sh's f16 part: the backward's fp16 sweep and GQA rows (issue
#         31's bar, its fp16 half; H200 only, skipped elsewhere).
#   tc    turnclock.sh with the wide kernel's walk clocks counted once a
#         finishing thread (the 2026-12-07 H100 run summed a start for
#         every consumer thread and a finish for lane 0 only: d192 and
#         d256 printed an overflowed loop_cycles).
#   prof  s31a.sh's prof (train_prof.py full,causal,window,document,
#         PROF_NO_FLEX=1) with PROF_CPU=1: the host side's ops by self
#         time, where the documents case's 328 us gap (event - kernels,
#         H100) goes.
#   gattn bench/probes/gpt_attn_prof.py (never run): the GPT example's
#         attention call alone, flashjit's and SDPA's event, host and
#         kernel time -- whether G3's gap is kernels or host.
#   gptc  s30c.sh's gptc part (examples/gpt_train.py --compile,
#         interleaved), for the H200's figure beside the H100's 1.14x.
set -u
. bench/probes/parts_lib.sh
parts_start s32a "${1:-}" ${S32A_SECONDS:-470}
# Every part but gattn is s31a.sh's (prof with PROF_CPU=1).
s31a() { S31A_PARTS=$1 S31A_SECONDS=$2 bash bench/probes/s31a.sh "$out/s31a"; }
part_f16() { s31a f16 $(bound 230); }
part_tc() { s31a tc $(bound 240); }
part_prof() { PROF_CPU=1 s31a prof $(bound 160); }
part_gptc() { s31a gptc $(bound 170); }
part_gattn() {
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s32-gattn \
    timeout $(bound 90) python3 bench/probes/gpt_attn_prof.py 8,512,8,2,64 200 >"$out/gattn.log" 2>&1
  echo "gattn: exit $?"; grep -v Warning "$out/gattn.log" | cut -c1-150 | head -50
}
parts_run s32a ${S32A_PARTS:-f16 gattn prof tc}
