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
# turn (with $io set, every open and write too); $setup (a command) runs
# before each run, $check (a condition, of $code and the files) after.
sweep() {
  name=$1 r=$2
  shift 2
  eval "$setup"
  timeout 60 env ${io:+FJ_FAULT_IO=1} FJ_FAULT_RANGES="$r" FJ_FAULT_REPORT="$tmp/count" \
    LD_PRELOAD="$SHIM" "$FJ" "$@" >"$tmp/want" 2>/dev/null
  count=$(cut -d' ' -f1 "$tmp/count")
  if [ -z "$count" ] || [ "$count" -lt 1 ]; then
    fail "$name: no allocation counted"
    return
  fi
  n=1 bad=0
  while [ "$n" -le "$count" ]; do
    eval "$setup"
    timeout 60 env ${io:+FJ_FAULT_IO=1} FJ_FAULT_N=$n FJ_FAULT_RANGES="$r" LD_PRELOAD="$SHIM" \
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
setup='rm -rf "$tmp/cache"' check= io=
sweep "emit --first" "$tmp/compile" emit --head-dim 64 --first --what ptx

# Its disk cache entries: the checksum's allocation failing wrote a
# corrupt entry, and a payload's or the render index key's left an entry
# out unsaid (a prewarm then sealed a package without it).  Each entry is
# written whole or the log says it was not.
entries_whole() {
  [ "$code" != 0 ] && return 0
  "$FJ" cache ls >"$tmp/ls" 2>/dev/null && ! grep -q invalid "$tmp/ls" &&
    { [ "$(wc -l <"$tmp/ls")" = 2 ] || grep -q "kept in memory only" "$tmp/err"; }
}
check=entries_whole
sweep "emit --first (its entries)" "$tmp/all" emit --head-dim 64 --first --what name
check=

# The backward's plan: a render failing for memory made it try (and
# print) another kernel.
sweep "plan --backward" "$tmp/template" plan --shape 2,4,1024,128 --backward --causal
# So did the score expression's derivative failing for memory.
ranges "$tmp/mods" "mods_kernel.c.o expr_grad.c.o"
sweep "plan --backward --score-mod" "$tmp/mods" plan --shape 2,4,1024,64 --backward --score-mod 's + 0.01f * (q - kv)'

# tune --show: a database that could not be read (memory, file
# descriptors) listed as empty, and the tuner would have written it anew
# with its one entry.
printf '{"format": 1, "entries": {"H200|sm_90a|13000|d64|f16|kv=f16|causal=none|q=2^12|k=2^12|gqa=1": {"variant": {"tile_m": 64, "tile_n": 64, "warps": 4, "stages": 2, "swizzle": "xor", "softmax": "regs", "mma": "mma"}, "ms": 1.0, "default_ms": 1.25, "shape": "4,16/16,4096/4096,64", "date": "2026-12-05T00:00:00Z"}}}\n' >"$tmp/tune.json"
setup='rm -rf "$tmp/cache"; mkdir -p "$tmp/cache"; cp "$tmp/tune.json" "$tmp/cache"'
io=1 sweep "tune --show" "$tmp/all" tune --show
io=

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
# An entry that could not be opened was left out as an "other file".
io=1 sweep "cache export (I/O)" "$tmp/all" cache export "$tmp/pack"
io=
check='[ "$(ls "$tmp/cache" | wc -l)" = "$files" ]'
sweep "cache prune" "$tmp/all" cache prune

[ "$fails" = 0 ] || { echo "$fails failures"; exit 1; }
echo "all passed"
