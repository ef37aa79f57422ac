#!/bin/sh
# fault_ranges.sh NM LIBRARY PROGRAM [SKIP [MEMBERS]]: the functions
# PROGRAM took from the static LIBRARY, as "START SIZE" (hex offsets into
# PROGRAM) a line, for fault_inject.c's FJ_FAULT_RANGES: the audit then
# fails only calls the library itself makes.  SKIP, a list of names,
# leaves those functions out (tpl_alloc: Lua's own allocations); MEMBERS,
# a list of the library's objects (compile.c.o), keeps only theirs.  A
# name the library shares with another object of PROGRAM (a static
# helper) counts for both.
set -eu
nm=$1 lib=$2 prog=$3 skip=${4:-} members=${5:-}
names=${TMPDIR:-/tmp}/fj-ranges.$$
"$nm" -A --defined-only "$lib" 2>/dev/null |
  awk -v members=" $members " '$2 ~ /^[tT]$/ {
    n = split($1, part, ":"); member = part[n - 1]
    if (members == "  " || index(members, " " member " ")) print "want", $3 }' > "$names"
"$nm" -S --defined-only "$prog" | awk 'NF == 4 && $3 ~ /^[tT]$/ {print $4, $1, $2}' |
  cat "$names" - |
  awk -v skip=" $skip " '$1 == "want" { want[$2] = 1; next }
    want[$1] && index(skip, " " $1 " ") == 0 { print $2, $3 }'
rm -f "$names"
