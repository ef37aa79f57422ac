#!/bin/bash
# s30b.sh OUTDIR -- the thirtieth session's second call, from the
# repository root with build/ (main's) and build-df/ (defer.patch's)
# carried: defer.sh's two checked runs and its times (the first call's
# check asked the reference for a shape over its limit), then the
# package's GPU tests that the landed qkvviews.patch touches, on main's
# python/ (the first call ran them on a copy without examples/).
set -u
out=${1:-/tmp/fj-s30b}
mkdir -p "$out"
DF_TEST_SECONDS=0 DF_SECONDS=${S30_DF_SECONDS:-300} bash bench/probes/defer.sh "$out/defer" 2>&1
(cd python/tests && PYTHONPATH=.. FLASHJIT_LIB=../../build/libflashjit.so FLASHJIT_CACHE_DIR=/tmp/s30b-cache \
   timeout ${S30_PY_SECONDS:-200} python3 -m unittest test_gpu.Backward test_gpu.Fp8.test_refusals test_train \
   test_train_varlen >"$out/py.log" 2>&1
 echo "python: exit $?"; grep -E "^(FAIL|ERROR):|^Ran|^OK|^FAILED" "$out/py.log" | head -12)
