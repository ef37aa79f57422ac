#!/bin/bash
# s36b.sh OUTDIR -- the thirty-sixth session's second call, from the
# repository root with build/ carried (main's build, slimmed): the
# relative table (issue 33, item 5: a score subtree of the query head and
# the distance alone, evaluated once a launch into the workspace and read
# in its place).  S36B_PARTS (default "tests checks ab"), the whole bounded
# by S36B_SECONDS (560):
#   tests  gpu_mods_user (T5's buckets with GQA and a decode row, a
#          log-distance bias), gpu_backward_mods (T5 on the narrow, wide
#          and mma kernels, varlen, a bucket table), and
#          gpu_backward_param_grads (T5's table's gradient), at once in
#          the background (compile-bound), waited for before ab.
#   checks flashjit run --check (forward, then --backward) of a two-level
#          lookup and of --mod t5 with the table (S36B_CHECK_ENVS, default
#          FJ_UNUSED=1; FLASHJIT_REL_TABLE=0: without).
#   ab2    (below) plain, relative bias, lookup, T5, the table's function
#          remembered per form.
#   ab     forward and backward medians of (2, 16, 2048, 128) bf16 and
#          (2, 16, 4096, 128) causal: no expression, the two-level lookup
#          s + bias(h, bkt(kv - q + 2047)) and T5, each with the table and
#          with FLASHJIT_REL_TABLE=0, alternately, two rounds.  Predicted:
#          the lookup's forward 1.93x the plain kernel's (issue 33) ->
#          1.05-1.15x with the table (one read a score at a row pointer,
#          as the relative bias: docs/PERF.md), T5 likewise; the backward
#          alike.
set -u
. bench/probes/parts_lib.sh
parts_start s36b "${1:-}" ${S36B_SECONDS:-560}
bg_pids=""
LOOKUP=(--score-mod 's + bias(h, bkt(kv - q + 2047))' --param 'bias:f32[16,4095]' --param 'bkt:i32[4095]')
T5=(--mod t5 --param 'bias:f32[16,32]')
part_tests() {
  local t
  for t in ${S36B_TESTS:-gpu_mods_user gpu_backward_mods gpu_backward_param_grads}; do
    (cd build && FLASHJIT_CACHE_DIR=/tmp/s36b-$t timeout $(bound ${S36B_TEST_S:-240}) ./tests/fj_tests $t >"$out/$t.log" 2>&1
     echo "tests $t: exit $? ($(grep -c '^ok' "$out/$t.log") ok, $(grep -c 'FAIL' "$out/$t.log") FAIL)"
     grep -E 'FAIL|failed|t5|log distance|rel\(h' "$out/$t.log" | head -12 | cut -c1-200) &
    bg_pids="$bg_pids $!"
  done
}
part_checks() {
  local env bwd
  for env in ${S36B_CHECK_ENVS:-FJ_UNUSED=1}; do
    for bwd in "" --backward; do
      echo "checks lookup $env $bwd: $(cd build && env $env FLASHJIT_CACHE_DIR=/tmp/s36b-c timeout $(bound 90) ./flashjit run $bwd --check \
        --dtype bf16 --shape 1,16,400,128 --seq-kv 500 --causal=bottom-right "${LOOKUP[@]}" --iters 3 2>&1 | grep -E 'PASS|FAIL|rror' | tr '\n' ' ')"
      echo "checks t5 $env $bwd: $(cd build && env $env FLASHJIT_CACHE_DIR=/tmp/s36b-c timeout $(bound 90) ./flashjit run $bwd --check \
        --dtype bf16 --shape 2,16,300,64 --heads-kv 4 "${T5[@]}" --iters 3 2>&1 | grep -E 'PASS|FAIL|rror' | tr '\n' ' ')"
    done
  done
}
part_ab() {
  local p shape round cfg env us line bwd what
  local -a shapes args
  for p in $bg_pids; do wait $p; done
  IFS=';' read -ra shapes <<<"${S36B_SHAPES:-2,16,2048,128;2,16,4096,128 --causal}"
  for bwd in "" --backward; do
    for shape in "${shapes[@]}"; do
      for what in plain lookup t5; do
        line="ab$bwd $what $shape:"
        for round in 1 2; do
          for cfg in table none; do
            [ $what = plain ] && [ $cfg = none ] && continue
            env=FJ_UNUSED=1
            [ $cfg = none ] && env=FLASHJIT_REL_TABLE=0
            args=()
            [ $what = lookup ] && args=("${LOOKUP[@]}")
            [ $what = t5 ] && args=("${T5[@]}")
            # shellcheck disable=SC2086
            us=$(cd build && env $env FLASHJIT_CACHE_DIR=/tmp/s36b-ab timeout $(bound 60) ./flashjit run $bwd \
              --shape $shape --dtype bf16 --iters 30 "${args[@]}" 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
            line="$line $cfg=${us:-?}"
          done
        done
        echo "$line"
      done
    done
  done
}
# ab2: after the table's kernel function was remembered per form (the
# first ab's T5 rows paid a parse and the expressions' printing a call on
# the host): plain, the relative bias read at a distance (the same kernel
# form as a table's read), the lookup and T5 with the table, forward and
# backward, two rounds.  Predicted: T5 as the lookup, both as the
# relative bias.
RELB=(--score-mod 's + bias(h, q - kv + 2047)' --param 'bias:f32[16,4095]')
part_ab2() {
  local p shape round us line bwd what
  local -a shapes args
  for p in $bg_pids; do wait $p; done
  IFS=';' read -ra shapes <<<"${S36B_SHAPES:-2,16,2048,128;2,16,4096,128 --causal}"
  for bwd in "" --backward; do
    for shape in "${shapes[@]}"; do
      line="ab2$bwd $shape:"
      for round in 1 2; do
        for what in plain relbias lookup t5; do
          args=()
          [ $what = relbias ] && args=("${RELB[@]}")
          [ $what = lookup ] && args=("${LOOKUP[@]}")
          [ $what = t5 ] && args=("${T5[@]}")
          # shellcheck disable=SC2086
          us=$(cd build && FLASHJIT_CACHE_DIR=/tmp/s36b-ab timeout $(bound 60) ./flashjit run $bwd \
            --shape $shape --dtype bf16 --iters 30 "${args[@]}" 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
          line="$line $what=${us:-?}"
        done
      done
      echo "$line"
    done
  done
}
parts_run s36b ${S36B_PARTS:-tests checks ab}
for p in $bg_pids; do wait $p; done
