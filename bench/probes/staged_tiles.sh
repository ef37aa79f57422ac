#!/bin/bash
# staged_tiles.sh -- with O through shared memory (713475f) a pick whose
# rings leave no room for it might lose to a smaller key tile that has
# room: the unmasked d128 pick (192 keys when this ran on 87baa34; 160
# since) and the d256 causal pick (80), both not staged, against staged
# tiles, from build/ on the GPU machine, two interleaved rounds.
W="--mma wgmma --tile-m 128 --warps 12 --stages 2 --swizzle xor --softmax regs"
runs=(
  "--shape 4,16,4096,128 --dtype bf16|"
  "--shape 4,16,4096,128 --dtype bf16|$W --tile-n 176"
  "--shape 4,16,4096,128 --dtype bf16|$W --tile-n 160"
  "--shape 2,8,8192,256 --dtype bf16 --causal|"
  "--shape 2,8,8192,256 --dtype bf16 --causal|$W --tile-n 64"
)
for round in 1 2; do
  for r in "${runs[@]}"; do
    log=$(./flashjit run ${r%%|*} ${r#*|} --iters 30 2>&1)
    echo "tiles $round [${r%%|*}] [${r#*|}]: $(grep -oE '^variant.*' <<<"$log" | head -1 | cut -c1-80) $(grep -oE 'median [0-9.]+ us' <<<"$log")"
  done
done
