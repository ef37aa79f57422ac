#!/bin/bash
# wide.sh OUTDIR -- head dims above 256 and MLA's latent decode (issue 34
# item 3), from build/ on the GPU machine: the GPU tests gpu_wide_heads and
# gpu_mla_paged, then bench/mla_compare.py (with the 32-row variant), each
# bounded.
set -u
out=${1:-/tmp}
for t in gpu_wide_heads gpu_mla_paged; do
  timeout ${WIDE_TEST_TIMEOUT:-200} ./tests/fj_tests $t >"$out/$t.log" 2>&1
  echo "$t: exit $? ($(grep -c ' ok$' "$out/$t.log") ok, $(grep -c FAIL "$out/$t.log") FAIL)"
done
(cd .. && FLASHJIT_LIB=build/libflashjit.so timeout ${MLA_TIMEOUT:-200} python3 bench/mla_compare.py \
  --iters 30 --tile-m 32 --out "$out" >"$out/mla.log" 2>&1; echo "mla_compare: exit $?")
grep -E "^mla|Error|error" "$out/mla.log" | head -20
