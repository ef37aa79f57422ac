#!/bin/bash
# s30.sh OUTDIR -- the thirtieth session's first device call (any GPU),
# from the repository root with build/ (main's) and build-df/ (main with
# bench/probes/defer.patch applied, built and slimmed) carried: the
# deferred turns' two checked runs and their times (defer.sh's check
# without its test, then time), then the fused QKV's views
# (qkvviews.sh's tests and time), each part bounded so the call ends
# within ten minutes.
set -u
out=${1:-/tmp/fj-s30}
mkdir -p "$out"
echo "s30 gpu: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
DF_TEST_SECONDS=0 DF_SECONDS=${S30_DF_SECONDS:-300} bash bench/probes/defer.sh "$out/defer" 2>&1
QV_PARTS=${S30_QV_PARTS:-tests time} QV_SECONDS=${S30_QV_SECONDS:-240} bash bench/probes/qkvviews.sh "$out/qv" 2>&1
