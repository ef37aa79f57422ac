#!/bin/sh
# hostile_b_cli.sh FLASHJIT TABLE -- issue 35 part B's corpus of the cache
# commands (tests/hostile_b_cli.txt, run by cli_corpus.sh): first a real
# pack and its damaged, truncated and misplaced copies in $PACKS, then
# every case with its limit, counting hangs, crashes, wrong statuses,
# messages not in one line and missing texts.
FJ=$1
TABLE=$2
PACKS=$(mktemp -d)
trap 'rm -rf "$PACKS"' EXIT
export PACKS
FLASHJIT_CACHE_DIR=$PACKS/cache "$FJ" cache prewarm --arch sm_80 --head-dim 64 \
  --dtype f16 --causal none >/dev/null 2>&1 &&
  FLASHJIT_CACHE_DIR=$PACKS/cache "$FJ" cache export "$PACKS/good.fjpack" >/dev/null || {
  echo "hostile_b_cli: cannot make the pack"
  exit 1
}
cd "$PACKS" || exit 1
: >empty
head -c 100 good.fjpack >trunc100
head -c 5000 good.fjpack >trunc5000
head -c 56 good.fjpack >header_only
echo garbage >garbage
echo victim >victim
head -c 60 /dev/zero >zeros
cp good.fjpack flip
printf 'X' | dd of=flip bs=1 seek=3000 conv=notrunc 2>/dev/null
cp good.fjpack flip_end
size=$(wc -c <good.fjpack)
printf 'X' | dd of=flip_end bs=1 seek=$((size - 1)) conv=notrunc 2>/dev/null
cp good.fjpack magic
printf 'FJPACK99' | dd of=magic bs=1 seek=0 conv=notrunc 2>/dev/null
{ cat good.fjpack; printf 'tail'; } >appended
mkfifo fifo
mkdir dir
ln -s good.fjpack link
ln -s /nonexistent/x dangling
cp good.fjpack "with space.fjpack"
mkdir -p readonly && chmod 500 readonly
cd - >/dev/null || exit 1
sh "$(dirname "$0")/cli_corpus.sh" "$FJ" "$TABLE"
