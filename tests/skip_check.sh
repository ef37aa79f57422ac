#!/bin/sh
# skip_check.sh CTEST BUILD -- every GPU test that ctest skips says why in
# ctest's own output, without -V: runs this build's GPU tests in a ctest
# tree of their own (so that this ctest's log is left alone) with no device
# visible, then looks for each "***Skipped" test in the lines that
# tests/skip_reasons.sh prints after the summary.
ctest=$1
build=$2
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
printf 'include("%s/tests/CTestTestfile.cmake")\n' "$build" > "$tmp/CTestTestfile.cmake"
cp "$build/CTestCustom.cmake" "$tmp/" || exit 1
CUDA_VISIBLE_DEVICES= "$ctest" --test-dir "$tmp" -L '^gpu$' -j2 > "$tmp/out" 2>&1
rc=$?
skipped=$(sed -n 's/.* Test *#[0-9]*: \([a-z0-9_]*\) .*\*\*\*Skipped.*/\1/p' "$tmp/out")
bad=0
if [ $rc -ne 0 ] || [ -z "$skipped" ]; then
  echo "ctest exited $rc with these GPU tests skipped: ${skipped:-none}"
  bad=1
fi
for name in $skipped; do
  if ! grep -q "^  $name: ." "$tmp/out"; then
    echo "$name: skipped, and ctest's output does not say why"
    bad=1
  fi
done
[ $bad -eq 0 ] || { cat "$tmp/out"; exit 1; }
echo "$(echo "$skipped" | wc -l) GPU tests skipped, each with its reason"
