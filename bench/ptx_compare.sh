#!/bin/bash
# ptx_compare.sh OLD_BUILD NEW_BUILD < variants -- renders each variant (one
# line of `flashjit emit` flags per line) with both builds' CLIs and compares
# the PTX without comments and debug line information (.loc, .file, the
# inlined-function strings, .b8 debug bytes).  Identical PTX means identical
# kernels.  Runs on the build machine; no GPU needed.
old=$1 new=$2
strip() { grep -vE '^\s*(//|\.loc|\.file)|info_string|^\.b8' "$1"; }
n=0 same=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
while IFS= read -r args; do
  [ -n "$args" ] || continue
  n=$((n + 1))
  FLASHJIT_CACHE_DIR=$tmp/c-old "$old/flashjit" emit $args --what ptx -o "$tmp/old.ptx" 2>/dev/null
  FLASHJIT_CACHE_DIR=$tmp/c-new "$new/flashjit" emit $args --what ptx -o "$tmp/new.ptx" 2>/dev/null
  if [ -s "$tmp/old.ptx" ] && diff -q <(strip "$tmp/old.ptx") <(strip "$tmp/new.ptx") >/dev/null; then
    same=$((same + 1))
    echo "same  $args"
  else
    echo "DIFF  $args"
  fi
  rm -f "$tmp/old.ptx" "$tmp/new.ptx"
done
echo "$same of $n identical"
