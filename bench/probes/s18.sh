#!/bin/bash
# s18.sh OUTDIR -- the next device session's calls, ready to run, from the
# repository root with build/ (main's, slimmed: carry build-c and start
# with `rm -rf build && mv build-c build`), build-vtin/ (branch vtin's
# slimmed build, its templates/ beside it) and .whl/ (the cudnn-frontend
# wheel, ../shared/anchors/README.md) carried: 52 MB together.  Parts, in
# the order they matter (S18_PARTS; S18_SECONDS bounds the whole):
#   vtin     bench/probes/vtin.sh: branch vtin checked (trapping waits,
#            racecheck, synccheck), its FP8 tests, its A/B against main
#   fp8      bench/fp8_compare.py beside cuDNN's FP8 (d64, d128, d256; S 2048
#            to 16384, both masks), main's library then vtin's: issue 32's
#            ratio (bar 1.1) -- on the H200 for a bar figure
#   bwd      s17.sh's cmp: the backward beside cuDNN at d64, d128, d256
#            with bwdrows merged (issue 31's bars: 1.05, 1.2)
#   short    s17.sh's short: S 512/1024 beside cuDNN with fdpwl merged
#            (issue 34's cells)
set -u
. bench/probes/parts_lib.sh
parts_start s18 "${1:-}" ${S18_SECONDS:-570}
part_vtin() { (cd "$root" && timeout $(bound 330) bash bench/probes/vtin.sh "$out/vtin") 2>&1 | cut -c1-240; }
part_fp8() {
  python3 -m pip install -q --no-index --no-deps --target /tmp/site "$root"/.whl/nvidia_cudnn_frontend-*.whl || return
  local lib
  for lib in build build-vtin; do
    mkdir -p "$out/fp8_$lib"
    (cd /work/main && PYTHONPATH=/tmp/site:python FLASHJIT_LIB=$lib/libflashjit.so timeout $(bound 240) \
      python3 bench/fp8_compare.py --dims 64,128,256 --iters 20 --out "$out/fp8_$lib") >"$out/fp8_$lib.log" 2>&1
    echo "s18 fp8 $lib: exit $?"
    grep -E "geomean|Error" "$out/fp8_$lib.log" | cut -c1-240
  done
}
part_bwd() { (cd "$root" && S17_PARTS=cmp S17_SECONDS=$(bound 300) bash bench/probes/s17.sh "$out") 2>&1 | grep -E "geomean|exit|Error"; }
part_short() { (cd "$root" && S17_PARTS=short S17_SECONDS=$(bound 300) bash bench/probes/s17.sh "$out") 2>&1 | grep -E "geomean|exit|Error"; }
(cd "$root" && . bench/device_env.sh >/dev/null && nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/s18 gpu: /')
parts_run s18 ${S18_PARTS:-vtin fp8}
