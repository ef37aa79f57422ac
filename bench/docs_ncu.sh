#!/bin/bash
# docs_ncu.sh OUTDIR -- the documents case's attention kernel under ncu,
# from build/ on the GPU machine (4 x 16 x 4096, d128, bf16, causal, 8
# sorted documents, the library-built block mask): its warp states and its
# SASS with the stall samples of each instruction (OUTDIR/docs_sass.csv),
# to see where a row tile's fixed cost goes.
set -u
out=${1:-/tmp}
python3 -c "import random, struct; random.seed(0); d = sorted(random.randrange(8) for _ in range(4096)); open('/tmp/doc.bin', 'wb').write(struct.pack('4096i', *d))"
ncu -f -o /tmp/docs --section SourceCounters --section WarpStateStats --section SpeedOfLight \
  -k regex:fj_attn -c 1 ./flashjit run --shape 4,16,4096,128 --dtype bf16 --causal \
  --mask-mod 'doc(q)==doc(kv)' --param 'doc:i32[4096]@/tmp/doc.bin' --block-mask 128,128 \
  --iters 1 --warmup 0 2>&1 | grep -vE '^==PROF==' | tail -5
ncu --import /tmp/docs.ncu-rep --page details 2>&1 | grep -vE '^\s*$' | tail -60
ncu --import /tmp/docs.ncu-rep --page source --csv --print-source sass >"$out/docs_sass.csv" 2>&1
echo "docs_sass.csv: $(wc -l <"$out/docs_sass.csv") lines"
