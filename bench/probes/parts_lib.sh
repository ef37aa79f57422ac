# parts_lib.sh -- sourced by the sessions' probes (s15.sh .. s18.sh), from
# the repository root: one time bound over a device call's parts.
#   parts_start TAG OUTDIR SECONDS  out (OUTDIR, or /tmp/fj-TAG; made),
#                                   root (the repository root), the deadline
#   bound N                         a part's seconds: N, or what is left
#                                   (at least 1)
#   parts_run TAG PART...           part_<PART> in turn while time is left
parts_start() {
  out=${2:-/tmp/fj-$1}
  mkdir -p "$out"
  root=$(pwd)
  deadline=$((SECONDS + $3))
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
