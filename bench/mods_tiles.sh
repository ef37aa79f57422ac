#!/bin/bash
# mods_tiles.sh: the wgmma kernel's key tile against each modification on the
# H200, (4, 16, 4096, 128) bf16 causal (docs/perf-history.md); run from build/.
for n in 128 144 176; do echo "plain n=$n $(./flashjit run --shape 4,16,4096,128 --dtype bf16 --causal --mma wgmma --tile-m 128 --warps 12 --tile-n $n --stages 2 --swizzle xor --softmax regs --iters 30 | grep -oE 'median [0-9.]+ us')"; done
for n in 128 144; do echo "softcap n=$n $(./flashjit run --shape 4,16,4096,128 --dtype bf16 --causal --softcap 30 --mma wgmma --tile-m 128 --warps 12 --tile-n $n --stages 2 --swizzle xor --softmax regs --iters 30 | grep -oE 'median [0-9.]+ us')"; done
for n in 128 176; do echo "alibi n=$n $(./flashjit run --shape 4,16,4096,128 --dtype bf16 --causal --score-mod 's + slopes(h) * (float)(kv - q)' --param 'slopes:f32[16]' --mma wgmma --tile-m 128 --warps 12 --tile-n $n --stages 2 --swizzle xor --softmax regs --iters 30 | grep -oE 'median [0-9.]+ us')"; done
for n in 128 176; do echo "relbias n=$n $(./flashjit run --shape 4,16,4096,128 --dtype bf16 --causal --score-mod 's + bias(h, q - kv + 4096)' --param 'bias:f32[16,8192]' --mma wgmma --tile-m 128 --warps 12 --tile-n $n --stages 2 --swizzle xor --softmax regs --iters 30 | grep -oE 'median [0-9.]+ us')"; done
for n in 96 128 176; do echo "window n=$n $(./flashjit run --shape 4,16,4096,128 --dtype bf16 --causal --window 1024,0 --mma wgmma --tile-m 128 --warps 12 --tile-n $n --stages 2 --swizzle xor --softmax regs --iters 30 | grep -oE 'median [0-9.]+ us')"; done
