#!/bin/bash
# build_regs.sh -- on the build machine, from the repository root: the
# binaries of fp8_regs.patch's whole tree (templates, src, tests) as
# build-regs/ (flashjit, its libraries, tests/fj_tests), to carry to the GPU
# machine for fp8_ring_next.sh's REGS_BIN (that machine has no Lua to build
# with).  Runs the patch's CPU test of the lanes' maps (pieces_fp8_regs)
# and its FP8 compile tests on the way.
set -eu
root=$(pwd)
src=$(mktemp -d /tmp/fj-regs-src.XXXXXX)
git archive HEAD | tar -x -C "$src"
(cd "$src" && git init -q && git apply "$root/bench/probes/fp8_regs.patch")
cmake -S "$src" -B "$src/build" >/dev/null
cmake --build "$src/build" -j2 >/dev/null
(cd "$src/build" && ./tests/fj_tests pieces_fp8_regs && ./tests/fj_tests family_fp8_sm90a)
rm -rf "$root/build-regs" && mkdir -p "$root/build-regs/tests"
cp "$src/build/flashjit" "$src"/build/*.so* "$root/build-regs/"
cp "$src/build/tests/fj_tests" "$root/build-regs/tests/"
echo "build-regs: $(du -sh "$root/build-regs" | cut -f1); carry it beside build/ and pass REGS_BIN=\$PWD/../build-regs"
