#!/bin/bash
# source_compare.sh OLD_CLI NEW_CLI [LIST] -- renders each variant (one line
# of `flashjit emit` flags per line of LIST; default: the picks of
# ptx_compare_picks.txt on sm_80, sm_86 and sm_90a, ptx_compare_mma_picks.txt,
# and the mma family's picks and explicit variants at every multiple of 16
# up to 576) with both CLIs, `--what source`, and compares the text and
# exit codes byte for byte.  A refusal that became a kernel is listed
# apart ("NEW"); any other difference is "DIFF".  No GPU needed; two
# renders at a time.  To compare templates rather than builds, run one CLI
# twice with FLASHJIT_TEMPLATE_DIR set for the old (git archive HEAD
# templates | tar -x -C DIR).
old=$1 new=$2 list=$3
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

default_list() {
  for a in sm_80 sm_86 sm_90a; do sed "s/\$/ --arch $a/" "$here/ptx_compare_picks.txt"; done
  cat "$here/ptx_compare_mma_picks.txt"
  for a in sm_80 sm_86; do for d in $(seq 16 16 256); do
    echo "--shape 1,8,1024,$d --arch $a"
    echo "--shape 4,16,4096,$d --causal --dtype bf16 --arch $a"
    echo "--shape 8,32,1,$d --heads-kv 8 --seq-kv 4096 --dtype bf16 --arch $a"
    echo "--shape 4,32,1,$d --heads-kv 8 --seq-kv 4096 --varlen 1:4096,1:100,1:1,1:0 --page-size 16 --dtype bf16 --arch $a"
    echo "--shape 3,8,4096,$d --varlen 17,0,4096 --causal --dtype bf16 --arch $a"
    echo "--shape 8,32,1,$d --heads-kv 8 --seq-kv 4096 --dtype bf16 --kv-dtype e4m3 --arch $a"
    echo "--shape 2,16,4096,$d --causal --dtype bf16 --softcap 30 --arch $a"
  done; done
  for a in sm_80 sm_86 sm_90a sm_120; do
    for d in $(seq 272 16 576); do
      echo "--shape 1,8,1024,$d --arch $a"
      echo "--shape 8,32,1,$d --heads-kv 8 --seq-kv 4096 --dtype bf16 --arch $a"
    done
    for dv in 512 448; do
      echo "--shape 8,128,1,576 --heads-kv 1 --head-dim-v $dv --latent --seq-kv 4096 --dtype bf16 --arch $a"
    done
    echo "--shape 8,16,1,192 --heads-kv 1 --head-dim-v 128 --latent --seq-kv 4096 --dtype bf16 --arch $a"
    echo "--shape 4,128,1,576 --heads-kv 1 --head-dim-v 512 --latent --seq-kv 4096 --varlen 1:4096,1:100,1:1,1:0 --page-size 64 --dtype bf16 --arch $a"
  done
  for a in sm_80 sm_90a; do
    for d in 64 128 256; do
      for st in 1 2 3; do for sw in none pad xor; do
        echo "--head-dim $d --mma mma --arch $a --tile-m 64 --warps 4 --tile-n 64 --stages $st --swizzle $sw"
      done; done
      echo "--head-dim $d --mma mma --arch $a --tile-m 16 --warps 4 --tile-n 64 --stages 2 --swizzle xor --pack-gqa --split-kv"
      echo "--head-dim $d --mma mma --arch $a --tile-m 128 --warps 8 --tile-n 64 --stages 2 --swizzle pad --causal"
      echo "--head-dim $d --mma mma --arch $a --tile-m 64 --warps 4 --tile-n 64 --stages 2 --swizzle xor --kv-dtype e4m3 --dtype bf16"
    done
    echo "--head-dim 576 --head-dim-v 512 --latent --mma mma --arch $a --tile-m 16 --warps 4 --tile-n 64 --stages 1 --swizzle pad --pack-gqa --split-kv"
    echo "--head-dim 576 --head-dim-v 512 --latent --mma mma --arch $a --tile-m 16 --warps 2 --tile-n 32 --stages 2 --swizzle xor --pack-gqa"
    echo "--head-dim 512 --mma mma --arch $a --tile-m 32 --warps 4 --tile-n 64 --stages 1 --swizzle pad"
  done
}

# render CLI OUT SHARD: every second line from SHARD, one file a line.
render() {
  local n=0
  while IFS= read -r args; do
    n=$((n + 1))
    [ $((n % 2)) -eq "$3" ] || continue
    set -f; set -- "$1" "$2" "$3" $args; set +f
    FLASHJIT_CACHE_DIR=$tmp/cache "$1" emit "${@:4}" --what source > "$2/$n.txt" 2>&1
    echo "rc=$?" >> "$2/$n.txt"
  done < "$tmp/list"
}

if [ -n "$list" ]; then cp "$list" "$tmp/list"; else default_list > "$tmp/list"; fi
mkdir -p "$tmp/old" "$tmp/new"
render "$old" "$tmp/old" 0 & render "$old" "$tmp/old" 1 &
render "$new" "$tmp/new" 0 & render "$new" "$tmp/new" 1 &
wait
n=0 same=0 newly=0
while IFS= read -r args; do
  n=$((n + 1))
  if cmp -s "$tmp/old/$n.txt" "$tmp/new/$n.txt"; then
    same=$((same + 1))
  elif ! grep -qx "rc=0" "$tmp/old/$n.txt" && grep -qx "rc=0" "$tmp/new/$n.txt"; then
    newly=$((newly + 1))
    echo "NEW   $args"
  else
    echo "DIFF  $args"
  fi
done < "$tmp/list"
echo "$same of $n identical; $newly refused before, rendered now"
