#!/bin/bash
# s37a.sh OUTDIR -- the next session's first call, prepared in the
# thirty-sixth: from the repository root with build/ (main's build,
# slimmed) and build-rt/ (main with bench/probes/rt_inside.patch applied,
# slimmed) carried.  S37A_PARTS (default "fix rtin ab"), the whole bounded
# by S37A_SECONDS (560):
#   fix   main's relative-table fixes after the review (e7000ee), never
#         run on a GPU: gpu_tier (its two relative-table cases: the tiered
#         JIT's first kernel with the table in a workspace of its own plan,
#         and a table with no user parameters) and gpu_mods_user (a
#         parameter-less table on both families), bounded.
#   rtin  the padded table with its table_inside proof (build-rt/):
#         gpu_mods_user, gpu_backward_mods, bounded.
#   ab    backward and forward medians of (2, 16, 2048, 128) bf16 and
#         (2, 16, 4096, 128) causal, T5 and the bucket-table lookup, main
#         against build-rt, alternately, two rounds.  Predicted: the
#         unmasked backward 455 -> 385-400 us (the relative bias's 388-396
#         on the H100, R13), the forward and the causal rows within 2%.
set -u
. bench/probes/parts_lib.sh
parts_start s37a "${1:-}" ${S37A_SECONDS:-560}
LOOKUP=(--score-mod 's + bias(h, bkt(kv - q + 2047))' --param 'bias:f32[16,4095]' --param 'bkt:i32[4095]')
T5=(--mod t5 --param 'bias:f32[16,32]')
tests_in() {  # tests_in DIR SECONDS TEST...: each GPU test of DIR's fj_tests, at once
  local dir=$1 secs=$2 t
  local -a pids=()
  shift 2
  for t in "$@"; do
    (cd "$dir" && FLASHJIT_CACHE_DIR=/tmp/s37-$dir-$t timeout $(bound "$secs") ./tests/fj_tests $t >"$out/$dir-$t.log" 2>&1
     echo "$dir $t: exit $? ($(grep -c '^ok' "$out/$dir-$t.log") ok, $(grep -c 'FAIL' "$out/$dir-$t.log") FAIL)"
     grep -E 'FAIL|failed|relative table|t5|no parameters' "$out/$dir-$t.log" | head -8 | cut -c1-200) &
    pids+=($!)
  done
  wait "${pids[@]}"
}
part_fix() { tests_in build ${S37A_TEST_S:-200} gpu_tier gpu_mods_user gpu_mods_checked; }
part_rtin() { tests_in build-rt ${S37A_TEST_S:-200} gpu_mods_user gpu_backward_mods; }
part_ab() {
  local shape round dir us line bwd what
  local -a shapes args
  IFS=';' read -ra shapes <<<"${S37A_SHAPES:-2,16,2048,128;2,16,4096,128 --causal}"
  for bwd in --backward ""; do
    for shape in "${shapes[@]}"; do
      for what in t5 lookup; do
        line="ab$bwd $what $shape:"
        args=("${T5[@]}")
        [ $what = lookup ] && args=("${LOOKUP[@]}")
        for round in 1 2; do
          for dir in build build-rt; do
            # shellcheck disable=SC2086
            us=$(cd $dir && FLASHJIT_CACHE_DIR=/tmp/s37-ab-$dir timeout $(bound 60) ./flashjit run $bwd \
              --shape $shape --dtype bf16 --iters 30 "${args[@]}" 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
            line="$line $dir=${us:-?}"
          done
        done
        echo "$line"
      done
    done
  done
}
parts_run s37a ${S37A_PARTS:-fix rtin ab}
