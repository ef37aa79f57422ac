#!/bin/bash
# s23.sh OUTDIR -- the twenty-third session's device calls, from the
# repository root with build/ carried (and build/tmpl-old: the templates
# before the change, `git archive <commit> templates`, for det).  Parts
# (S23_PARTS; S23_SECONDS bounds the whole, default 570):
#   det   the wide kernel's deterministic mode (head dims above 128):
#         a step's dQ turns passed on at the next step's first product,
#         the turn read ahead of the dQ products, and the rotation on
#         pairs and on 64-key tiles (no mask).  gpu_backward_deterministic_pair
#         (with its two rotation cases), bench/probes/det_repeat.py, then
#         bench/bwd_compare.py --quick three ways: this build ("new"),
#         FLASHJIT_BWD_ROTATE=0 ("norot": the turns passed late, no
#         rotation), the templates before ("old": turns passed at once).
#         Predicted: deterministic / default at d256 1.28-1.46 -> 1.1-1.2,
#         the default mode unchanged (within 1-2%).
#   detncu where the deterministic mode's time goes at d256: the main
#         kernel of (8, 8, 2048, 256) bf16 without a mask (the rotation)
#         and (2, 8, 8192, 256) causal, deterministic and default, under
#         ncu (warp states, the stall samples per SASS instruction:
#         OUTDIR/det_<case>_<mode>.csv).
#   tests the backward's GPU tests that a det call's bound cut short
#         (S23_TESTS: NAME:SECONDS ..., default gpu_backward:330).
#   bwdtin the backward's table_inside (0e79c13): gpu_backward_mods (its
#         bias-table cases now take the _tin kernels: tables over every
#         distance their tiles reach), then `flashjit run --backward` of
#         the bias table's (4, 16, 4096, 128) bf16 causal with the table
#         [16, 8192] (proved: _tin) and [16, 8191] (not), and the plain
#         causal backward, alternately, two rounds.  Predicted: _tin
#         0.97-1.0 of the other's time (the fast path ran on every tile
#         already; the branch and registers go); issue 33's bar is the
#         bias table's backward <= 1.15x the plain one's (1.26 at 00da432).
#   sendearly bench/probes/send_early.patch (the pair's consumer 1 sends
#         its dS^T to the other block once its own warpgroup has written
#         it, before it waits for consumer 0 at barrier 2; ncu put 8% of
#         the d256 default's stall samples at the wait for the other
#         block's dS^T, T14's detncu): `flashjit run --backward --check`
#         with the patched templates (d256, the pair, both masks),
#         gpu_backward_deterministic_pair under them, then the backward's
#         median, the tree's templates and the patched ones alternately,
#         two rounds, four d256 shapes.  Predicted 0.97-1.0 of the time.
#   narrowlate bench/probes/narrow_late.patch: the narrow kernel's dQ
#         writer passes a step's turns on once the next step's reductions
#         are issued (a mask's right side, the rotation), as 7b7c2b9 does
#         on the wide kernel: gpu_backward_deterministic under the patched
#         templates, then bench/bwd_compare.py --quick --dims 64,128 under
#         the tree's and the patched templates (the deterministic column).
#         Predicted: deterministic / default up to d128 1.12-1.27 (H200)
#         -> 1.05-1.15; the default mode unchanged.
#   tiers the tiered JIT's first kernel compiled quick (meta.quick:
#         --Ofast-compile=min; J12): gpu_jit_tiers, then each modification's
#         first call (`flashjit run --jit-tiers`, a fresh cache each: the
#         first kernel's compile, load and run) under the tree's templates
#         and under a copy without `meta.quick = 1`, alternately, two
#         rounds.  Predicted: the first result 0.1-0.2 s sooner on this
#         host (NVRTC about 0.55 of its time), the first kernel's own run
#         somewhat slower (its dot loop not unrolled).
#   tin   s22.sh's tin (fj_variant.table_inside's GPU tests, the bias
#         table's first forward + backward on this host).
set -u
. bench/probes/parts_lib.sh
parts_start s23 "${1:-}" ${S23_SECONDS:-570}
echo "s23 gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
part_det() {
  # shellcheck disable=SC2086
  gpu_tests /tmp/s23-det 'FAIL|failed|differ' gpu_backward_deterministic_pair:200 ${S23_DET_TESTS:-}
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s23-det \
    timeout $(bound 90) python3 bench/probes/det_repeat.py 6 >"$out/det_repeat.log" 2>&1
  echo "det_repeat: exit $?"; cut -c1-200 "$out/det_repeat.log" | tail -12
  local cfg env dims
  for cfg in ${S23_DET_CFGS:-new norot old}; do
    env=X=1 dims=${S23_DET_DIMS:-192,256}
    [ $cfg = old ] && env=FLASHJIT_TEMPLATE_DIR=$root/build/tmpl-old dims=256
    [ $cfg = norot ] && env=FLASHJIT_BWD_ROTATE=0 dims=256
    env $env FLASHJIT_CACHE_DIR=/tmp/s23-$cfg PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so \
      timeout $(bound 150) python3 bench/bwd_compare.py --quick --dims $dims --out "$out/bwd_$cfg" >"$out/bwd_$cfg.log" 2>&1
    echo "det bwd_compare $cfg: exit $?"
    grep -E '^bwd' "$out/bwd_$cfg.log" | while read -r l; do
      grep -oE ' (S|D)=[0-9]+|causal=[^ ]+|flashjit_us=[0-9.]+|det_us=[0-9.]+|det_over_default=[0-9.]+|cudnn_us=[0-9.]+' <<<"$l" | paste -sd' '
    done
    grep -E 'geomean' "$out/bwd_$cfg.log" | cut -c1-200
  done
}
part_detncu() {
  local c m args
  for c in nc tl; do
    args="8 8 2048 256 0"
    [ $c = tl ] && args="2 8 8192 256 1"
    for m in 1 0; do
      # shellcheck disable=SC2086
      PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s23-det timeout $(bound 120) \
        ncu -f -o /tmp/det_$c$m --section SourceCounters --section WarpStateStats --section SpeedOfLight \
        -k regex:fj_bwd_attn -s 1 -c 1 python3 bench/bwd_one.py $args 2 $m 2>&1 | grep -vE '^==PROF==' | tail -2
      echo "detncu $c det=$m:"
      ncu --import /tmp/det_$c$m.ncu-rep --page details 2>&1 | grep -E 'Duration|Stall|Warp Cycles|Issued Warp|No Eligible|Active Warps' | head -16
      ncu --import /tmp/det_$c$m.ncu-rep --page source --csv --print-source sass >"$out/det_${c}_$m.csv" 2>&1
    done
  done
}
part_tests() {
  # shellcheck disable=SC2086
  gpu_tests /tmp/s23-tests 'FAIL|failed' ${S23_TESTS:-gpu_backward:330}
}
part_bwdtin() {
  gpu_tests /tmp/s23-bwdtin 'FAIL|failed' gpu_backward_mods:200
  local round e us
  for round in 1 2; do
    for e in "bias:f32[16,8192]" "bias:f32[16,8191]" plain; do
      if [ "$e" = plain ]; then
        us=$(cd build && FLASHJIT_CACHE_DIR=/tmp/s23-bwdtin timeout $(bound 60) ./flashjit run --backward \
          --shape 4,16,4096,128 --causal --dtype bf16 --iters 30 2>&1 | grep -oE 'median [0-9.]+ us')
      else
        us=$(cd build && FLASHJIT_CACHE_DIR=/tmp/s23-bwdtin timeout $(bound 60) ./flashjit run --backward \
          --shape 4,16,4096,128 --causal --dtype bf16 --score-mod 's+bias(h,q-kv+4096)' --param "$e" \
          --iters 30 2>&1 | grep -oE 'median [0-9.]+ us')
      fi
      echo "bwdtin round $round $e: ${us:-?}"
    done
  done
}
part_sendearly() {
  local t=/tmp/s23-tmpl-se round shape c us line
  rm -rf $t && cp -r templates $t && patch -d $t -p1 -s <bench/probes/send_early.patch || { echo "sendearly: the patch does not apply"; return; }
  for c in "" --causal; do
    # shellcheck disable=SC2086
    (cd build && FLASHJIT_TEMPLATE_DIR=$t FLASHJIT_CACHE_DIR=/tmp/s23-se timeout $(bound 90) ./flashjit run --backward \
      --shape 1,2,1000,256 $c --dtype bf16 --check --iters 3 2>&1 | grep -E 'check|error|FAIL|PASS' | head -4)
  done
  (cd build && FLASHJIT_TEMPLATE_DIR=$t FLASHJIT_CACHE_DIR=/tmp/s23-se timeout $(bound 150) \
    ./tests/fj_tests gpu_backward_deterministic_pair >"$out/se_det.log" 2>&1
   echo "sendearly gpu_backward_deterministic_pair: exit $? ($(grep -c '^ok' "$out/se_det.log") ok, $(grep -c FAIL "$out/se_det.log") FAIL)")
  for shape in "8,8,2048,256" "2,8,8192,256" "8,8,2048,256 --causal" "2,8,8192,256 --causal"; do
    line="sendearly $shape:"
    for round in 1 2; do
      for c in tree se; do
        # shellcheck disable=SC2086
        us=$(cd build && env $([ $c = se ] && echo FLASHJIT_TEMPLATE_DIR=$t) FLASHJIT_CACHE_DIR=/tmp/s23-se-$c \
          timeout $(bound 60) ./flashjit run --backward --shape $shape --dtype bf16 --iters 30 2>&1 |
          grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
        line="$line $c=${us:-?}"
      done
    done
    echo "$line"
  done
}
part_narrowlate() {
  local t=/tmp/s23-tmpl-nl cfg
  rm -rf $t && cp -r templates $t && patch -d $t -p1 -s <bench/probes/narrow_late.patch || { echo "narrowlate: the patch does not apply"; return; }
  (cd build && FLASHJIT_TEMPLATE_DIR=$t FLASHJIT_CACHE_DIR=/tmp/s23-nl timeout $(bound 150) \
    ./tests/fj_tests gpu_backward_deterministic >"$out/nl_det.log" 2>&1
   echo "narrowlate gpu_backward_deterministic: exit $? ($(grep -c '^ok' "$out/nl_det.log") ok, $(grep -c FAIL "$out/nl_det.log") FAIL)")
  for cfg in tree nl; do
    env $([ $cfg = nl ] && echo FLASHJIT_TEMPLATE_DIR=$t) FLASHJIT_CACHE_DIR=/tmp/s23-nl-$cfg PYTHONPATH=python \
      FLASHJIT_LIB=build/libflashjit.so timeout $(bound 200) python3 bench/bwd_compare.py --quick --dims 64,128 \
      --out "$out/nl_$cfg" >"$out/nl_$cfg.log" 2>&1
    echo "narrowlate bwd_compare $cfg: exit $?"
    grep -E '^bwd' "$out/nl_$cfg.log" | while read -r l; do
      grep -oE ' (S|D)=[0-9]+|causal=[^ ]+|flashjit_us=[0-9.]+|det_us=[0-9.]+|det_over_default=[0-9.]+' <<<"$l" | paste -sd' '
    done
  done
}
part_tiers() {
  local t=/tmp/s23-tmpl-slow round m c ms
  gpu_tests /tmp/s23-tiers 'FAIL|failed|first kernel' gpu_jit_tiers:200
  rm -rf $t && cp -r templates $t && sed -i '/^  meta.quick = 1$/d' $t/attention_simt.cu
  grep -q 'meta.quick' $t/attention_simt.cu && { echo "tiers: meta.quick still in the copy"; return; }
  for m in "--softcap 30" "--score-mod s+slope(h)*(float)(kv-q) --param slope:f32[16]" "--window 1024,0" "--score-mod s+bias(h,q-kv+4096) --param bias:f32[16,8192]"; do
    for round in 1 2; do
      for c in quick slow; do
        rm -rf /tmp/s23-tiers-c
        # shellcheck disable=SC2086
        ms=$(cd build && env $([ $c = slow ] && echo FLASHJIT_TEMPLATE_DIR=$t) FLASHJIT_CACHE_DIR=/tmp/s23-tiers-c \
          timeout $(bound 60) ./flashjit run --jit-tiers --shape 4,16,4096,128 --dtype bf16 --causal $m --iters 5 2>&1 |
          grep -oE 'first call[^:]*: [0-9.]+ ms' | grep -oE '[0-9.]+ ms')
        echo "tiers $m round $round $c: first call ${ms:-?}"
      done
    done
  done
}
part_tin() {
  S22_PARTS=tin S22_SECONDS=$(bound 280) bash bench/probes/s22.sh "$out/tin"
}
parts_run s23 ${S23_PARTS:-det tin}
