#!/bin/sh
# layers.sh SRC [NM LIB] -- the library's modules form layers, and a module
# includes only headers of the layers below it (and its own header): no
# include circle, and a newcomer can read from the includes what a module
# may touch.  With NM and the static library LIB, calls too: every symbol
# an object takes from another module's object is defined in a layer below
# (a public function declared in flashjit.h makes no include, so only the
# objects show a call up: reference.c naming a dtype through variant.c once
# closed a circle the includes did not show).
# The order, lowest first (README's "Layout of the source" explains each):
layers="util
ctx kparams expr mods_memo
mods axes expr_grad numbers
driver template compile problem
reference cache entry workspace devptr launch_record mods_kernel
package
kernel
layout rel_table
variant
plan
tunedb tier
attention
tune cache_pack block_mask backward package_seal merge
tune_bwd prewarm_bwd
lifecycle"
# A module's private headers, part of it (name:module).
parts="expr_tree:expr"
src=$1
nm=$2
lib=$3
fails=0
module() {  # module NAME -> the module a file's base name belongs to
  for p in $parts; do
    [ "${p%%:*}" = "$1" ] && { echo "${p#*:}"; return; }
  done
  echo "$1"
}
level() {  # level MODULE -> its layer number, or nothing
  echo "$layers" | awk -v m="$1" '{ for (i = 1; i <= NF; i++) if ($i == m) print NR }'
}
for f in "$src"/*.c "$src"/*.h; do
  base=$(basename "$f")
  mod=$(module "${base%.*}")
  mine=$(level "$mod")
  if [ -z "$mine" ]; then
    echo "FAIL: $base belongs to no layer (add its module to tests/layers.sh)"
    fails=$((fails + 1))
    continue
  fi
  for h in $(sed -n 's/^#include "\([a-z_0-9]*\)\.h"$/\1/p' "$f"); do
    h=$(module "$h")
    [ "$h" = "$mod" ] && continue
    [ "$h" = flashjit ] && continue
    theirs=$(level "$h")
    if [ -z "$theirs" ] || [ "$theirs" -ge "$mine" ]; then
      echo "FAIL: $base (layer $mine) includes $h.h (layer ${theirs:-none})"
      fails=$((fails + 1))
    fi
  done
done
n=$(ls "$src"/*.c "$src"/*.h | wc -l)
echo "$n files checked, $fails violations"
[ -z "$lib" ] && { [ "$fails" = 0 ]; exit; }

# The calls: "nm -A" prints "LIB:module.c.o: [address] TYPE symbol".  The
# objects of no module in the layers (the embedded templates) are data.
calls=$("$nm" -A "$lib" 2>/dev/null | awk -v layers="$layers" '
  BEGIN { n = split(layers, rows, "\n")
          for (i = 1; i <= n; i++) { k = split(rows[i], m, " ")
                                     for (j = 1; j <= k; j++) level[m[j]] = i } }
  { split($1, part, ":"); obj = part[2]; sub(/\.c\.o$/, "", obj)
    type = $(NF - 1); sym = $NF
    if (!(obj in level)) next
    if (type == "U") { use[obj, sym] = 1; next }
    if (type ~ /^[TDBRV]$/) def[sym] = obj }
  END { bad = 0
        for (k in use) { split(k, u, SUBSEP); to = def[u[2]]
          if (to == "" || to == u[1] || level[to] < level[u[1]]) continue
          printf "FAIL: %s.c (layer %d) calls %s of %s.c (layer %d)\n", \
                 u[1], level[u[1]], u[2], to, level[to]; bad++ }
        print bad " calls up" }')
echo "$calls" | grep '^FAIL' | sort
echo "$calls" | tail -n 1
bad=$(echo "$calls" | tail -n 1 | cut -d" " -f1)
[ "$fails" = 0 ] && [ "$bad" = 0 ]
