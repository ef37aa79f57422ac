#!/bin/sh
# cli_corpus.sh FLASHJIT TABLE -- runs the command line's corpus
# (tests/cli_corpus.txt: STATUS <TAB> TEXT <TAB> ARGS, one case a line) and
# counts, for each case, a hang (past its time limit), a crash (a signal), a
# wrong exit status, a message that is not exactly one line, and a missing
# text.  All must be zero.  First it checks that it can see each kind of
# failure (on stand-in commands), so that a pass means something.
FJ=$1
TABLE=$2
LIMIT=${FJ_CASE_TIMEOUT:-60}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
TMP=$tmp/dir
mkdir -p "$TMP" && printf 'x' >"$TMP/file"
LONG=/$(head -c 4999 /dev/zero | tr '\0' a)
NL='
'
export TMP LONG NL
hangs=0 crashes=0 statuses=0 lines=0 texts=0 cases=0

bad() {  # bad KIND MESSAGE
  eval "$1=\$((\$$1 + 1))"
  echo "FAIL ($1): $2"
}

# check WANT TEXT LIMIT CMD...: one case; WANT is 0, 2 or H (see the table).
check() {
  want=$1 text=$2 limit=$3
  shift 3
  cases=$((cases + 1))
  timeout -k 5 "$limit" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  code=$?
  n=$(wc -l <"$tmp/err")
  what="$* -> $code: $(head -c 400 "$tmp/err")"
  if [ "$code" = 124 ] || [ "$code" = 137 ]; then
    bad hangs "$what"
  elif [ "$code" -gt 128 ]; then
    bad crashes "$what"
  elif [ "$code" != "${want#H}" ] && ! { [ "$want" = H ] && [ "$code" = 0 ]; }; then
    bad statuses "want $want: $what"
  elif [ "$want" != 0 ] && [ "$want" != H ] && [ "$n" != 1 ]; then
    bad lines "$n lines: $what"
  elif [ "$want" != 0 ] && [ "$want" != H ] && ! grep -qF -- "$text" "$tmp/err"; then
    bad texts "lacks '$text': $what"
  elif [ "$want" = 0 ] && ! grep -qF -- "$text" "$tmp/out"; then
    bad texts "stdout lacks '$text': $what"
  elif [ "$want" = H ] && grep -qF -- "$text" "$tmp/out"; then
    bad texts "the help mentions '$text': $what"
  fi
}

# The runner sees every kind of failure: each stand-in must count one.
{
  check 0 x 1 sh -c 'sleep 10'
  check 0 x 5 sh -c 'kill -SEGV $$'
  check 2 x 5 sh -c 'echo x >&2; exit 1'
  check 2 x 5 sh -c 'echo x >&2; echo y >&2; exit 2'
  check 2 x 5 sh -c 'exit 2'
  check 2 x 5 sh -c 'echo y >&2; exit 2'
  check 0 x 5 sh -c 'echo y'
  check H x 5 sh -c 'echo x'
} >/dev/null 2>&1
if [ "$hangs $crashes $statuses $lines $texts" != "1 1 1 2 3" ]; then
  echo "cli_corpus: the runner does not see failures: hangs=$hangs crashes=$crashes statuses=$statuses lines=$lines texts=$texts"
  exit 1
fi
echo "ok   the runner sees hangs, crashes, wrong statuses, lines and texts"
hangs=0 crashes=0 statuses=0 lines=0 texts=0 cases=0

tab=$(printf '\t')
while IFS="$tab" read -r want text args; do
  case "$want" in ''|'#'*) continue ;; esac
  eval "set -- $args"
  text=$(printf '%s' "$text" | sed "s|\\\$TMP|$TMP|g")
  check "$want" "$text" "$LIMIT" "$FJ" "$@"
done <"$TABLE"

failed=$((hangs + crashes + statuses + lines + texts))
echo "cli_corpus: $cases cases: hangs=$hangs crashes=$crashes wrong_status=$statuses not_one_line=$lines wrong_text=$texts"
[ "$failed" = 0 ]
