# ab_lib.sh -- sourced (from build/, after device_env.sh) by the probes
# that A/B one change: pair.sh, widepipe.sh, fwddesc.sh.
#   ab_tests TAG OUT "name:bound ..." [ENV...]
#       each GPU test of the list under the environment ENV (assignments,
#       e.g. FLASHJIT_TEMPLATE_DIR=dir), bounded, its log in OUT
#   ab_shapes TAG "shape;shape..." "RUN ARGS" NAME_A "ENV_A" NAME_B "ENV_B"
#       each shape timed by `flashjit run RUN ARGS --shape SHAPE --iters
#       30` under ENV_A then ENV_B, two rounds, in one line of medians (us)
ab_tests() {
  local tag=$1 out=$2 list=$3 tb t
  shift 3
  for tb in $list; do
    t=${tb%%:*}
    env "$@" timeout ${tb##*:} ./tests/fj_tests "$t" >"$out/$t.log" 2>&1
    echo "$tag $t: exit $? ($(grep -c '^ok\| ok$' "$out/$t.log") ok, $(grep -c '^FAIL' "$out/$t.log") FAIL)"
    grep -E "^FAIL|check failed" "$out/$t.log" | head -6
  done
}
ab_shapes() {
  local tag=$1 list=$2 args=$3 na=$4 ea=$5 nb=$6 eb=$7 shape round line us
  local -a shapes
  IFS=';' read -ra shapes <<<"$list"
  for shape in "${shapes[@]}"; do
    line="$tag $shape:"
    for round in 1 2; do
      us=$(env $ea timeout 60 ./flashjit run $args --shape $shape --iters 30 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      line="$line $na=${us:-?}"
      us=$(env $eb timeout 60 ./flashjit run $args --shape $shape --iters 30 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
      line="$line $nb=${us:-?}"
    done
    echo "$line"
  done
}
