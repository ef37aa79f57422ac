#!/bin/sh
# layers.sh SRC -- the library's modules form layers, and a module includes
# only headers of the layers below it (and its own header): no include
# circle, and a newcomer can read from the includes what a module may touch.
# The order, lowest first (README's "Layout of the source" explains each):
layers="util
ctx kparams expr mods_memo
mods
driver template compile reference
cache workspace devptr launch_record mods_kernel
kernel
layout
variant
tunedb plan tier
attention
tune cache_pack block_mask
lifecycle"
src=$1
fails=0
level() {  # level MODULE -> its layer number, or nothing
  echo "$layers" | awk -v m="$1" '{ for (i = 1; i <= NF; i++) if ($i == m) print NR }'
}
for f in "$src"/*.c "$src"/*.h; do
  base=$(basename "$f")
  mod=${base%.*}
  mine=$(level "$mod")
  if [ -z "$mine" ]; then
    echo "FAIL: $base belongs to no layer (add its module to tests/layers.sh)"
    fails=$((fails + 1))
    continue
  fi
  for h in $(sed -n 's/^#include "\([a-z_0-9]*\)\.h"$/\1/p' "$f"); do
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
[ "$fails" = 0 ]
