#!/bin/bash
# block_mask_probe.sh -- where a block-masked call's time goes, from build/
# on the GPU machine: the documents case of bench/mods_compare.py (4 x 16 x
# 4096, d128, bf16, causal, 8 sorted documents) through the library-built
# block mask, beside the same variant without the lists, without the mask
# expression, and plain causal; then both families' variants swept, the
# non-persistent walk (a template copy), and the kernel's profile (ncu).
set -u
python3 -c "import random, struct; random.seed(0); d = sorted(random.randrange(8) for _ in range(4096)); open('/tmp/doc.bin', 'wb').write(struct.pack('4096i', *d))"
base="--shape 4,16,4096,128 --dtype bf16 --causal"
doc="--mask-mod doc(q)==doc(kv) --param doc:i32[4096]@/tmp/doc.bin"
pick="--mma wgmma --tile-m 128 --warps 12 --tile-n 64 --stages 2 --swizzle xor"
t() { echo "$* | $(./flashjit run $base --iters 30 "$@" 2>&1 | grep -E '^time|error|refused' | head -1)"; }
t
t $pick
t --block-mask 128,128
t $pick --block-mask 128,128
t $doc $pick
t $doc --block-mask 128,128
t $doc --block-mask 128,128 $pick
t $doc --block-mask 128,128 --mma wgmma --tile-m 128 --warps 12 --tile-n 128 --stages 2 --swizzle xor
t $doc --block-mask 128,128 --mma wgmma --tile-m 128 --warps 12 --tile-n 64 --stages 4 --swizzle xor
rm -rf /tmp/fj-np && cp -r ../templates /tmp/fj-np
sed -i 's/local PERSISTENT = true/local PERSISTENT = false/' /tmp/fj-np/attention_wgmma.cu
echo "not persistent: $(FLASHJIT_TEMPLATE_DIR=/tmp/fj-np ./flashjit run $base --iters 30 $doc --block-mask 128,128 2>&1 | grep -E '^time|error' | head -1)"
for fam in wgmma mma; do
  ./flashjit run --sweep --mma $fam $base $doc --block-mask 128,128 --iters 10 --workers 16 2>&1 | grep -vE 'refused|compiling' | sort -t' ' -k2 -n | head -6
done
ncu --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats -k regex:fj_attn -c 1 \
  ./flashjit run $base $doc --block-mask 128,128 --iters 1 --warmup 0 2>&1 | grep -vE '^==PROF==|^\s*$' | tail -80
