#!/bin/sh
# oom.sh FLASHJIT SHIM NM LIBRARY -- allocation failures: each case runs a
# command once to count the allocations the library makes (fault_inject.c,
# preloaded; fault_ranges.sh says which calls are the library's), then
# again with each of them failing in turn.  Every run must end cleanly: no
# signal and no hang; an error exit with one line on stderr, or success
# with the output of the run that failed nothing (a failure is never
# swallowed into another answer).
FJ=$1 SHIM=$2 NM=$3 LIB=$4
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# ranges FILE [MEMBERS]: the library's functions (Lua's allocator left out:
# the templates' allocations are thousands, and Lua's own to handle).
ranges() {
  sh "$(dirname "$0")/fault_ranges.sh" "$NM" "$LIB" "$FJ" tpl_alloc "${2:-}" >"$1"
}

# sweep NAME RANGES ARGS...: every allocation of `flashjit ARGS` failed in
# turn; $setup (a command) runs before each run.
sweep() {
  name=$1 r=$2
  shift 2
  eval "$setup"
  timeout 60 env FJ_FAULT_RANGES="$r" FJ_FAULT_REPORT="$tmp/count" \
    LD_PRELOAD="$SHIM" "$FJ" "$@" >"$tmp/want" 2>/dev/null
  count=$(cut -d' ' -f1 "$tmp/count")
  if [ -z "$count" ] || [ "$count" -lt 1 ]; then
    fail "$name: no allocation counted"
    return
  fi
  n=1 bad=0
  while [ "$n" -le "$count" ]; do
    eval "$setup"
    timeout 60 env FJ_FAULT_N=$n FJ_FAULT_RANGES="$r" LD_PRELOAD="$SHIM" \
      "$FJ" "$@" >"$tmp/out" 2>"$tmp/err"
    code=$?
    lines=$(wc -l <"$tmp/err")
    why=
    if [ "$code" -ge 124 ]; then
      why="exit $code (crash or hang): $(tail -2 "$tmp/err")"
    elif [ "$code" != 0 ] && [ "$lines" != 1 ]; then
      why="exit $code with $lines lines: $(head -3 "$tmp/err")"
    elif [ "$code" = 0 ] && ! cmp -s "$tmp/want" "$tmp/out"; then
      why="exit 0 with other output: $(diff "$tmp/want" "$tmp/out" | head -4)"
    elif [ -n "$check" ] && ! eval "$check"; then
      why="$check does not hold"
    fi
    if [ -n "$why" ]; then
      fail "$name, allocation $n failed: $why"
      bad=$((bad + 1))
    fi
    n=$((n + 1))
  done
  [ "$bad" = 0 ] && echo "ok   $name: each of $count allocations failed in turn"
}

export FLASHJIT_CACHE_DIR="$tmp/cache"
ranges "$tmp/all"
ranges "$tmp/compile" compile.c.o
ranges "$tmp/template" template.c.o

rm -rf "$tmp/cache"
# A kernel compiled in this process: its NVRTC log's allocation failing
# left a kernel without a log, which the disk cache's writer read.
setup='rm -rf "$tmp/cache"' check=
sweep "emit --first" "$tmp/compile" emit --head-dim 64 --first --what ptx

# The backward's plan: a render failing for memory made it try (and
# print) another kernel.
sweep "plan --backward" "$tmp/template" plan --shape 2,4,1024,128 --backward --causal

# The disk cache's commands on a cache of four entries: a listing, an
# export or a prune never goes on without an entry that memory could not
# hold, and prune never removes a whole entry it could not read.
rm -rf "$tmp/cache"
"$FJ" emit --head-dim 64 --first >/dev/null 2>&1 &&
  "$FJ" emit --head-dim 128 --first >/dev/null 2>&1 ||
  fail "cannot fill the cache"
rm -rf "$tmp/full"
cp -rp "$tmp/cache" "$tmp/full"
files=$(ls "$tmp/full" | wc -l)
setup='rm -rf "$tmp/cache"; cp -rp "$tmp/full" "$tmp/cache"'
sweep "cache ls" "$tmp/all" cache ls
sweep "cache stats" "$tmp/all" cache stats
sweep "cache export" "$tmp/all" cache export "$tmp/pack"
check='[ "$(ls "$tmp/cache" | wc -l)" = "$files" ]'
sweep "cache prune" "$tmp/all" cache prune

[ "$fails" = 0 ] || { echo "$fails failures"; exit 1; }
echo "all passed"
