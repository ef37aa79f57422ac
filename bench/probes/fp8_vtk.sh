#!/bin/bash
# fp8_vtk.sh OUTDIR -- FP8's V^T made in the kernel (issue 32; the
# thirty-fifth session's bench/probes/fp8_vtk.patch; run on an H100 on
# 2026-12-07: right, but 1.13-1.49x slower than the pass, not taken --
# docs/perf-history.md, F6:
# fj_variant.fp8_vt_kernel, `--fp8-vt-kernel`, ABI 14), from the repository
# root with main's build as build/ and the patched tree's build as
# build-vtk/ (both slimmed).  To make build-vtk/ here:
#   git worktree add /tmp/vtk HEAD && (cd /tmp/vtk && git apply $PWD/bench/probes/fp8_vtk.patch &&
#   cmake -S . -B build -DFLASHJIT_WERROR=ON && cmake --build build -j2) && cp -a /tmp/vtk/build build-vtk
#   (then slim it as build/ is slimmed).
# Parts (FP8_VTK_PARTS, default "check time"), bounded by FP8_VTK_SECONDS
# (540):
#   check  `flashjit run --check` with --fp8-vt-kernel at the library's
#          FP8 tiles (d128 n192, d64 n256 and n192, d128 n128), every
#          mask, GQA, a tail, e4m3 O, blocks of one and two key tiles (the
#          end of the transposers' walk); each bounded (a hang is a FAIL).
#   time   the forward's median, the same tiles with the _vt pass and with
#          V^T made in the kernel, alternately, two rounds (build-vtk/'s
#          binary both ways), and main's pick beside them.  Predicted: in
#          the kernel 0.91-0.95 of the pass's time at S = 2048 (the pass
#          was 4.7-7% of a call by ncu at S = 4096), 0.97-0.99 at 8192;
#          worse if the transposers' shared-memory traffic slows the
#          consumers' products (then: ncu on both).
set -u
. bench/probes/parts_lib.sh
parts_start fp8vtk "${1:-}" ${FP8_VTK_SECONDS:-540}
V="--dtype e4m3 --mma wgmma --tile-m 128 --warps 12 --stages 2 --fp8-flush -1"
part_check() {
  local a
  for a in "--head-dim 128 --tile-n 192 --shape 2,8,2048,128" "--head-dim 128 --tile-n 192 --shape 2,8,1000,128 --causal" \
           "--head-dim 128 --tile-n 192 --shape 1,8,700,128 --heads-kv 2 --causal=bottom-right --seq-kv 1300" \
           "--head-dim 64 --tile-n 256 --shape 2,8,2048,64" "--head-dim 64 --tile-n 192 --shape 2,8,1111,64 --causal" \
           "--head-dim 128 --tile-n 128 --shape 2,4,777,128" "--head-dim 128 --tile-n 192 --shape 2,8,1000,128 --o-dtype e4m3" \
           "--head-dim 128 --tile-n 192 --shape 1,2,100,128" "--head-dim 64 --tile-n 256 --shape 3,2,300,64 --causal"; do
    # shellcheck disable=SC2086
    echo "fp8vtk check $a: $(cd build-vtk && FLASHJIT_CACHE_DIR=/tmp/fp8vtk timeout $(bound 60) ./flashjit run --check $V \
      --fp8-vt-kernel $a --iters 3 2>&1 | grep -E 'PASS|FAIL|rror' | tr '\n' ' ') (exit ${PIPESTATUS[0]})"
  done
}
part_time() {
  local shape round line us m
  for shape in "--head-dim 128 --tile-n 192 --shape 8,16,2048,128" "--head-dim 128 --tile-n 192 --shape 8,16,2048,128 --causal" \
               "--head-dim 128 --tile-n 192 --shape 2,16,8192,128" "--head-dim 64 --tile-n 192 --shape 8,32,2048,64 --causal" \
               "--head-dim 64 --tile-n 256 --shape 4,32,4096,64"; do
    line="fp8vtk $shape:"
    for round in 1 2; do
      for m in pass kernel; do
        # shellcheck disable=SC2086
        us=$(cd build-vtk && FLASHJIT_CACHE_DIR=/tmp/fp8vtk timeout $(bound 60) ./flashjit run $V $shape \
          $([ $m = kernel ] && echo --fp8-vt-kernel) --iters 30 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
        line="$line $m=${us:-?}"
      done
      # shellcheck disable=SC2086
      us=$(cd build && FLASHJIT_CACHE_DIR=/tmp/fp8vtk-main timeout $(bound 60) ./flashjit run --dtype e4m3 \
        $(echo "$shape" | grep -oE -- '--shape [0-9,]+( --causal)?') --iters 30 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      line="$line main=${us:-?}"
    done
    echo "$line"
  done
}
parts_run fp8vtk ${FP8_VTK_PARTS:-check time}
