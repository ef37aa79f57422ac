#!/bin/bash
# s31a.sh OUTDIR -- the thirty-first session's first call, from the
# repository root with build/ (main's, d7d964f) and build-tc/
# (turnclock.patch's build, slimmed) carried.  S31A_PARTS (default
# "f16 gptc py tc prof"), the whole bounded by S31A_SECONDS (default 470):
#   f16   s29.sh's f16 part: the backward's fp16 sweep and GQA rows
#         (issue 31's bar, its fp16 half; H200 only, skipped elsewhere).
#   tc    turnclock.sh: the share of the deterministic backward's main
#         loop spent spinning in dQ's turn waits, per head dim and mask.
#   prof  bench/probes/train_prof.py full,causal,window,document with
#         PROF_NO_FLEX=1: where issue 33's forward + backward time goes
#         (kernels against the event time: the host's share), cuDNN's
#         beside the plain cases.
#   gap   s29.sh's gap part (bench/probes/bwd_gap.py: the backward
#         through autograd against the op alone, under the profiler).
#   py    the package's backward tests with the gradient-buffer aliasing
#         fix (test_calls' FusedQKVBackward, test_gpu.Backward).
#   gptc  s30c.sh's gptc part: examples/gpt_train.py under torch.compile
#         (both models compiled), the steps interleaved (issue 31's GPT
#         step bar with the eager call's host time gone).
#   gqa   s29.sh's gqa part (GQA deterministic rows, the d128 sweep).
set -u
. bench/probes/parts_lib.sh
parts_start s31a "${1:-}" ${S31A_SECONDS:-470}
part_f16() { S29_PARTS=f16 S29_SECONDS=$(bound 220) bash bench/probes/s29.sh "$out/s29"; }
part_gptc() { S30C_PARTS=gptc S30C_SECONDS=$(bound 160) bash bench/probes/s30c.sh "$out/s30c"; }
part_gap() { S29_PARTS=gap S29_SECONDS=$(bound 120) bash bench/probes/s29.sh "$out/s29"; }
part_gqa() { S29_PARTS=gqa S29_SECONDS=$(bound 120) bash bench/probes/s29.sh "$out/s29"; }
part_tc() {
  TURNCLOCK_BUDGET=$(bound 200) timeout $(bound 230) bash bench/probes/turnclock.sh >"$out/turnclock.log" 2>&1
  echo "tc: exit $?"; cat "$out/turnclock.log"
}
part_prof() {
  PROF_NO_FLEX=1 PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s31-prof \
    timeout $(bound 150) python3 bench/probes/train_prof.py full,causal,window,document 10 >"$out/prof.log" 2>&1
  echo "prof: exit $?"; grep -v Warning "$out/prof.log" | cut -c1-150 | head -90
}
part_py() {
  (cd python/tests && PYTHONPATH=.. FLASHJIT_LIB=$root/build/libflashjit.so timeout $(bound 90) \
    python3 -m unittest test_calls.FusedQKVBackward test_gpu.Backward) >"$out/py.log" 2>&1
  echo "py: exit $?"; tail -4 "$out/py.log"
}
parts_run s31a ${S31A_PARTS:-f16 gptc py tc prof}
