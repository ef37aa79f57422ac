#!/bin/bash
# s33a.sh OUTDIR -- the thirty-third session's call, from the repository
# root with build/ carried (main's build, slimmed, with
# libflashjit_torch.so: the package's C++ training call, _native.py).
# S33A_PARTS (default "test host gattn gpt"), bounded by S33A_SECONDS (520):
#   test   the package's test_native (the C++ path against the package's
#          own on the GPU: outputs' and deterministic gradients' bits) and
#          test_train.
#   host   bench/probes/mods_host.py causal, FLASHJIT_NATIVE=0 then 1: a
#          training call's forward and backward host time.
#   gattn  bench/probes/gpt_attn_prof.py (the GPT example's attention call
#          beside SDPA), FLASHJIT_NATIVE=0 then 1.
#   gpt    examples/gpt_train.py --steps 100 --time-rounds 16
#          --time-steps 10 (eager, interleaved beside SDPA), native on.
#   ntest  test_native alone (with expressions and block masks too).
#   prof   bench/probes/train_prof.py full,causal,window,document 10
#          (PROF_NO_FLEX=1), FLASHJIT_NATIVE=0 then 1: each call's event
#          time against its kernels'.
#   cmp    bench/train_mods_compare.py --cases full,causal,window,document
#          (issue 33's table beside FlexAttention), native on.
#   gptc   examples/gpt_train.py --compile, interleaved (G3's run), with
#          FLASHJIT_NATIVE=0 (the package's Python ops) then with the
#          compiled graphs' C++ ops (csrc/compiled.cpp).
set -u
. bench/probes/parts_lib.sh
parts_start s33a "${1:-}" ${S33A_SECONDS:-520}
env_py() { PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s33a "$@"; }
part_test() {
  (cd python/tests && PYTHONPATH=../ FLASHJIT_LIB=../../build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s33a \
    timeout $(bound 200) python3 -m unittest -v test_native test_train >"$out/test.log" 2>&1)
  echo "test: exit $?"; grep -E "^(test_|Ran|OK|FAIL|ERROR)|Error" "$out/test.log" | cut -c1-200 | tail -40
}
part_host() {
  for n in 0 1; do
    FLASHJIT_NATIVE=$n env_py timeout $(bound 60) python3 bench/probes/mods_host.py causal 30 \
      >"$out/host$n.log" 2>&1
    echo "host native=$n: exit $?"; grep "^mods_host.*us" "$out/host$n.log"
  done
}
part_gattn() {
  for n in 0 1; do
    FLASHJIT_NATIVE=$n env_py timeout $(bound 90) python3 bench/probes/gpt_attn_prof.py 8,512,8,2,64 200 \
      >"$out/gattn$n.log" 2>&1
    echo "gattn native=$n: exit $?"; grep "^gpt_attn" "$out/gattn$n.log"
  done
}
part_gpt() {
  env_py timeout $(bound 200) python3 examples/gpt_train.py --steps 100 --time-rounds 16 \
    --time-steps 10 >"$out/gpt.log" 2>&1
  echo "gpt: exit $?"; grep -E "median step|interleaved|PASS|FAIL|Error" "$out/gpt.log" | cut -c1-300
}
part_ntest() {
  (cd python/tests && PYTHONPATH=../ FLASHJIT_LIB=../../build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s33a \
    timeout $(bound 100) python3 -m unittest -v test_native >"$out/ntest.log" 2>&1)
  echo "ntest: exit $?"; grep -E "^(test_|Ran|OK|FAIL|ERROR)|Error" "$out/ntest.log" | cut -c1-200 | tail -20
}
part_prof() {
  for n in 0 1; do
    FLASHJIT_NATIVE=$n PROF_NO_FLEX=1 env_py timeout $(bound 80) python3 bench/probes/train_prof.py \
      full,causal,window,document 10 >"$out/prof$n.log" 2>&1
    echo "prof native=$n: exit $?"; grep "^prof" "$out/prof$n.log"
  done
}
part_cmp() {
  env_py timeout $(bound 300) python3 bench/train_mods_compare.py --cases full,causal,window,document \
    --out "$out/cmp" >"$out/cmp.log" 2>&1
  echo "cmp: exit $?"; grep -E "^train|Error" "$out/cmp.log" | cut -c1-400 | head -12
}
part_gptc() {
  for n in 0 1; do
    FLASHJIT_NATIVE=$n env_py timeout $(bound 200) python3 examples/gpt_train.py --steps 100 \
      --compile --time-rounds 16 --time-steps 10 >"$out/gptc$n.log" 2>&1
    echo "gptc native=$n: exit $?"
    grep -E "median step|interleaved|PASS|FAIL|Error" "$out/gptc$n.log" | cut -c1-300
  done
}
parts_run s33a ${S33A_PARTS:-test host gattn gpt}
