# parts_lib.sh -- sourced by the sessions' probes (s15.sh .. s19.sh), from
# the repository root: one time bound over a device call's parts.
#   parts_start TAG OUTDIR SECONDS  out (OUTDIR, or /tmp/fj-TAG; made,
#                                   absolute), root (the repository root),
#                                   the deadline; prints "TAG gpu: NAME"
#   bound N                         a part's seconds: N, or what is left
#                                   (at least 1)
#   parts_run TAG PART...           part_<PART> in turn while time is left
#   rows TAG DTYPE SHAPES NAME=BIN...  the forward's median per shape
#                                   under each binary and its arguments
#   fp8_rows TAG SHAPES NAME=BIN... rows in e4m3
#   gpu_tests CACHE PATTERN NAME:SECONDS...  each GPU test of build/'s
#                                   fj_tests within its bound, its log
#                                   $out/NAME.log; a line each, then its
#                                   lines matching PATTERN
#   gpu_tests_at DIR CACHE PATTERN NAME:SECONDS...  the same from DIR's
#                                   fj_tests, all at once (one GPU), each
#                                   with its cache CACHE-NAME
parts_start() {
  out=${2:-/tmp/fj-$1}
  mkdir -p "$out"
  out=$(cd "$out" && pwd)
  root=$(pwd)
  deadline=$((SECONDS + $3))
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name --format=csv,noheader | sed "s/^/$1 gpu: /"
  fi
}
bound() { local b=$(( deadline - SECONDS )); [ $b -gt $1 ] && b=$1; [ $b -lt 1 ] && b=1; echo $b; }
parts_run() {
  local tag=$1 p
  shift
  for p in "$@"; do
    [ $SECONDS -lt $deadline ] || { echo "$tag: out of time before $p"; break; }
    echo "$tag part $p at ${SECONDS}s"
    part_$p
  done
}
# rows TAG DTYPE "SHAPE;SHAPE..." NAME=BIN ARGS...: one line a shape, the
# forward's median (us) in DTYPE under each NAME's binary and arguments
# in turn, two rounds.
rows() {
  local tag=$1 dtype=$2 shape round v line us
  local -a shapes cmd
  IFS=';' read -ra shapes <<<"$3"
  shift 3
  for shape in "${shapes[@]}"; do
    line="$tag $shape:"
    for round in 1 2; do
      for v in "$@"; do
        # NAME=BIN ARGS...: the binary, then run, then its arguments (flashjit
        # takes options after the subcommand).
        read -ra cmd <<<"${v#*=}"
        us=$(timeout 60 "${cmd[0]}" run --dtype $dtype --shape $shape "${cmd[@]:1}" --iters 30 2>&1 | grep -oE 'median [0-9.]+ us' | grep -oE '[0-9.]+')
        line="$line ${v%%=*}=${us:-?}"
      done
    done
    echo "$line"
  done
}
fp8_rows() { local tag=$1; shift; rows "$tag" e4m3 "$@"; }
gpu_tests_at() {
  local dir=$1 cache=$2 pattern=$3 t name pids=()
  shift 3
  for t in "$@"; do
    name=${t%%:*}
    (cd "$dir" && FLASHJIT_CACHE_DIR=$cache-$name timeout $(bound ${t#*:}) ./tests/fj_tests $name >"$out/$name.log" 2>&1
     echo "$name: exit $? ($(grep -c '^ok' "$out/$name.log") ok, $(grep -c 'FAIL' "$out/$name.log") FAIL)"
     grep -E "$pattern" "$out/$name.log" | head -6 | cut -c1-200) &
    pids+=($!)
  done
  wait "${pids[@]}"
}
gpu_tests() {
  local cache=$1 pattern=$2 t name
  shift 2
  for t in "$@"; do
    name=${t%%:*}
    (cd build && FLASHJIT_CACHE_DIR=$cache timeout $(bound ${t#*:}) ./tests/fj_tests $name >"$out/$name.log" 2>&1
     echo "$name: exit $? ($(grep -c '^ok' "$out/$name.log") ok, $(grep -c 'FAIL' "$out/$name.log") FAIL)"
     grep -E "$pattern" "$out/$name.log" | head -6 | cut -c1-200)
  done
}
