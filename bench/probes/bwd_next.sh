#!/bin/bash
# bwd_next.sh OUTDIR -- the narrow wgmma backward's next step
# (bwd_next.patch, see bwd_next.md) against the templates before it, from
# build/ on the GPU machine (whichever of main or bwdnext built it: both
# template sets are made as copies and always passed by
# FLASHJIT_TEMPLATE_DIR, so the embedded ones are never what is timed).
# (1) the backward GPU tests with the patched set (the test binary is the
# tree's); (2) `flashjit run --backward` medians, the base set and the
# patched one alternately, two rounds, one line a run.  Bounded so that the
# whole fits 8 minutes: BWD_TEST_TIMEOUT (default 75 s) a test,
# BWD_RUN_TIMEOUT (default 40 s) a run; BWD_TESTS picks the tests.
set -u
out=${1:-/tmp}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
rm -rf /tmp/fj-bwd-base /tmp/fj-bwd-next
mkdir -p /tmp/fj-bwd-base /tmp/fj-bwd-next
cp -r "$here/../../templates" /tmp/fj-bwd-base/ && cp -r "$here/../../templates" /tmp/fj-bwd-next/
if (cd /tmp/fj-bwd-next && git apply --check "$here/bwd_next.patch" 2>/dev/null); then
  (cd /tmp/fj-bwd-next && git apply "$here/bwd_next.patch") || { echo "bwd_next: the patch does not apply"; exit 1; }
elif (cd /tmp/fj-bwd-base && git apply --check -R "$here/bwd_next.patch" 2>/dev/null); then
  (cd /tmp/fj-bwd-base && git apply -R "$here/bwd_next.patch") || { echo "bwd_next: the patch does not reverse"; exit 1; }
else
  echo "bwd_next: the patch neither applies nor reverses on this tree's templates"; exit 1
fi
cmp -s /tmp/fj-bwd-base/templates/attention_bwd_wgmma.cu /tmp/fj-bwd-next/templates/attention_bwd_wgmma.cu &&
  { echo "bwd_next: base and next are the same"; exit 1; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
for t in ${BWD_TESTS-gpu_backward gpu_backward_deterministic gpu_backward_mods gpu_backward_block_mask}; do
  FLASHJIT_TEMPLATE_DIR=/tmp/fj-bwd-next/templates timeout ${BWD_TEST_TIMEOUT:-75} ./tests/fj_tests $t >"$out/next_$t.log" 2>&1
  echo "bwd next $t: exit $? ($(grep -c ' ok$\|^ok ' "$out/next_$t.log") ok, $(grep -c FAIL "$out/next_$t.log") FAIL)"
done
for round in 1 2; do
  while IFS= read -r args; do
    line="bwd r$round $args:"
    for t in base next; do
      us=$(FLASHJIT_TEMPLATE_DIR=/tmp/fj-bwd-$t/templates timeout ${BWD_RUN_TIMEOUT:-40} ./flashjit run --backward $args --dtype bf16 --iters 30 2>&1 |
           tee -a "$out/run_${t}.log" | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      line="$line $t ${us:-?}"
    done
    echo "$line us" | tee -a "$out/bwd_next_times.txt"
  done <<EOF2
--shape 8,16,2048,128
--shape 8,16,2048,128 --causal
--shape 2,16,8192,128
--shape 2,16,8192,128 --causal
--shape 8,32,2048,64
--shape 8,8,2048,256
EOF2
done
