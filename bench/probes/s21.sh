#!/bin/bash
# s21.sh OUTDIR -- the twenty-first session's device calls, from the
# repository root with build/ (main's slimmed build, the templates before
# the deterministic pair as build/tmpl-old) carried.  Parts (S21_PARTS;
# S21_SECONDS bounds the whole, default 570):
#   det       the deterministic backward with the d256 cluster pair:
#             gpu_backward_deterministic_pair (its two cases: d256
#             causal with GQA and sinks, d224 varlen), then bench/bwd_compare.py --quick --dims
#             256 three ways: this build ("new": the default and the
#             deterministic mode on the pair), the templates before it
#             ("old": the default mode's baseline, its deterministic column
#             not meaningful: the host plans the pair, the old kernel has
#             no turns in it), FLASHJIT_BWD_PAIR=0 ("nopair": the
#             deterministic mode on 64-key tiles, as before).  Predicted:
#             deterministic / default 1.56-1.87 -> 1.2-1.35; the default
#             mode unchanged (within 1%).
#   trainmods bench/train_mods_compare.py (issue 33's seven cases beside
#             FlexAttention; the last run was at 2745797, before the
#             backward's row kernels and the pair).
#   nvrtc     issue 36 on this host: NVRTC alone per phase (bench/
#             compile_cost.sh, 3 fresh programs each) on the sources of
#             bench/pick_sources.c's representative picks, the CPU named.
set -u
. bench/probes/parts_lib.sh
parts_start s21 "${1:-}" ${S21_SECONDS:-570}
echo "s21 gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
part_det() {
  (cd build && timeout $(bound 240) ./tests/fj_tests gpu_backward_deterministic_pair >"$out/det_test.log" 2>&1
   echo "det gpu_backward_deterministic_pair: exit $? ($(grep -c ' ok$' "$out/det_test.log") ok lines: right, then the deterministic and the default reruns per case, $(grep -c FAIL "$out/det_test.log") FAIL)"
   grep -E "FAIL|failed|differ" "$out/det_test.log" | grep -v ' 0 failed' | head -8)
  local cfg env
  for cfg in new old nopair; do
    env=X=1
    [ $cfg = old ] && env=FLASHJIT_TEMPLATE_DIR=$root/build/tmpl-old
    [ $cfg = nopair ] && env=FLASHJIT_BWD_PAIR=0
    env $env FLASHJIT_CACHE_DIR=/tmp/s21-$cfg PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so \
      timeout $(bound 150) python3 bench/bwd_compare.py --quick --dims 256 --out "$out/bwd_$cfg" >"$out/bwd_$cfg.log" 2>&1
    echo "det bwd_compare $cfg: exit $?"
    grep -E '^bwd' "$out/bwd_$cfg.log" | grep -oE 'causal=[^ ]+|S=[0-9]+|flashjit_us=[0-9.]+|det_us=[0-9.]+|det_over_default=[0-9.]+|cudnn_us=[0-9.]+|rel_dq=[0-9.e-]+' | paste -sd' ' |
      sed -E 's/ (causal=)/\n\1/g'
    grep -E 'geomean' "$out/bwd_$cfg.log" | cut -c1-200
  done
}
part_trainmods() {
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so TORCHINDUCTOR_CACHE_DIR=/tmp/s21-inductor \
    timeout $(bound 300) python3 -u bench/train_mods_compare.py --commit "${S21_COMMIT:-unknown}" --out "$out" \
    >"$out/train_mods_compare.log" 2>&1
  echo "s21 trainmods: exit $?"
  grep -E "^\|" "$out/train_mods_compare.log" | cut -c1-400
  # the forwards alone (fwd+bwd less bwd was the same for every mask at 2745797)
  grep -E "^train .*fj_fwd_us" "$out/train_mods_compare.log" | while read -r l; do
    echo "fwd $(grep -oE 'key=[^ ]+|fj_fwd_us=[0-9.]+|flex_fwd_us=[0-9.]+' <<<"$l" | paste -sd' ')"
  done
}
part_nvrtc() {
  lscpu | grep -E 'Model name|^CPU\(s\)|MHz' | tr -s ' '
  cc -O2 bench/nvrtc_time.c -I/usr/local/cuda/include -L/usr/local/cuda/lib64 \
    -lnvrtc -Wl,-rpath,/usr/local/cuda/lib64 -o /tmp/nvrtc_time &&
    cc -O2 bench/pick_sources.c -Iinclude -Lbuild -lflashjit -Wl,-rpath,"$root/build" -o /tmp/pick_sources ||
    return
  rm -rf /tmp/s21-srcs /tmp/s21-ps && mkdir -p /tmp/s21-srcs
  FLASHJIT_CACHE_DIR=/tmp/s21-ps /tmp/pick_sources /tmp/s21-srcs >"$out/nvrtc_sources.txt" 2>&1
  timeout $(bound 200) bash bench/compile_cost.sh /tmp/s21-srcs 3 | tee "$out/nvrtc_phases.md"
}
parts_run s21 ${S21_PARTS:-det trainmods nvrtc}
