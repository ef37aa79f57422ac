#!/bin/bash
# block_mask_probe.sh -- where a block-masked call's time goes, from build/
# on the GPU machine: the documents case of bench/mods_compare.py (4 x 16 x
# 4096, d128, bf16, causal, 8 sorted documents) through the library-built
# block mask, swept over both families' variants, beside the same lists
# with the mask expression never run (causal only, through a block mask)
# and plain causal.  Each line: the arguments, then the run's time line.
set -u
python3 -c "import random, struct; random.seed(0); d = sorted(random.randrange(8) for _ in range(4096)); open('/tmp/doc.bin', 'wb').write(struct.pack('4096i', *d))"
base="--shape 4,16,4096,128 --dtype bf16 --causal --iters 30"
doc="--mask-mod doc(q)==doc(kv) --param doc:i32[4096]@/tmp/doc.bin"
t() { echo "$* | $(./flashjit run $base "$@" 2>&1 | grep -E '^time|error|refused' | head -1)"; }
t
t --block-mask 128,128
t $doc
t $doc --block-mask 128,128
t $doc --block-mask 128,128 --verbose
for fam in wgmma mma; do
  ./flashjit run --sweep --mma $fam $base $doc --block-mask 128,128 --iters 10 2>&1 | grep -vE 'refused|compiling' | sort -t' ' -k2 -n | head -8
done
./flashjit run --shape 2,16,1100,128 --dtype bf16 --causal $doc --block-mask 128,128 --check 2>&1 | tail -3
