#!/bin/bash
# bwd_rot.sh OUTDIR -- the deterministic backward's rotation (branch
# bwdrot: backward.c's rotates sets g.deterministic 2 where every key tile
# walks every query tile and a head's key tiles fit the multiprocessors;
# the narrow wgmma kernel then starts key tile t at query tile t nq / T,
# scheduler.cuh's kv_rank following), prepared 2026-12-05 without a GPU.
# From build/ with the branch's build carried as build/ (the host sets 2:
# templates alone do not do it).  (1) gpu_backward_deterministic (its
# rotated cases: (1,8/8,2048,128), (2,8/2,700/1000,64) softcap, (1,4/4,
# 333/2000,96); 0 of 9 reruns may differ) and gpu_backward's first
# minute; (2) bench/bwd_compare.py at d64 and d128 (its det_us column is
# the deterministic mode) with the rotation, then with
# FLASHJIT_BWD_ROTATE=0 (the plain order), in the same call.
# Prediction: the non-causal deterministic rows at S = 2048 from
# 1.38-1.40x the default to at most 1.15x; at 8192 (64 key tiles) from
# 1.22-1.27x to about 1.1x; causal rows and the default mode unchanged.
set -u
out=${1:-/tmp}
mkdir -p "$out"
timeout 200 ./tests/fj_tests gpu_backward_deterministic >"$out/rot_det.log" 2>&1
echo "rot gpu_backward_deterministic: exit $? ($(grep -c '^ok' "$out/rot_det.log") ok, $(grep -c FAIL "$out/rot_det.log") FAIL)"
grep -E "FAIL|none deterministic" "$out/rot_det.log" | head -12
timeout 60 ./tests/fj_tests gpu_backward >"$out/rot_bwd.log" 2>&1
echo "rot gpu_backward: exit $? ($(grep -c '^ok' "$out/rot_bwd.log") ok, $(grep -c FAIL "$out/rot_bwd.log") FAIL)"
for rot in 1 0; do
  (cd .. && FLASHJIT_BWD_ROTATE=$rot PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout 140 \
     python3 bench/bwd_compare.py --quick --dims 64,128) >"$out/rot_compare_$rot.log" 2>&1
  echo "rot compare FLASHJIT_BWD_ROTATE=$rot: exit $?"
  grep -E "deterministic|^\|" "$out/rot_compare_$rot.log" | head -14
done
