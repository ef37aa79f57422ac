#!/bin/bash
# s15.sh OUTDIR -- the fifteenth session's one call (from the repository
# root, build/ carried): what must not wait for another session first,
# each bounded, all within 540 s.
#   1. the package's GPU tests of the fourteenth session's training work
#      (pending.sh l's Python part: test_gpu.Backward, test_ring,
#      test_train_varlen.VarlenBackward; its C part ran on the H100 in
#      this session's first call);
#   2. the wide backward's pair against the 64-key kernel (pair.sh, no
#      tests: they ran in the first call);
#   3. the backward beside cuDNN and flash at head dim 256 (bwd_compare);
#   4. ncu on the head-dim-256 backward, the pair and the 64-key kernel
#      (where its time goes: stall reasons, the tensor pipe);
#   5. pending.sh a's GPU tests (unrun since the thirteenth session).
#   S15_PARTS (default "pchk l pair cmp ncu a"; pchk: the pair where
#   nothing is masked, three checked calls) picks and orders them; S15_SECONDS
#   the whole bound.
set -u
. bench/probes/parts_lib.sh
parts_start s15 "${1:-}" ${S15_SECONDS:-540}
. bench/device_env.sh
part_l() {
(cd /work/main/python/tests && PYTHONPATH=.. FLASHJIT_LIB=/work/main/build/libflashjit.so timeout $(bound 170) \
  python3 -m unittest -v test_gpu.Backward test_ring test_train_varlen.VarlenBackward) >"$out/l_python.log" 2>&1
echo "s15 l python: exit $? ($(grep -E '^Ran [0-9]+ tests' "$out/l_python.log" | tail -1); $(grep -cE '\.\.\. ok$' "$out/l_python.log") ok, $(grep -cE 'skipped' "$out/l_python.log") skipped)"
grep -E "^(FAIL|ERROR):|Error|^OK|^FAILED" "$out/l_python.log" | head -8
}
part_pair() {
(cd "$root" && PAIR_TESTS="" PAIR_SHAPES="8,8,2048,256;8,8,2048,256 --causal;2,8,8192,256;2,8,8192,256 --causal" \
  timeout $(bound 120) bash bench/probes/pair.sh "$out/pair") 2>&1 | grep -E "^pair" | cut -c1-200
}
part_cmp() {
(cd /work/main && PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout $(bound 130) \
  python3 bench/bwd_compare.py --quick --dims 256 --out "$out") >"$out/bwd_compare.log" 2>&1
echo "s15 bwd_compare: exit $?"
grep -E "^bwd|^geomean|Error" "$out/bwd_compare.log" | cut -c1-330
}
part_ncu() {
for pair in 1 0; do
  FLASHJIT_BWD_PAIR=$pair timeout $(bound 80) ncu --section SpeedOfLight --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis -k regex:fj_bwd_attn -c 1 \
    ./flashjit run --backward --shape 2,8,4096,256 --dtype bf16 --iters 1 >"$out/ncu_pair$pair.log" 2>&1
  echo "s15 ncu pair=$pair: exit $?"
  grep -E "Duration|Throughput|Warp Cycles Per|Issue Slots|stalled|Stall|Executed Ipc|pipe" "$out/ncu_pair$pair.log" | cut -c1-220 | head -24
done
}
part_pchk() {
# The pair where nothing is masked, checked against the float64 reference
# (gpu_backward's three pair cases, as CLI calls), then the wide kernel's
# other changes since it last ran (b1b304b's descriptors, 6ad891b's held
# tiles at d224): d256 and d224 causal, d192.
for args in "--shape 1,8,300,256 --heads-kv 2 --seq-kv 333 --sinks 0.5 --dtype bf16" \
            "--shape 1,2,100,256 --seq-kv 129 --dtype f16" \
            "--shape 3,4,257,224 --heads-kv 2 --seq-kv 257 --varlen 257:100,0:50,100:257 --softcap 20 --dtype f16" \
            "--shape 1,2,640,256 --causal --dtype bf16" \
            "--shape 1,2,500,224 --causal --dtype f16" \
            "--shape 1,4,500,192 --heads-kv 2 --seq-kv 700 --dtype f16"; do
  timeout $(bound 40) ./flashjit run --backward $args --check >"$out/pchk.log" 2>&1
  echo "s15 pchk $args: exit $?; $(grep -E '^check' "$out/pchk.log" | grep -oE 'dq rel_err=[^ ]+|-> [A-Z]+' | tr '\n' ' ') $(grep -oE 'fj_bwd_attn[a-z0-9_]+|grid: [0-9,]+' "$out/pchk.log" | tr '\n' ' ')"
  grep -iE "error|invalid" "$out/pchk.log" | head -2
done
}
part_a() {
for t in gpu_wide_heads gpu_threads_workspace gpu_serving_varlen gpu_mla_paged gpu_fp8_kv gpu_jit_tiers; do
  timeout $(bound 45) ./tests/fj_tests "$t" >"$out/a_$t.log" 2>&1
  echo "s15 a $t: exit $? ($(grep -c ' ok$\|^ok ' "$out/a_$t.log") ok, $(grep -c FAIL "$out/a_$t.log") FAIL)"
  grep -E "FAIL|error" "$out/a_$t.log" | head -4
done
timeout $(bound 60) ./flashjit-demo >"$out/a_demo.log" 2>&1
echo "s15 a demo: exit $?; $(grep -cE 'PASS$' "$out/a_demo.log") PASS, $(tail -1 "$out/a_demo.log")"
}
parts_run s15 ${S15_PARTS:-pchk l pair cmp ncu a}
