#!/bin/bash
# s36a.sh OUTDIR -- the thirty-sixth session's call, from the repository
# root with build/ carried (main's build, slimmed; build/tmpl-old: the
# templates before this change).  S36A_PARTS (default "tests sync checks
# ab"), the whole bounded by S36A_SECONDS (580):
#   tests  gpu_backward, gpu_backward_deterministic,
#          gpu_backward_deterministic_pair and gpu_backward_mods at once in
#          the background (each its own cache; they are compile-bound),
#          while sync and checks run; waited for before ab.
#   sync   compute-sanitizer synccheck, then racecheck, on
#          gpu_sanitize_backward (its first synccheck, s35a's pair192,
#          reported bar.sync 2 waited at from both roles' code in the wide
#          kernel: now each role arrives at the barrier the other waits at).
#   checks flashjit run --backward --check at head dims 192 and 160 (the
#          pair by default since this change), both modes: no mask,
#          causal, GQA, a bottom-right tail.
#   ab     the wide kernel's barriers (this change) against build/tmpl-old
#          (FLASHJIT_BWD_PAIR=1: the pair at 192 there too), default and
#          deterministic, alternately, two rounds.  Predicted: within 1%.
set -u
. bench/probes/parts_lib.sh
parts_start s36a "${1:-}" ${S36A_SECONDS:-580}
bg_pids=""
part_tests() {
  local t
  for t in gpu_backward gpu_backward_deterministic gpu_backward_deterministic_pair gpu_backward_mods; do
    (cd build && FLASHJIT_CACHE_DIR=/tmp/s36-$t timeout $(bound ${S36A_TEST_S:-260}) ./tests/fj_tests $t >"$out/$t.log" 2>&1
     echo "tests $t: exit $? ($(grep -c '^ok' "$out/$t.log") ok, $(grep -c 'FAIL' "$out/$t.log") FAIL)"
     grep -E 'FAIL|failed' "$out/$t.log" | head -6 | cut -c1-200) &
    bg_pids="$bg_pids $!"
  done
  ab 1 >/dev/null 2>&1 &  # ab's kernels compiled meanwhile
  bg_pids="$bg_pids $!"
}
part_sync() {
  local tool
  for tool in synccheck racecheck; do
    (cd build && FLASHJIT_CACHE_DIR=/tmp/s36-sync timeout $(bound 150) compute-sanitizer --tool $tool \
       ./tests/fj_tests gpu_sanitize_backward >"$out/sync_$tool.log" 2>&1
     echo "sync $tool: exit $? ($(grep -c '^ok' "$out/sync_$tool.log") ok)"
     grep -E "ERROR SUMMARY|RACECHECK SUMMARY|hazard|FAIL" "$out/sync_$tool.log" | sort | uniq -c | head -6)
  done
}
part_checks() {
  local a m
  for a in "1,4,512,192" "1,4,512,192 --causal" "1,8,512,192 --heads-kv 2 --causal" "1,4,333,160" \
           "1,4,300,192 --causal=bottom-right --seq-kv 517" "1,4,300,256 --causal=bottom-right --seq-kv 517"; do
    for m in "" --deterministic; do
      # shellcheck disable=SC2086
      echo "checks $a $m: $(cd build && FLASHJIT_CACHE_DIR=/tmp/s36-sync timeout $(bound 60) \
        ./flashjit run --backward --check --dtype bf16 --shape $a $m --iters 3 2>&1 | grep -E 'PASS|FAIL|rror|fail' | tr '\n' ' ')"
    done
  done
}
# ab ITERS: each shape's medians (two rounds of ITERS > 1; one of 1: the
# kernels compiled into the caches).
ab() {
  local shape round cfg det env us line
  local -a shapes
  IFS=';' read -ra shapes <<<"${S36A_SHAPES:-8,10,2048,192;2,16,4096,192 --heads-kv 4 --causal;8,8,2048,256}"
  for shape in "${shapes[@]}"; do
    line="ab $shape:"
    for round in $([ "$1" = 1 ] && echo 1 || echo 1 2); do
      for cfg in old new; do
        env="FLASHJIT_TEMPLATE_DIR=$root/build/tmpl-old FLASHJIT_BWD_PAIR=1"
        [ $cfg = new ] && env=FJ_UNUSED=1
        for det in 0 1; do
          # shellcheck disable=SC2086
          us=$(cd build && env $env FLASHJIT_CACHE_DIR=/tmp/s36-$cfg timeout $(bound 60) ./flashjit run --backward \
            --shape $shape --dtype bf16 --iters $1 $([ $det = 1 ] && echo --deterministic) 2>&1 |
            grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
          line="$line $cfg/$det=${us:-?}"
        done
      done
    done
    echo "$line"
  done
}
part_ab() {
  local p
  for p in $bg_pids; do wait $p; done
  ab 30
}
parts_run s36a ${S36A_PARTS:-tests sync checks ab}
for p in $bg_pids; do wait $p; done
