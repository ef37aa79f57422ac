#!/bin/bash
# s24.sh OUTDIR -- the twenty-fourth session's device calls, from the
# repository root with build/ carried (and build-old/: the build before
# the change, for host).  Parts (S24_PARTS; S24_SECONDS bounds the whole,
# default 570):
#   host  a training step's host time: the backward's launches take their
#         three kernels from a list of recent ones (no parameters, keys or
#         kernel map a call), the memory key written without printf, the
#         variant's parameters without zeroing 100 kB.  gpu_backward's
#         cases first (the list must give each problem its own kernels),
#         then bench/probes/train_prof.py's flashjit side (issue 33's
#         causal, window and documents, forward + backward, event time and
#         the kernels' summed time) under build-old/'s library and
#         build/'s, alternately, two rounds.  Predicted: the event time
#         less the kernels' 20-60 us smaller for the documents (the
#         launches' C time on the build machine: 48 -> ~2 us backward,
#         33 -> ~12 forward, both fj_kernel_get-like paths), 10-30 us
#         for causal; the kernels' time unchanged.
#   sendearly, narrowlate  bench/probes/s23.sh's parts of those names.
#   bwd   gpu_backward (S24_BWD_TESTS), then the backward's table beside
#         cuDNN and flash (bench/bwd_compare.py --quick, S24_BWD_DIMS,
#         default 128,256): send_early.patch landed (the pair's dS^T sent
#         before barrier 2; d256 0.92-0.96 of the time on an H100).
#   detab the deterministic backward at d256 under the templates before
#         send_early.patch landed (build/tmpl-pre: 3e45dd1's) and the
#         tree's, alternately, two rounds (bench/probes/det_ab.py: the
#         default's and the deterministic mode's medians): T14's 1.20 at
#         (2, 8, 8192, 256) causal read 1.34 after it.
#   detrt the early send in the default mode only (a runtime branch: the
#         deterministic mode sends after barrier 2 as before):
#         gpu_backward_deterministic_pair, a checked d256 pair run each
#         mask, then detab's A/B on two shapes (tree against build/tmpl-pre).
#   train issue 33's table (bench/train_mods_compare.py, every case).
set -u
. bench/probes/parts_lib.sh
parts_start s24 "${1:-}" ${S24_SECONDS:-570}
echo "s24 gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
part_host() {
  # shellcheck disable=SC2086
  gpu_tests /tmp/s24-host 'FAIL|failed' ${S24_HOST_TESTS:-gpu_backward:200}
  local round b
  for round in 1 2; do
    for b in build-old build; do
      PROF_FJ_ONLY=1 PYTHONPATH=python FLASHJIT_LIB=$b/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s24-prof \
        timeout $(bound 90) python3 bench/probes/train_prof.py causal,window,document 20 \
        >"$out/host_${b}_$round.log" 2>&1
      echo "host round $round $b: exit $?"
      grep -E '^prof' "$out/host_${b}_$round.log"
    done
  done
}
part_sendearly() { S23_PARTS=sendearly S23_SECONDS=$(bound 300) bash bench/probes/s23.sh "$out/s23"; }
part_narrowlate() { S23_PARTS=narrowlate S23_SECONDS=$(bound 400) bash bench/probes/s23.sh "$out/s23"; }
part_bwd() {
  # shellcheck disable=SC2086
  gpu_tests /tmp/s24-bwd 'FAIL|failed' ${S24_BWD_TESTS:-gpu_backward:200}
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s24-bwd timeout $(bound 300) \
    python3 bench/bwd_compare.py --quick --dims ${S24_BWD_DIMS:-128,256} --out "$out/bwd" >"$out/bwd.log" 2>&1
  echo "s24 bwd: exit $?"
  grep -E "^bwd|geomean|Error" "$out/bwd.log" | cut -c1-260 | head -30
}
part_detab() {
  local round t shape shapes
  IFS=';' read -ra shapes <<<"${S24_DETAB_SHAPES:-2 8 8192 256 1;2 8 8192 256 0;8 8 2048 256 1}"
  for shape in "${shapes[@]}"; do
    for round in 1 2; do
      for t in pre tree; do
        # shellcheck disable=SC2086
        env $([ $t = pre ] && echo FLASHJIT_TEMPLATE_DIR=$root/build/tmpl-pre) FLASHJIT_CACHE_DIR=/tmp/s24-detab-$t \
          PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout $(bound 60) \
          python3 bench/probes/det_ab.py $shape 20 2>&1 | grep -E 'det_ab|Error' | sed "s/^/$t round $round: /"
      done
    done
  done
}
part_detrt() {
  gpu_tests /tmp/s24-detrt 'FAIL|failed' gpu_backward_deterministic_pair:120
  local c
  for c in "" --causal; do
    # shellcheck disable=SC2086
    (cd build && FLASHJIT_CACHE_DIR=/tmp/s24-detrt timeout $(bound 90) ./flashjit run --backward \
      --shape 1,2,1000,256 $c --dtype bf16 --check --iters 3 2>&1 | grep -E 'check|error|FAIL' | head -3)
  done
  S24_DETAB_SHAPES="2 8 8192 256 1;2 8 8192 256 0" part_detab
}
part_train() {
  PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s24-train timeout $(bound 560) \
    python3 bench/train_mods_compare.py --commit ${S24_COMMIT:-HEAD} --out "$out/train" >"$out/train.log" 2>&1
  echo "s24 train: exit $?"
  grep -E "^train|Error" "$out/train.log" | cut -c1-300 | head -30
}
parts_run s24 ${S24_PARTS:-host}
