#!/bin/sh
# skip_reasons.sh DIR -- after ctest has run (CTEST_CUSTOM_POST_TEST, from
# tests/CTestCustom.cmake.in), prints why each skipped test was skipped:
# ctest 3.25 prints "***Skipped" and nothing else without -V, and every
# GPU test skips on a machine without a GPU.  DIR is the build's
# Testing/Temporary; its newest LastTest log (ctest still writes it as
# LastTest*.log.tmp while this runs) holds each test's output, in which
# tests/runner.c's fjt_skip printed "SKIP: reason".
dir=$1
log=$(ls -t "$dir"/LastTest.log* "$dir"/LastTest_*.log* 2>/dev/null | head -n 1)
[ -n "$log" ] || exit 0
awk '
  /^[0-9]+\/[0-9]+ Test: / { name = $3; next }
  /^SKIP: / && name != "" {
    if (!said++)
      print "\nWhy tests were skipped:"
    printf "  %s: %s\n", name, substr($0, 7)
    name = ""
  }
' "$log"
