#!/bin/sh
# hostile_b_cli.sh FLASHJIT TABLE -- issue 35 part B's corpus of the cache
# commands (tests/hostile_b_cli.txt, run by cli_corpus.sh): first a real
# pack and its damaged, truncated and misplaced copies in $PACKS, then
# every case with its limit, counting hangs, crashes, wrong statuses,
# messages not in one line and missing texts.  Before the corpus, class 7:
# template development is bounded too (FLASHJIT_TEMPLATE_DIR, below).
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

# Class 7: copies of templates/ whose render.lua (at its top level, when
# the renderer loads) or common.cuh (when a kernel renders) runs a pattern
# bomb, a loop of string.rep or a loop of cheap finds.  Each command that
# renders fails with status 1 within 15 s and writes nothing on stdout; the
# first line on stderr names the command and the limit that stopped the
# render -- the pattern's cost or the instruction budget (C: tests
# test_hostile_b_renderer_patterns and test_hostile_b_c_loops), never the
# 20 s wall clock of last resort, which stopped such a render.lua on
# 439ccd4 (its bomb ran on, killed at 25 s here) -- and the lines after it,
# if any, are the Lua traceback.
TEMPLATES=$(dirname "$0")/../templates
tpl_fails=0

# tpl_dir NAME FILE LINE: $PACKS/NAME, a copy of templates/ with LINE put
# first in FILE.
tpl_dir() {
  mkdir -p "$PACKS/$1" && cp -R "$TEMPLATES/." "$PACKS/$1/" &&
    { printf '%s\n' "$3"; cat "$TEMPLATES/$2"; } >"$PACKS/$1/$2" || {
    echo "hostile_b_cli: cannot make the template directory $1"
    exit 1
  }
}

# bounded NAME TEXT ARGS...: flashjit ARGS with FLASHJIT_TEMPLATE_DIR
# $PACKS/NAME, as above; TEXT in the first line on stderr.
bounded() {
  name=$1 text=$2
  shift 2
  start=$(date +%s)
  FLASHJIT_TEMPLATE_DIR=$PACKS/$name timeout -k 5 25 "$FJ" "$@" \
    >"$PACKS/tpl_out" 2>"$PACKS/tpl_err" </dev/null
  code=$?
  secs=$(($(date +%s) - start))
  first=$(sed -n 1p "$PACKS/tpl_err")
  second=$(sed -n 2p "$PACKS/tpl_err")
  what="$name: flashjit $* -> $code after ${secs} s: $first"
  why=
  if [ "$code" = 124 ] || [ "$code" = 137 ]; then
    why="a hang (killed at 25 s)"
  elif [ "$code" != 1 ]; then
    why="exit $code, want 1"
  elif [ "$secs" -gt 15 ]; then
    why="took ${secs} s, more than 15"
  elif [ -s "$PACKS/tpl_out" ]; then
    why="wrote on stdout: $(head -c 200 "$PACKS/tpl_out")"
  elif [ -n "$second" ] && [ "$second" != "stack traceback:" ]; then
    why="a second line that is not the traceback: $second"
  else
    case "$first" in
      "flashjit $1: "*"$text"*) ;;
      *) why="the first line on stderr lacks 'flashjit $1: ...$text'" ;;
    esac
  fi
  if [ -n "$why" ]; then
    echo "FAIL (template limits): $why: $what"
    tpl_fails=$((tpl_fails + 1))
  else
    echo "ok   $what"
  fi
}

BOMB="string.find(string.rep('a', 40), string.rep('a*', 40) .. 'b')"
COST="string.find: the pattern 'a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*' on 40 bytes could take 1.1e+68 steps; the limit is 5e+07"
BUDGET="template exceeded its instruction limit (200 million)"
LOAD="cannot load the template renderer: render.lua:1:"
tpl_dir renderer_bomb render.lua "$BOMB"
tpl_dir renderer_rep render.lua "for i = 1, 1e9 do local s = ('x'):rep(100) end"
tpl_dir template_bomb common.cuh "{% $BOMB %}"
tpl_dir template_rep common.cuh "{% for i = 1, 1e9 do local s = ('x'):rep(100) end %}"
tpl_dir template_finds common.cuh "{% local s = ('a'):rep(150) for i = 1, 1e9 do s:find('a*a*b') end %}"
EMIT="emit --shape 1,2,256,64 --arch sm_80 --what resources"
# Every command that loads the renderer stops at its first line (the bomb
# is refused before it starts, in milliseconds).
bounded renderer_bomb "$LOAD $COST" $EMIT
bounded renderer_bomb "$LOAD $COST" emit --shape 1,2,256,64 --arch sm_90a
bounded renderer_bomb "$LOAD $COST" emit --first --shape 1,2,256,64 --arch sm_80
bounded renderer_bomb "$LOAD $COST" emit --backward --shape 1,2,256,64 --arch sm_80 --what resources
bounded renderer_bomb "$LOAD $COST" plan --shape 1,2,256,64 --arch sm_80
bounded renderer_bomb "$LOAD $COST" cache prewarm --arch sm_80 --head-dim 64 --dtype f16 --causal none
bounded renderer_bomb "$LOAD $COST" run --shape 1,2,256,64
bounded renderer_rep "$LOAD $BUDGET" $EMIT
bounded renderer_rep "$LOAD $BUDGET" plan --shape 1,2,256,64 --arch sm_80
bounded template_bomb "rendering attention_mma.cu failed: common.cuh:1: $COST" $EMIT
bounded template_rep "rendering attention_mma.cu failed: common.cuh:1: $BUDGET" $EMIT
bounded template_finds "rendering attention_mma.cu failed: common.cuh:1: $BUDGET" $EMIT
echo "template limits: $tpl_fails failed"

sh "$(dirname "$0")/cli_corpus.sh" "$FJ" "$TABLE"
corpus=$?
[ "$corpus" = 0 ] && [ "$tpl_fails" = 0 ]
