#!/bin/bash
# s15b.sh OUTDIR -- the fifteenth session's short call (what its device
# time left allowed): the pair where nothing is masked, with 8246c67's
# fence (s15.sh part pchk, then its A/B at one shape), and the widepipe
# branch's two checks and A/B at two shapes (widepipe.sh without tests).
# From the repository root, build/ and build-wp/templates carried.
set -u
out=${1:-/tmp/fj-s15b}
mkdir -p "$out"
S15_PARTS=pchk S15_SECONDS=70 bash bench/probes/s15.sh "$out" 2>&1 | grep -E "^s15"
PAIR_TESTS="" PAIR_SHAPES="8,8,2048,256" timeout 40 bash bench/probes/pair.sh "$out/pair" 2>&1 | grep -E "^pair 8"
WP_TESTS="" WP_SHAPES="8,8,2048,256 --causal;8,10,2048,192" timeout 60 bash bench/probes/widepipe.sh "$out/wp" 2>&1 | grep -E "^widepipe"
