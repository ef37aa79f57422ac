#!/bin/bash
# s16.sh OUTDIR -- the sixteenth session's calls (from the repository root,
# build/ carried, and build-fd/templates for part fd): main's unrun kernels
# first (cd9c913's backward instructions: the checked calls, gpu_backward,
# gpu_backward_mods, the backward under memcheck), the package's training
# tests, then branch fwddesc (fwddesc.sh), branch fdpw (part fdpw: the
# same probe with build-fdpw/templates: fwddesc's descriptors and the P V
# wait kept after the softmax; fdpwl: branch fdpwl's, lazy rescaling for
# 16-bit types too, no tests), the pair's A/B and bwd_compare; ncuf: ncu
# on the FP8 d128 forward, main and the branches.  S16_T: part t's tests.
#   S16_PARTS (default "pchk t san l fd") picks and orders them; S16_SECONDS
#   the whole bound; FD_SHAPES and FD_TESTS pass to fwddesc.sh.
set -u
. bench/probes/parts_lib.sh
parts_start s16 "${1:-}" ${S16_SECONDS:-570}
part_pchk() { (cd "$root" && S15_PARTS=pchk S15_SECONDS=$(bound 90) bash bench/probes/s15.sh "$out") 2>&1 | grep -E "^s15|rror"; }
part_t() {
  (cd "$root" && . bench/device_env.sh && . ../bench/probes/ab_lib.sh &&
   ab_tests s16 "$out" "${S16_T:-gpu_backward:$(bound 200) gpu_backward_mods:$(bound 120)}")
}
part_san() {
  (cd "$root" && . bench/device_env.sh &&
   timeout $(bound 170) compute-sanitizer --tool memcheck --error-exitcode 9 ./tests/fj_tests gpu_sanitize_backward >"$out/san.log" 2>&1
   echo "s16 memcheck gpu_sanitize_backward: exit $? ($(grep -E 'ERROR SUMMARY' "$out/san.log" | tail -1 | sed 's/=* //'); $(grep -c '^ok\| ok$' "$out/san.log") ok)")
}
part_l() { (cd "$root" && S15_PARTS=l S15_SECONDS=$(bound 170) bash bench/probes/s15.sh "$out") 2>&1 | grep -vE "^s15 gpu"; }
part_fd() { (cd "$root" && timeout $(bound 300) bash bench/probes/fwddesc.sh "$out/fd") 2>&1 | grep -E "^fwddesc|FAIL" | cut -c1-220; }
# ab_fwd TAG DIR: fwddesc.sh's checks, tests and A/B with the templates in DIR.
ab_fwd() { (cd "$root" && FD_TEMPLATES=$root/$2/templates timeout $(bound 300) bash bench/probes/fwddesc.sh "$out/$1") 2>&1 | grep -E "^fwddesc|FAIL" | sed "s/^fwddesc/$1/" | cut -c1-220; }
part_fdpw() { ab_fwd fdpw build-fdpw; }
part_fdpwl() { FD_TESTS="" ab_fwd fdpwl build-fdpwl; }
part_pair() { (cd "$root" && S15_PARTS=pair S15_SECONDS=$(bound 120) bash bench/probes/s15.sh "$out") 2>&1 | grep -E "^pair"; }
part_cmp() { (cd "$root" && S15_PARTS=cmp S15_SECONDS=$(bound 130) bash bench/probes/s15.sh "$out") 2>&1 | grep -vE "^s15 gpu"; }
part_ncu() { (cd "$root" && S15_PARTS=ncu S15_SECONDS=$(bound 170) bash bench/probes/s15.sh "$out") 2>&1 | grep -vE "^s15 gpu"; }
# ncu on the FP8 d128 forward (issue 32's gap), main's templates and each
# branch's given in S16_NCU_TEMPLATES (build-X names, ' ' between; default
# build-fdpw): issue slots, pipes, stall reasons.
part_ncuf() {
  local t
  for t in "" ${S16_NCU_TEMPLATES-build-fdpw}; do
    (cd "$root" && . bench/device_env.sh &&
     FLASHJIT_TEMPLATE_DIR=${t:+$root/$t/templates} timeout $(bound 90) ncu --section SpeedOfLight \
       --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats \
       --section SchedulerStats -k regex:"fj_attn_d128_m[0-9a-z_]*e4m3_fl1$" -c 1 \
       ./flashjit run --shape 4,16,4096,128 --dtype e4m3 --iters 1 >"$out/ncuf_${t:-main}.log" 2>&1
     echo "s16 ncuf ${t:-main}: exit $?"
     grep -E "Duration|Issue Slots Busy|Issued Ipc|Warp Cycles Per Issued|Stall|No Eligible|Eligible Warps|pipe|Tensor" \
       "$out/ncuf_${t:-main}.log" | cut -c1-200 | head -30)
  done
}
part_a() { (cd "$root" && S15_PARTS=a S15_SECONDS=$(bound 300) bash bench/probes/s15.sh "$out") 2>&1 | grep -vE "^s15 gpu"; }
parts_run s16 ${S16_PARTS:-pchk t san l fd}
echo "s16 done at ${SECONDS}s"
