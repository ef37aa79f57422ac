#!/bin/bash
# bwd_check.sh -- the backward on one GPU, from the repository root with build/
# carried: gpu_backward (46 runs: every family, mask, varlen), the
# deterministic mode (bits over 10 runs), the tuned plan, the kernel
# package's first call; then bench/bwd_compare.py (BWD_ARGS, default
# --dims 64,128; FULL=0 skips it).  Logs to /tmp; the summary is printed.
export LD_LIBRARY_PATH=/usr/local/cuda/lib64
mkdir -p /work && [ -e /work/main ] || ln -s $(pwd) /work/main
cd /work/main
export FLASHJIT_CACHE_DIR=/tmp/fj-cache FJT_DATA_DIR=/work/main/tests/data
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
for t in gpu_backward gpu_backward_deterministic gpu_backward_tuned gpu_package_first_call; do timeout 300 build/tests/fj_tests $t > /tmp/$t.log 2>&1; echo "== $t: exit $? ($(grep -c '^ok ' /tmp/$t.log) ok, $(grep -c '^FAIL' /tmp/$t.log) FAIL)"; grep -E "^FAIL|failed|runs differ" /tmp/$t.log | grep -v "^ok" | head -8; done
grep -E "deterministic:" /tmp/gpu_backward_deterministic.log | head -12
if [ "${FULL:-1}" = 1 ]; then
echo "== bwd_compare"; PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout 500 python3 bench/bwd_compare.py ${BWD_ARGS:---dims 64,128} --out $OUT 2>&1 | grep -E "^bwd|^geomean" | sed -E 's/rel_dq=[0-9.]+ rel_dk=[0-9.eNo-]+ rel_dv=[0-9.eNo-]+ //; s/flash_tflops=[0-9.]+ //; s/cudnn_tflops=[0-9.]+ //'
fi
