#!/bin/sh
# cli_gpu.sh FLASHJIT -- the command line on a GPU (ctest gpu_cli, label
# gpu).  Without a GPU it prints "SKIP: reason" and exits 77: skipped, the
# reason listed after ctest's summary (tests/skip_reasons.sh).
#
# Issue 35, class 5: exact where exactness is expected.  When each row
# sees one key (--window 0,0: the key on the diagonal; --mask-mod
# 'kv == q'), run --check's float64 reference is that key's V row, which
# the kernel must return bit for bit: the check prints rel_err and
# max_abs_err as exactly 0.  In bf16 with a softcap of 55 or less the
# kernels take their exponentials against a fixed shift and round P to
# bf16; on 439ccd4 the row sum stayed float32, and about 10% of the
# elements came out a bf16 step off -- an error --check's tolerance
# passes, so this script asks for 0.  The library's choice (mma; on sm_90a
# wgmma at 4096 queries), the mma family forced (and wgmma on sm_90a),
# both causal alignments, a mask expression, and a decode's GQA-packed
# split-KV with its combine; and the backward with a block mask (run
# --backward --check against the reference), and its deterministic mode.
FJ=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

if ! "$FJ" run --shape 1,1,16,64 --iters 1 --warmup 0 >"$tmp/probe" 2>"$tmp/err"; then
  if grep -qE "no NVIDIA driver|cuInit\(0\) failed|device [0-9]+ does not exist" "$tmp/err"; then
    echo "SKIP: no GPU: $(sed -n 1p "$tmp/err")"
    exit 77
  fi
  echo "FAIL: flashjit run --shape 1,1,16,64: $(cat "$tmp/err")"
  exit 1
fi
arch=$(sed -n 's/^device: .* (\(sm_[0-9a-z]*\))$/\1/p' "$tmp/probe")
echo "device: $(sed -n 's/^device: //p' "$tmp/probe")"

# exact ARGS...: run ARGS in bf16 with --check: status 0, a PASS whose
# rel_err and max_abs_err are 0.
exact() {
  "$FJ" run --dtype bf16 --check --iters 1 --warmup 0 "$@" >"$tmp/out" 2>&1
  code=$?
  check=$(grep "^check: " "$tmp/out")
  variant=$(sed -n 's/^variant: \([^ ]*\).*/\1/p' "$tmp/out")
  if [ "$code" = 0 ] && echo "$check" | grep -qF " rel_err=0.000e+00 max_abs_err=0.000e+00 " &&
     echo "$check" | grep -q -- "-> PASS$"; then
    echo "ok   run $* ($variant): exact"
  else
    echo "FAIL: run $* ($variant) -> $code, V's row not exact: $(cat "$tmp/out")"
    fails=$((fails + 1))
  fi
}

P="--shape 2,4,256,128 --heads-kv 2"
for cap in 15 50; do
  exact $P --window 0,0 --softcap $cap
  exact $P --window 0,0 --causal --softcap $cap
  exact $P --window 0,0 --softcap $cap --mma mma
  exact $P --mask-mod 'kv == q' --softcap $cap
  exact --shape 2,4,200,64 --heads-kv 2 --seq-kv 300 --causal=bottom-right --window 0,0 --softcap $cap
  exact --shape 2,8,1,128 --heads-kv 2 --seq-kv 4096 --window 0,0 --softcap $cap
  if [ "$arch" = sm_90a ]; then
    exact --shape 2,16,4096,128 --heads-kv 4 --window 0,0 --causal --softcap $cap
    exact $P --window 0,0 --softcap $cap --mma wgmma
  fi
done
exact --shape 2,4,256,64 --heads-kv 2 --seq-kv 384 --window 0,0 --softcap 55

# The backward with a block mask the run builds from the mask (both
# directions), checked against the float64 reference: a PASS.
for dt in bf16 f16; do
  "$FJ" run --backward --check --iters 1 --warmup 0 --dtype $dt --shape 1,8,333,64 \
    --heads-kv 2 --causal --mask-mod '(kv + h * 37) % 5 != 0 || q == kv' \
    --block-mask 64,128 >"$tmp/out" 2>&1
  code=$?
  if [ "$code" = 0 ] && grep -q "^check: .* -> PASS$" "$tmp/out"; then
    echo "ok   run --backward --block-mask 64,128 ($dt): $(grep '^check: ' "$tmp/out")"
  else
    echo "FAIL: run --backward --block-mask 64,128 ($dt) -> $code: $(cat "$tmp/out")"
    fails=$((fails + 1))
  fi
done

# The backward's deterministic mode (--deterministic): checked, and its
# report says the mode (the pair at head dim 256, GQA, causal).
"$FJ" run --backward --deterministic --check --iters 1 --warmup 0 --dtype bf16 \
  --shape 1,8,300,256 --heads-kv 2 --causal >"$tmp/out" 2>&1
code=$?
if [ "$code" = 0 ] && grep -q "^backward (deterministic): " "$tmp/out" &&
    grep -q "^check: .* -> PASS$" "$tmp/out"; then
  echo "ok   run --backward --deterministic: $(grep '^check: ' "$tmp/out")"
else
  echo "FAIL: run --backward --deterministic -> $code: $(cat "$tmp/out")"
  fails=$((fails + 1))
fi

[ "$fails" = 0 ] && echo "cli_gpu: all passed" || echo "cli_gpu: $fails failed"
[ "$fails" = 0 ]
