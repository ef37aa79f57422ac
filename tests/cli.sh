#!/bin/sh
# cli.sh FLASHJIT -- the command-line contract: every bad input exits 2 with
# one line naming the bad value and what is allowed; good input works with no
# GPU (emit, lut --arch, cache); run says clearly when there is no GPU.
FJ=$1
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect CODE TEXT ARGS...: exit status CODE and TEXT on stderr, in one line
# when CODE is 2; never a crash.
expect() {
  want=$1 text=$2
  shift 2
  "$FJ" "$@" >"$tmp/out" 2>"$tmp/err"
  code=$?
  lines=$(wc -l <"$tmp/err")
  if [ "$code" != "$want" ]; then
    fail "flashjit $*: exit $code, want $want; stderr: $(cat "$tmp/err")"
  elif ! grep -qF -- "$text" "$tmp/err" "$tmp/out"; then
    fail "flashjit $*: output lacks '$text': $(cat "$tmp/err" "$tmp/out")"
  elif [ "$want" = 2 ] && [ "$lines" != 1 ]; then
    fail "flashjit $*: $lines lines on stderr, want 1: $(cat "$tmp/err")"
  else
    echo "ok   flashjit $* -> $code"
  fi
}

expect 2 "usage: flashjit"
expect 0 "emit" --help
expect 0 "--tile-m" emit --help
expect 0 "flashjit 0." --version
expect 2 "unknown command 'bogus'" bogus
expect 2 "unknown option '--bogus'" emit --bogus
expect 2 "unknown option '--shape'" lut --shape 1,1,1,64
expect 2 "head_dim 7 is invalid: a multiple of 8 from 8 to 576" emit --head-dim 7
# Split head dims (--head-dim-v): the wgmma family's, and the mma family's
# with V as K's first columns (--latent: MLA); wider than K refused there.
expect 0 "--head-dim-v" emit --help
expect 0 "--head-dim-v" plan --help
expect 2 "head_dim_v 130 is invalid: a multiple of 8 from 8 to 512, or 0 (head_dim)" emit --head-dim 192 --head-dim-v 130
expect 0 "fj_attn_d192_v128_m128_n64_w8_s2_pad_regs_mma_nc_f16" emit --head-dim 192 --head-dim-v 128 --mma mma --what name
expect 2 "head_dim_v 256 with head_dim 192 is not implemented for mma mma: it reads V as the first head_dim_v columns of K's rows" emit --head-dim 192 --head-dim-v 256 --mma mma
expect 0 "fj_attn_d576_v512_m16_n64_w4_s2_pad_regs_mma_nc_bf16_gqa_split" plan --arch sm_90a --shape 4,16,1,576 --heads-kv 1 --seq-kv 4096 --head-dim-v 512 --latent --dtype bf16
expect 0 "spill_store_bytes=0" emit --arch sm_90a --shape 4,16,1,576 --heads-kv 1 --seq-kv 4096 --head-dim-v 512 --latent --dtype bf16 --what resources
expect 2 "head_dim 576 with head_dim_v 512 is not implemented for mma wgmma: head dims above 256 run on mma mma" emit --head-dim 576 --head-dim-v 512 --mma wgmma
expect 2 "--latent reads V as the first --head-dim-v columns of K's rows: --head-dim-v must be below D = 192 (got 0)" emit --shape 1,16,1,192 --latent
# The wide sweep: 16- and 32-row tiles of 2, 4 and 8 warps (the others fixed).
expect 0 "fj_attn_d576_v512_m32_n64_w4_s2_pad_regs_mma_nc_bf16     regs=" emit --sweep --head-dim 576 --head-dim-v 512 --dtype bf16 --tile-n 64 --stages 2 --swizzle pad --workers 2
expect 0 "6 variants" emit --sweep --head-dim 576 --head-dim-v 512 --dtype bf16 --tile-n 64 --stages 2 --swizzle pad --workers 2
# A sweep whose kernels the check accepts but NVRTC rejects (a copy of the
# templates with a line that is not CUDA): each such line says failed, and
# the sweep exits 1 with one line counting them (it exited 0).
mkdir -p "$tmp/badtpl" && cp -R "$(dirname "$0")/../templates/." "$tmp/badtpl/" &&
  { echo 'this_is_not_cuda;'; cat "$(dirname "$0")/../templates/attention_mma.cu"; } >"$tmp/badtpl/attention_mma.cu"
FLASHJIT_TEMPLATE_DIR=$tmp/badtpl FLASHJIT_CACHE_DIR=$tmp/badcache "$FJ" emit --sweep --head-dim 576 --head-dim-v 512 \
  --dtype bf16 --tile-n 64 --stages 2 --swizzle pad --workers 2 >"$tmp/out" 2>"$tmp/err"
code=$?
if [ "$code" = 1 ] && [ "$(grep -c ' failed: ' "$tmp/out")" = 3 ] && [ "$(grep -c ' refused: ' "$tmp/out")" = 3 ] &&
   grep -q '^flashjit emit --sweep: 3 of its 6 variants failed to build' "$tmp/err"; then
  echo "ok   emit --sweep with templates NVRTC rejects -> 1, three lines failed"
else
  fail "emit --sweep with templates NVRTC rejects: exit $code; $(cat "$tmp/out" "$tmp/err" | head -9)"
fi
expect 2 "head_dim_v 128 with head_dim 192 is not implemented for FP8 (e4m3)" emit --head-dim 192 --head-dim-v 128 --dtype e4m3
expect 0 "fj_attn_d192_v128_m128_n96_w12_s2_xor_regs_wgmma_nc_f16" emit --arch sm_90a --head-dim 192 --head-dim-v 128 --what name
expect 0 "fj_attn_d192_v128_m128_n64_w12_s2_xor_regs_wgmma_nc_f16" emit --arch sm_90a --head-dim 192 --head-dim-v 128 --tile-n 64 --what name
expect 0 "spill_store_bytes=0" emit --arch sm_90a --head-dim 192 --head-dim-v 128 --what resources
expect 0 "variant: head_dim=192 head_dim_v=128 tile_m=128" emit --arch sm_90a --head-dim 192 --head-dim-v 128 --dtype bf16 --causal
expect 0 "head_dim_v=128" plan --arch sm_90a --shape 2,16,4096,192 --head-dim-v 128
expect 0 "mma_nc_f16" plan --arch sm_80 --shape 2,16,4096,192 --head-dim-v 128
expect 0 "split" plan --arch sm_90a --shape 2,16,4096,192 --head-dim-v 128 --splits 2
expect 2 "the backward does not take head_dim_v 128 with head_dim 192 yet" run --backward --shape 1,4,64,192 --head-dim-v 128
expect 2 "tile_m -16 is invalid: must be a multiple of 16 in 16..256" emit --tile-m -16
expect 2 "tile_n 0 is invalid" emit --tile-n=0
expect 2 "invalid value 'abc' for --tile-m: expected an integer" emit --tile-m abc
expect 2 "option --head-dim needs a value" emit --head-dim
expect 2 "invalid arch 'sm_1': expected sm_XY or sm_XYa" emit --arch sm_1
expect 2 "invalid value 'zigzag' for --swizzle: one of none, pad, xor" emit --swizzle zigzag
expect 2 "invalid value 'f64' for --dtype: one of f16, bf16" emit --dtype f64
expect 2 "warps 4 is not implemented for mma wgmma: 8, 12 or 16" emit --mma wgmma --warps 4
expect 0 "wgmma.mma_async" emit --mma wgmma --head-dim 128 --what ptx --arch sm_90a
expect 2 "invalid value '3' for --warps: expected 4 or 8 (wmma, mma; 2 for mma's head dims above 256) or 8, 12 or 16" emit --warps 3
expect 2 "warps 12 is not implemented" emit --mma mma --warps 12
expect 2 "over by" emit --head-dim 256 --tile-m 256 --tile-n 256 --warps 8 --softmax smem
expect 2 "softmax regs: tile_m 128 must be 16 x warps = 64" emit --softmax regs --tile-m 128 --warps 4
expect 2 "invalid value 'nothing' for --what" emit --what nothing
expect 2 "option --check takes no value" run --check=yes --shape 1,1,1,64
expect 2 "invalid value '1,8,x,64' for --shape: expected B,H,S,D" run --shape 1,8,x,64
expect 2 "invalid value '1,8,512' for --shape" run --shape 1,8,512
expect 2 "invalid value '1,8,0,64' for --shape" run --shape 1,8,0,64
expect 2 "--shape B,H,S,D is required" run
expect 2 "head_dim 7 is invalid" run --shape 1,8,512,7
expect 2 "heads_kv 3 does not divide heads_q 8" run --shape 1,8,512,64 --heads-kv 3
expect 2 "--head-dim 128 contradicts --shape's D = 64" run --shape 1,8,64,64 --head-dim 128
expect 2 "expected one of dir, ls, stats, clear, prune, prewarm, export, import (not 'bogus')" cache bogus
expect 2 "unexpected argument 'extra'" cache ls extra

# plan: what the library would launch, no GPU; refusals name value and limit.
expect 2 "invalid value '0' for --splits: expected auto or an integer in 1..256" plan --shape 1,32,1,128 --heads-kv 8 --splits 0
expect 2 "invalid value '300' for --splits" plan --shape 1,32,1,128 --splits 300
expect 2 "invalid value '5000' for --sms: expected an integer in 1..1024" plan --shape 1,8,1,64 --sms 5000
# The backward: its plan and kernels without a GPU, and what it does not take.
expect 0 "main=fj_bwd_attn_d64_m64_n128_w12_s2_xor_regs_wgmma" plan --backward --shape 2,8,300,64 --heads-kv 2 --causal
expect 0 "workspace_bytes=" plan --backward --shape 2,8,300,64 --window 16,0 --softcap 20
expect 0 "the main kernel of the library's backward" emit --backward --shape 1,4,128,64 --arch sm_80
expect 0 "direction=backward" emit --backward --shape 1,4,128,128 --causal --what resources
expect 2 "--backward emits the library's backward for --shape's problem: it takes no variant flags" emit --backward --tile-m 64
expect 0 "_wgmma_" plan --backward --shape 1,4,64,64 --score-mod 's * 2.f'
expect 0 "#line 1 \"score'\"" emit --backward --shape 1,4,64,64 --arch sm_80 --score-mod 's * s * 0.5f'
expect 0 "main=fj_bwd_attn_d64_m64_n128_w12_s2_xor_regs_wgmma_nc_f16_bm128x128_x" plan --backward --shape 1,4,128,64 --mask-mod 'q >= kv' --block-mask 128,128
expect 0 "main=fj_bwd_attn_d64_m64_n64_w8_s2_xor_regs_mma_nc_f16_bm64x64_x" plan --backward --shape 1,4,128,64 --mask-mod 'q >= kv' --block-mask 64,64
expect 0 "fj::qwalk_next(p, b, hk, n0, m_first" emit --backward --shape 1,4,128,64 --arch sm_80 --mask-mod 'q >= kv' --block-mask 64,128
expect 2 "the backward does not take paged K/V" emit --backward --shape 2,4,64,64 --page-size 16
expect 0 "_vl is the main kernel" emit --backward --shape 2,4,64,64 --varlen 10,20
expect 2 "the backward needs sm_80 or newer" plan --backward --shape 1,4,64,64 --arch sm_75
# run, tune and cache prewarm --backward: what they refuse is refused before
# any GPU is looked for, in one line naming the value and the limit.
BS="--backward --shape 1,4,128,64"
expect 2 "--backward runs the library's backward for --shape's problem: it takes no --tile-m" run $BS --tile-m 64
expect 2 "--backward runs the library's backward for --shape's problem: it takes no --mma" run $BS --mma wgmma
expect 2 "it takes no --sweep" run $BS --sweep
expect 2 "it takes no --jit-tiers" run $BS --jit-tiers
expect 2 "the backward does not take paged K/V" run --backward --shape 2,4,64,64 --page-size 16
expect 2 "the backward does not take kv_dtype e4m3: K and V in dtype f16" run $BS --kv-dtype e4m3
expect 2 "--check with --backward computes the float64 reference of every gradient on the host: B x H x Sq x Skv x D = 1073741824 is over 536870912 (about 10 s of one core); check a smaller --shape" run --backward --check --shape 1,8,1024,128
expect 2 "head_dim 264: the mma backward takes multiples of 8 up to 256" run --backward --shape 1,4,64,264
expect 2 "--backward does not apply with --show (it lists the database)" tune --show --backward
expect 2 "--backward applies only to cache prewarm" cache ls --backward
expect 2 "--backward prewarms the backward's kernels of the lists: it does not combine with --from-tune-db" cache prewarm --backward --from-tune-db
expect 2 "fj_cache_prewarm_bwd: 1 of 1 problems failed; the first, problems[0]: the backward needs sm_80 or newer (mma.sync); the target is sm_75" cache prewarm --backward --arch sm_75 --head-dim 64 --dtype f16 --causal none
expect 0 "(2.5 x the forward's FLOPs)" run --help
expect 0 "fj_tune_bwd" tune --help
expect 0 "fj_cache_prewarm_bwd" cache --help
expect 2 "invalid value '0' for --sms: expected an integer in 1..1024" plan --shape 1,8,1,64 --sms 0
expect 2 "splits 4: split-KV is implemented for mma mma (sm_80 and newer); the target sm_75 runs mma wmma" plan --shape 1,8,1,64 --arch sm_75 --splits 4
expect 2 "seq_kv 0 is invalid" plan --shape 1,8,1,64 --seq-kv 0
expect 2 "heads_kv 0 is invalid" plan --shape 1,8,1,64 --heads-kv 0
expect 2 "unknown option '--tile-m'" plan --shape 1,8,1,64 --tile-m 64
"$FJ" plan --shape 1,32,1,128 --heads-kv 8 --seq-kv 4096 >"$tmp/plan" || fail "plan decode"
for kv in "pack_gqa=1" "rows=4" "mma=mma" "sm_count=132" "combine=fj_combine_d128_f16"; do
  grep -qx "$kv" "$tmp/plan" || fail "decode plan lacks $kv: $(tr '\n' ' ' <"$tmp/plan")"
done
# The combine as the library names it: O's head dim (MLA's 576/512), sinks,
# and _c128 where its blocks take slices of 128 of O's columns (the grid's
# y): O wider than 128 and the row blocks fewer than the multiprocessors.
# MLA's long decode: 16 rows at 128 splits, a row a block, 16 blocks on 132.
MLA="--heads-kv 1 --head-dim-v 512 --latent --dtype bf16"
"$FJ" plan --shape 1,16,1,576 --seq-kv 32768 $MLA --splits 128 >"$tmp/mla" || fail "MLA plan"
grep -qx "combine=fj_combine_d512_bf16_c128" "$tmp/mla" && grep -qx "combine_grid=16,4,1" "$tmp/mla" \
  || fail "MLA plan: the combine is not d512's in 4 slices: $(tr '\n' ' ' <"$tmp/mla")"
# Batched with 2 splits: 64 x 16 rows, 4 a block (a warp a row), 256 blocks
# fill the GPU: one slice, the plain d512 combine.
"$FJ" plan --shape 64,16,1,576 --seq-kv 4096 $MLA --splits 2 >"$tmp/mla" || fail "batched MLA plan"
grep -qx "combine=fj_combine_d512_bf16" "$tmp/mla" && grep -qx "combine_grid=256,1,1" "$tmp/mla" \
  || fail "batched MLA plan: the combine is not d512's in one slice: $(tr '\n' ' ' <"$tmp/mla")"
# 32 rows, 8 blocks: in slices on 132 multiprocessors, one slice on 8.
"$FJ" plan --shape 2,16,1,576 --seq-kv 1000 $MLA --splits 3 | grep -qx "combine_grid=8,4,1" \
  || fail "MLA plan of 8 combine blocks on 132 multiprocessors: not in 4 slices"
"$FJ" plan --shape 2,16,1,576 --seq-kv 1000 $MLA --splits 3 --sms 8 >"$tmp/mla" || fail "MLA plan, 8 SMs"
grep -qx "combine=fj_combine_d512_bf16" "$tmp/mla" && grep -qx "combine_grid=8,1,1" "$tmp/mla" \
  || fail "MLA plan of 8 combine blocks on 8 multiprocessors: not one slice: $(tr '\n' ' ' <"$tmp/mla")"
"$FJ" plan --shape 2,32,1,128 --heads-kv 8 --seq-kv 8000 --dtype bf16 --splits 4 --sinks 0.5 \
  | grep -qx "combine=fj_combine_d128_bf16_sink" || fail "plan with sinks: the combine is not the _sink one"
splits=$(sed -n 's/^splits=//p' "$tmp/plan")
[ "${splits:-1}" -gt 1 ] && grep -qx "grid=$splits,8,1" "$tmp/plan" \
  && grep -qx "combine_grid=[0-9]*,1,1" "$tmp/plan" \
  && grep -qx "workspace_bytes=$((splits * 32 * 129 * 4))" "$tmp/plan" \
  || fail "decode plan: splits $splits, grids and workspace do not agree: $(tr '\n' ' ' <"$tmp/plan")"
# 8 heads on 16 multiprocessors: 2 splits, one block each (32 of the 64
# key tiles a block: a walk long enough for it, src/plan.c's split_search)
"$FJ" plan --shape 1,32,1,128 --heads-kv 8 --seq-kv 4096 --sms 16 | grep -qx "splits=2" \
  || fail "plan for 16 multiprocessors: $("$FJ" plan --shape 1,32,1,128 --heads-kv 8 --seq-kv 4096 --sms 16 | tr '\n' ' ')"
"$FJ" plan --shape 64,32,1,128 --heads-kv 8 --seq-kv 4096 --dtype bf16 >"$tmp/plan" || fail "plan batched decode"
grep -qx "splits=1" "$tmp/plan" && grep -qx "grid=1,8,64" "$tmp/plan" && grep -qx "workspace_bytes=0" "$tmp/plan" \
  || fail "batched decode plan: $(tr '\n' ' ' <"$tmp/plan")"
"$FJ" plan --shape 4,16,4096,128 | grep -qx "mma=wgmma" || fail "prefill plan is not wgmma"
"$FJ" plan --shape 2,8,100,64 --heads-kv 8 --splits 7 | grep -qx "grid=14,8,2" || fail "forced splits: grid"

# --varlen and --page-size: malformed lists and lengths over their bounds
# are refused before any GPU is looked for, naming the item and the limit.
VL="plan --shape 3,8,4096,128"
expect 2 "invalid value '17,,4096' for --varlen: item 2 ('') is not Q or Q:K (queries and keys of a sequence: integers 0..2147483647, digits only)" $VL --varlen 17,,4096
expect 2 "invalid value '' for --varlen: item 1 ('') is not Q or Q:K" $VL --varlen ""
expect 2 "item 1 ('') is not Q or Q:K" $VL --varlen ,1,2
expect 2 "item 3 ('') is not Q or Q:K" $VL --varlen 1,2,
expect 2 "item 1 ('x') is not Q or Q:K" $VL --varlen x,1,2
expect 2 "item 2 ('-1') is not Q or Q:K" $VL --varlen 1,-1,2
expect 2 "item 1 ('+1') is not Q or Q:K" $VL --varlen +1,1,2
expect 2 "item 2 (' 1') is not Q or Q:K" $VL --varlen "1, 1,2"
expect 2 "item 1 ('1 ') is not Q or Q:K" $VL --varlen "1 ,1,2"
expect 2 "item 1 ('1:') is not Q or Q:K" $VL --varlen 1:,1,2
expect 2 "item 1 (':1') is not Q or Q:K" $VL --varlen :1,1,2
expect 2 "item 1 ('1:2:3') is not Q or Q:K" $VL --varlen 1:2:3,1,2
expect 2 "item 3 ('1:-5') is not Q or Q:K" $VL --varlen 1,2,1:-5
expect 2 "item 1 ('99999999999') is not Q or Q:K" $VL --varlen 99999999999,1,2
expect 2 "invalid value '17,0' for --varlen: 2 items for --shape's B = 3 (one Q[:K] per sequence)" $VL --varlen 17,0
expect 2 "invalid value '1,2,3,4' for --varlen: 4 items for --shape's B = 3" $VL --varlen 1,2,3,4
expect 2 "invalid value '17,4097,1' for --varlen: item 2 has 4097 queries, more than --shape's S = 4096" $VL --varlen 17,4097,1
expect 2 "invalid value '1,1:200,1' for --varlen: item 2 has 200 keys, more than seq_kv = 100 (--seq-kv, default S)" $VL --seq-kv 100 --varlen 1,1:200,1
expect 2 "--layout does not apply with --varlen: its sequences are packed tokens (thd)" $VL --varlen 1,2,3 --layout bshd
expect 2 "page_size 0 is invalid: a power of two in 1..4096" plan --shape 2,8,100,64 --page-size 0
expect 2 "page_size 3 is invalid: a power of two in 1..4096" plan --shape 2,8,100,64 --page-size 3
expect 2 "page_size 8192 is invalid: a power of two in 1..4096" plan --shape 2,8,100,64 --varlen 1,100 --page-size 8192
expect 2 "invalid value 'x' for --page-size: expected an integer (a power of two in 1..4096)" plan --shape 2,8,100,64 --page-size x
expect 2 "page_size 3 is invalid: a power of two in 1..4096" run --shape 2,8,100,64 --page-size 3
expect 2 "invalid value '17,0,5120' for --varlen: item 3 has 5120 queries, more than --shape's S = 512" run --shape 3,8,512,64 --varlen 17,0,5120
expect 2 "item 2 ('a') is not Q or Q:K" run --shape 3,8,512,64 --varlen 1,a,3
expect 2 "page_size 3 is invalid: a power of two in 1..4096" emit --page-size 3
expect 2 "item 2 ('') is not Q or Q:K" emit --varlen 1,,2
expect 2 "varlen is implemented for mma mma only" emit --varlen 1 --mma wmma
expect 2 "unknown option '--varlen'" tune --shape 1,8,64,64 --varlen 64
"$FJ" $VL --varlen 17,0,4096 --causal >"$tmp/plan" || fail "plan varlen"
for kv in "varlen=1" "paged=0" "problem=3,8/8,4096/4096,128"; do
  grep -qx "$kv" "$tmp/plan" || fail "varlen plan lacks $kv: $(tr '\n' ' ' <"$tmp/plan")"
done
grep -q "^variant=fj_attn_.*_vl$" "$tmp/plan" && ! grep -q "^page_size=" "$tmp/plan" \
  || fail "varlen plan: variant or page_size: $(tr '\n' ' ' <"$tmp/plan")"
"$FJ" plan --shape 4,32,1,128 --heads-kv 8 --seq-kv 4096 --page-size 16 --varlen 1:4096,1:100,1:1,1:0 >"$tmp/plan" \
  || fail "plan paged decode"
for kv in "varlen=1" "paged=1" "page_size=16" "pack_gqa=1" "mma=mma"; do
  grep -qx "$kv" "$tmp/plan" || fail "paged plan lacks $kv: $(tr '\n' ' ' <"$tmp/plan")"
done
grep -q "^variant=fj_attn_.*_vl_paged$" "$tmp/plan" || fail "paged plan: variant is not _vl_paged: $(tr '\n' ' ' <"$tmp/plan")"
if ! grep -qx "splits=1" "$tmp/plan"; then
  grep -qx "combine=fj_combine_d128_f16_vl" "$tmp/plan" || fail "paged plan: combine is not the _vl one: $(tr '\n' ' ' <"$tmp/plan")"
fi
"$FJ" plan --shape 2,8,64,64 --page-size 16 | grep -qx "page_size=16" || fail "plan --page-size without --varlen"
"$FJ" plan --shape 2,8,64,64 | grep -qx "varlen=0" || fail "dense plan lacks varlen=0"
"$FJ" emit --varlen 17,0 >"$tmp/src" || fail "emit --varlen"
sed -n 1p "$tmp/src" | grep -q "^// flashjit generated kernel: fj_attn_.*_mma_.*_vl$" \
  && sed -n 2p "$tmp/src" | grep -q "^// variant: .* mma=mma .* varlen$" \
  || fail "emit --varlen: header: $(sed -n 1,2p "$tmp/src")"
"$FJ" emit --varlen 17,0 --page-size 16 --what resources | grep -q "^variant=fj_attn_.*_vl_paged$" \
  || fail "emit --varlen --page-size is not a paged variant"

# Score and mask modifications.  Malformed --window, --softcap and --param
# values are refused by the CLI before any GPU or compiler work, naming the
# value and what is allowed; names and expressions are the library's to
# refuse (fj_mods_check): exit 2 with its message.
MP="plan --shape 2,8,256,64"
W="expected LEFT,RIGHT: two integers, each -1 (unbounded) or 0..1073741824, digits only"
for w in 128 128,0,0 "" , 128, ,0 -2,0 0,-5 -0,0 +1,0 "1, 2" "1 ,2" x,0 0,1073741825 99999999999,0 1.5,0 0x10,0 --1,0 1,-1x; do
  expect 2 "invalid value '$w' for --window: $W" $MP --window "$w"
done
SC="expected a finite number above 0 (the cap, e.g. 30)"
for cap in 0 -30 -0.5 nan inf -inf 1e999 1e-50 abc 30x "" " 30" 0x; do
  expect 2 "invalid value '$cap' for --softcap: $SC" $MP --softcap "$cap"
done
PF="(expected NAME=VALUE, NAME:f32=VALUE, NAME:i32=VALUE, NAME:DTYPE[E0,...] or NAME:DTYPE[E0,...]@FILE; DTYPE f32, f16, bf16 or i32)"
refuse_param() { expect 2 "invalid value '$1' for --param: $2 $PF" $MP --param "$1"; }
I32="VALUE is not an i32 (digits, an optional '-', -2147483648..2147483647)"
F32="VALUE is not an f32 (a finite float32)"
EXT="the extents are not 1 to 4 integers in 1..2147483647"
refuse_param bias "no '=VALUE' or ':TYPE' after NAME"
for v in abc "" 2147483648 -2147483649 0x10 +1 " 1" 1x; do refuse_param "x=$v" "$I32"; done
for v in 1.5.2 1e999 .e 1.5f; do refuse_param "x=$v" "$F32"; done
for v in nan inf "" 1e39 abc; do refuse_param "x:f32=$v" "$F32"; done
refuse_param "x:i32=1.5" "$I32"
refuse_param "x:f64=1" "TYPE is not f32, f16, bf16 or i32"
refuse_param "x:=1" "TYPE is not f32, f16, bf16 or i32"
refuse_param "x:F16[8]" "TYPE is not f32, f16, bf16 or i32"
refuse_param "x:f16=1" "a scalar's TYPE is f32 or i32"
refuse_param "x:bf16=1" "a scalar's TYPE is f32 or i32"
refuse_param "x:f16" "no '=VALUE' or '[E0,...]' after TYPE"
refuse_param "x:f16[8,64" "no ']' after the extents"
for e in "[]" "[0]" "[8,,64]" "[,8]" "[8,]" "[1,2,3,4,5]" "[-1]" "[2147483648]" "[ 8]" "[8x]"; do
  refuse_param "x:f16$e" "$EXT"
done
refuse_param "x:f16[8]x" "after ']' comes nothing or @FILE"
refuse_param "x:f16[8]@" "after ']' comes nothing or @FILE"
refuse_param "x:f16[8]]" "after ']' comes nothing or @FILE"
head -c 1000 /dev/zero >"$tmp/bias.bin"
expect 2 "invalid value 'bias:f16[8,64]@$tmp/bias.bin' for --param: FILE '$tmp/bias.bin' has 1000 bytes; 8 x 64 f16 values take 1024 (raw, little-endian)" $MP --param "bias:f16[8,64]@$tmp/bias.bin"
expect 2 "FILE '$tmp/bias.bin' has 1000 bytes; 250 x 2 i32 values take 2000" $MP --param "d:i32[250,2]@$tmp/bias.bin"
expect 2 "invalid value 'b2:f32[8]@$tmp/none.bin' for --param: cannot read FILE '$tmp/none.bin': No such file or directory" $MP --param "b2:f32[8]@$tmp/none.bin"
expect 2 "FILE '$tmp' is not a regular file" $MP --param "b2:f32[8]@$tmp"
expect 2 "invalid value 'p8=8' for --param: more than 8 parameters (at most 8 --param)" $MP \
  --param p0=0 --param p1=1 --param p2=2 --param p3=3 --param p4=4 --param p5=5 --param p6=6 --param p7=7 --param p8=8
expect 2 "';' at column 2" $MP --score-mod 's;'
expect 2 "mods.score: ';' at column 2" emit --score-mod 's;'
expect 2 "';' at column 2" run --shape 1,8,128,64 --score-mod 's;'
expect 2 "mods.mask: ';' at column 8" $MP --mask-mod 'q >= kv; asm("trap")'
expect 2 "'nope' at column 5" $MP --score-mod 's + nope'
expect 2 "'bias' at column 1" $MP --score-mod 'bias + s' --param 'bias:f16[8,64]'
expect 2 "mods.params[1].name \"a\" is also params[0]'s" $MP --param a=1 --param a:f32=2
expect 2 "mods.params[0].name \"b\" is reserved" $MP --param b=1
expect 2 "mods.params[0].name \"1x\" is not a name" $MP --param 1x=1
expect 2 "mods.params[0].name \"\" is not a name" emit --param =1
expect 2 "mods.window_right 4 with causal top-left" $MP --causal --window 128,4
expect 2 "mods (window, softcap, score and mask expressions) are implemented for mma mma and mma wgmma; this variant is mma wmma" emit --mma wmma --softcap 30
expect 2 "invalid value '0' for --softcap" run --shape 1,8,128,64 --softcap 0
expect 2 "invalid value '1' for --window" emit --window 1
expect 2 "mods.window_right 4 with causal top-left" tune --shape 1,8,64,64 --causal --window 128,4
expect 2 "unknown option '--param'" lut --param x=1
expect 0 "--param" plan --help
expect 0 "NAME:DTYPE[E0,...]@FILE" run --help
expect 0 "LEFT,RIGHT" emit --help
"$FJ" plan --shape 2,8,64,64 | grep -qx "mods=none" || fail "plan without modifications lacks mods=none"
"$FJ" plan --shape 2,8,64,64 --window -1,-1 | grep -qx "mods=none" || fail "plan with modifications all off lacks mods=none"
"$FJ" plan --shape 1,8,4096,128 --causal --window 128,0 >"$tmp/plan" || fail "plan --window"
for kv in "mods=window" "window=128,0"; do
  grep -qx "$kv" "$tmp/plan" || fail "window plan lacks $kv: $(tr '\n' ' ' <"$tmp/plan")"
done
grep -q "^variant=fj_attn_.*_win$" "$tmp/plan" && ! grep -q "^softcap=" "$tmp/plan" \
  || fail "window plan: variant or softcap: $(tr '\n' ' ' <"$tmp/plan")"
"$FJ" plan --shape 1,8,4096,128 --softcap 30 >"$tmp/plan" || fail "plan --softcap"
for kv in "mods=softcap" "softcap=30"; do
  grep -qx "$kv" "$tmp/plan" || fail "softcap plan lacks $kv: $(tr '\n' ' ' <"$tmp/plan")"
done
grep -q "^variant=fj_attn_.*_cap$" "$tmp/plan" || fail "softcap plan: variant is not _cap: $(tr '\n' ' ' <"$tmp/plan")"
head -c 2048 /dev/zero >"$tmp/doc.bin"
"$FJ" plan --shape 2,8,512,64 --window 256,-1 --softcap 50.5 --score-mod 's + slope * (float)(kv - q)' --param slope=0.5 \
  --mask-mod 'doc(q) == doc(kv)' --param "doc:i32[512]@$tmp/doc.bin" --param n=7 >"$tmp/plan" || fail "plan with expressions"
for kv in "mods=window,softcap,score_mod,mask_mod,params" "window=256,-1" "softcap=50.5" \
  "score_mod=s + slope * (float)(kv - q)" "mask_mod=doc(q) == doc(kv)" "params=slope:f32:0,doc:i32:1,n:i32:0"; do
  grep -qxF "$kv" "$tmp/plan" || fail "expression plan lacks $kv: $(tr '\n' ' ' <"$tmp/plan")"
done
grep -q "^variant=fj_attn_.*_win_cap_x[0-9a-f]\{8\}$" "$tmp/plan" \
  || fail "expression plan: variant is not _win_cap_x...: $(tr '\n' ' ' <"$tmp/plan")"
"$FJ" plan --shape 2,8,64,64 --score-mod "$(printf 's\n+ 1.5f')" | grep -qxF 'score_mod=s\n+ 1.5f' \
  || fail "plan: a newline in an expression is not escaped: $("$FJ" plan --shape 2,8,64,64 --score-mod "$(printf 's\n+ 1.5f')")"
# emit: the variant built from the flags carries the modifications' form:
# the user's text after a #line naming it, a name with _x and the hash.
# A distance table's call (mods.lua's dg) is its own function's line, at
# its column; the expression, as its tree prints it, reads it as fj_dg.
XS='s + bias(h, q - kv + 8)'
for target in "--arch sm_90a" "--arch sm_80" "--arch sm_90a --mma wgmma --head-dim 128"; do
  "$FJ" emit $target --score-mod "$XS" --param 'bias:f16[8,64]' >"$tmp/src" 2>"$tmp/err" || fail "emit $target --score-mod: $(cat "$tmp/err")"
  sed -n 1p "$tmp/src" | grep -q "^// flashjit generated kernel: fj_attn_.*_x[0-9a-f]\{8\}$" \
    || fail "emit $target --score-mod: header: $(sed -n 1p "$tmp/src")"
  grep -A1 '^ *#line 1 "score"' "$tmp/src" | grep -v '^--$' | sed -n '2p;4p' >"$tmp/lines"
  printf '    bias(h, fj::iadd(fj::isub(q, kv), 8))\n(s + fj_dg)\n' | cmp -s - "$tmp/lines" \
    || fail "emit $target --score-mod: the call and the expression do not follow #line 1 \"score\": $(cat "$tmp/lines")"
  grep -qF "The user's expression: $XS" "$tmp/src" \
    || fail "emit $target --score-mod: the user's text is not in the comment"
done
name() { "$FJ" emit --what resources "$@" | sed -n 's/^variant=//p'; }
n1=$(name --score-mod "$XS" --param 'bias:f16[8,64]')
n2=$(name --score-mod "$XS" --param 'bias:f16[16,128]')
n3=$(name --score-mod "$XS" --param 'bias:f32[8,64]')
n4=$(name --score-mod "$XS " --param 'bias:f16[8,64]')
case "$n1" in fj_attn_*_x????????) ;; *) fail "emit --score-mod: variant '$n1' does not end in _x and the hash";; esac
[ -n "$n1" ] && [ "$n1" = "$n2" ] || fail "a tensor's extents changed the kernel: '$n1' vs '$n2'"
[ "$n1" != "$n3" ] && [ "$n1" != "$n4" ] || fail "a parameter's type or the expression's text did not change the kernel: '$n1' '$n3' '$n4'"
name --window 128,0 --softcap 30 | grep -q "^fj_attn_.*_win_cap$" || fail "emit --window --softcap: $(name --window 128,0 --softcap 30)"
[ "$(name --window 64,0)" = "$(name --window 4096,16)" ] || fail "the window's sizes changed the kernel"

# emit without variant flags shows the library's choice (what plan says
# and run would launch) for the problem, and says so; with them, the
# variant they describe.
for target in "" "--arch sm_80" "--arch sm_75" "--shape 1,32,1,128 --heads-kv 8 --seq-kv 4096" "--shape 4,8,1000,128 --dtype bf16 --causal"; do
  want=$("$FJ" plan $(echo "$target" | grep -q shape || echo "--shape 2,16,4096,64") $target | sed -n 's/^variant=//p')
  got=$("$FJ" emit --what name $target 2>"$tmp/err")
  [ -n "$want" ] && [ "$got" = "$want" ] || fail "emit $target: '$got', plan says '$want': $(cat "$tmp/err")"
done
"$FJ" emit --what resources --arch sm_80 | grep -qx "chosen=library" || fail "emit resources lack chosen=library"
"$FJ" emit --what resources --arch sm_80 | grep -qx "problem=2,16/16,4096/4096,64" || fail "emit resources lack the default problem"
"$FJ" emit --what resources --arch sm_80 --tile-m 64 | grep -qx "chosen=flags" || fail "emit --tile-m resources lack chosen=flags"
"$FJ" emit --arch sm_80 >/dev/null 2>"$tmp/err" && grep -q "is the library's choice for B,H/Hkv,S/Skv,D = 2,16/16,4096/4096,64 on sm_80" "$tmp/err" \
  || fail "emit does not say the source is the library's choice: $(cat "$tmp/err")"
# The tiered JIT's first kernel of the same choice, said as such.
[ "$("$FJ" emit --first --what name --arch sm_80)" = fj_simt_d64_nc_f16 ] || fail "emit --first --what name is not the first kernel's"
"$FJ" emit --first --arch sm_80 >"$tmp/src" 2>"$tmp/err" && grep -q "is the first kernel of the library's choice for B,H/Hkv,S/Skv,D = 2,16/16,4096/4096,64 on sm_80" "$tmp/err" \
  && grep -q "^// flashjit generated kernel: fj_simt_d64_nc_f16" "$tmp/src" || fail "emit --first: $(cat "$tmp/err")"

# Good input, no GPU needed.
expect 0 "" cache clear
"$FJ" emit --what resources >"$tmp/res" || fail "emit --what resources"
for key in registers shared_bytes spill_store_bytes spill_load_bytes local_bytes cubin_bytes compile_ms; do
  grep -q "^$key=[0-9.]*$" "$tmp/res" || fail "resources lack $key: $(cat "$tmp/res")"
done
grep -q "^cache=miss$" "$tmp/res" || fail "first emit is not a miss"
grep -q "^spill_store_bytes=0$" "$tmp/res" || fail "the default variant spills"
"$FJ" emit --what resources | grep -q "^cache=hit$" || fail "second emit is not a hit"
"$FJ" emit --head-dim 128 --dtype bf16 --causal --softmax smem --stages 1 --tile-m 64 --tile-n 64 --warps 4 --arch sm_80 | grep -q "^// flashjit generated kernel: fj_attn_d128_m64_n64_w4_s1_pad_smem_wmma_tl_bf16" \
  || fail "emit source lacks its header"
"$FJ" emit --mma wmma --what ptx --arch sm_90 | grep -q "wmma.mma.sync" || fail "PTX lacks wmma.mma"
"$FJ" emit --what ptx --arch sm_90 2>/dev/null | grep -q "mma.sync.aligned.m16n8k16" || fail "the library's choice for sm_90 is not the mma family"
"$FJ" emit --what cubin -o "$tmp/k.cubin" && head -c 4 "$tmp/k.cubin" | grep -q "ELF" || fail "cubin is no ELF file"
"$FJ" emit --what log | grep -q "ptxas info" || fail "log lacks ptxas lines"
"$FJ" lut --arch sm_90a --frag wmma_acc_f32 >"$tmp/lut" || fail "lut --arch"
grep -q "reference table" "$tmp/lut" && grep -q "^   5: ( 1, 2) ( 1, 3) ( 9, 2) ( 9, 3) ( 1,10) ( 1,11) ( 9,10) ( 9,11)$" "$tmp/lut" \
  || fail "lut lane 5 is not as expected: $(sed -n 3,8p "$tmp/lut")"
"$FJ" lut --arch sm_75 >"$tmp/lut75" || fail "lut --arch sm_75 fails"
grep -q "^fragment wmma_b_f16_row" "$tmp/lut75" && ! grep -q -e "^fragment mma_" -e "bf16" "$tmp/lut75" \
  || fail "lut --arch sm_75 should list the 4 f16 WMMA tables and skip the bf16 and mma ones"
expect 2 "fragment kind mma_a needs sm_80 or newer (bf16 fragments, mma.sync m16n8k16); the target is sm_75" lut --arch sm_75 --frag mma_a
expect 2 "unknown fragment kind 'nope'" lut --arch sm_90a --frag nope
"$FJ" cache dir | grep -qF "$FLASHJIT_CACHE_DIR" || fail "cache dir"
"$FJ" cache ls | grep -q "kernel .*fj_attn_d64" || fail "cache ls"
"$FJ" cache stats | grep -q "^kernels=[1-9]" || fail "cache stats: $("$FJ" cache stats)"
"$FJ" cache clear | grep -q "removed [1-9]" || fail "cache clear"
# cache ls says what is wrong with an invalid entry, and never blocks.
mkfifo "$FLASHJIT_CACHE_DIR/fifo.fjc" && printf 'not an entry at all, longer than a header is long..........................' >"$FLASHJIT_CACHE_DIR/junk.fjc" \
  && printf 'x' >"$FLASHJIT_CACHE_DIR/short.fjc" || fail "cannot make test entries"
timeout 20 "$FJ" cache ls >"$tmp/ls" 2>&1 || fail "cache ls with a FIFO: $(cat "$tmp/ls")"
grep -q "fifo.fjc .*(invalid: is not a regular file)" "$tmp/ls" && grep -qF "junk.fjc" "$tmp/ls" \
  && grep -qF "(invalid: is corrupt or stale (not a flashjit cache entry: bad magic))" "$tmp/ls" \
  && grep -qF "(invalid: is corrupt or stale (shorter than a header: truncated))" "$tmp/ls" \
  || fail "cache ls does not say what is wrong: $(cat "$tmp/ls")"
timeout 20 "$FJ" cache stats | grep -qx "invalid=3" || fail "cache stats: $("$FJ" cache stats)"
# prune removes the three unusable files and keeps a kernel that still hits.
"$FJ" emit --head-dim 64 --what resources >/dev/null 2>&1 || fail "emit before prune"
timeout 20 "$FJ" cache prune >"$tmp/prune" 2>&1 && grep -q "^removed 3 unusable entries (corrupt or stale) from " "$tmp/prune" \
  || fail "cache prune: $(cat "$tmp/prune")"
"$FJ" cache stats | grep -qx "invalid=0" && "$FJ" emit --head-dim 64 --what resources 2>/dev/null | grep -q "^cache=hit" \
  || fail "cache prune kept the wrong files: $("$FJ" cache ls)"
expect 2 "unexpected argument 'x'" cache prune x
"$FJ" cache clear >/dev/null

# cache prewarm, export and import: the library's picks for sm_90a at one
# head dim (three variants and a combine kernel, 2 compilers at once), then
# a pack moved into a fresh directory, where nothing is compiled again.
"$FJ" cache prewarm --arch sm_90a --head-dim 64 --dtype f16 --causal none --workers 2 >"$tmp/warm" 2>"$tmp/err" \
  && grep -qx "prewarm sm_90a: 3 variants, 4 kernels: 4 compiled, 0 already cached, 0 failed" "$tmp/warm" \
  && grep -q "^ok     fj_attn_d64_.*_gqa_split$" "$tmp/warm" && grep -q "prewarm: 3/3 compiled" "$tmp/err" \
  || fail "cache prewarm: $(cat "$tmp/warm" "$tmp/err")"
"$FJ" cache prewarm --arch sm_90a --head-dim 64 --dtype f16 --causal none 2>/dev/null \
  | grep -qx "prewarm sm_90a: 3 variants, 4 kernels: 0 compiled, 4 already cached, 0 failed" || fail "cache prewarm twice"
"$FJ" cache export "$tmp/fleet.fjpack" | grep -q "^exported 8 entries" || fail "cache export"
FLASHJIT_CACHE_DIR="$tmp/fresh" "$FJ" cache import "$tmp/fleet.fjpack" | grep -q ": 8 entries: 8 installed, 0 already there" \
  || fail "cache import"
FLASHJIT_CACHE_DIR="$tmp/fresh" "$FJ" cache prewarm --arch sm_90a --head-dim 64 --dtype f16 --causal none 2>/dev/null \
  | grep -qx "prewarm sm_90a: 3 variants, 4 kernels: 0 compiled, 4 already cached, 0 failed" || fail "prewarm after import compiled"
FLASHJIT_CACHE_DIR="$tmp/fresh" "$FJ" cache import "$tmp/fleet.fjpack" | grep -q ": 8 entries: 0 installed, 8 already there" \
  || fail "cache import twice"
# Refusals: nothing is installed from a damaged or foreign pack.
head -c 1000 "$tmp/fleet.fjpack" >"$tmp/cut.fjpack"
{ printf 'XXPACK01'; tail -c +9 "$tmp/fleet.fjpack"; } >"$tmp/magic.fjpack"
cp "$tmp/fleet.fjpack" "$tmp/nvrtc.fjpack"
printf '11.8\000\000\000\000\000\000\000\000\000\000\000\000' | dd of="$tmp/nvrtc.fjpack" bs=1 seek=16 conv=notrunc 2>/dev/null
cp "$tmp/fleet.fjpack" "$tmp/flip.fjpack"
printf 'Z' | dd of="$tmp/flip.fjpack" bs=1 seek=200 conv=notrunc 2>/dev/null
expect 2 "is truncated or damaged: its header says" cache import "$tmp/cut.fjpack" --cache-dir "$tmp/refused"
expect 2 "is not a flashjit cache pack (bad magic: expected 'FJPACK01')" cache import "$tmp/magic.fjpack" --cache-dir "$tmp/refused"
expect 2 "was exported by NVRTC 11.8 (pack format 1, cache format" cache import "$tmp/nvrtc.fjpack" --cache-dir "$tmp/refused"
expect 2 "entry 1 of 8, " cache import "$tmp/flip.fjpack" --cache-dir "$tmp/refused"
expect 2 "cannot be read (No such file or directory)" cache import "$tmp/none.fjpack" --cache-dir "$tmp/refused"
[ -z "$(ls "$tmp/refused")" ] || fail "a refused import installed $(ls "$tmp/refused")"
expect 2 "invalid value 'abc' for --head-dim (in '64,abc'): expected a comma-separated list of head dims in 1..256" cache prewarm --head-dim 64,abc
expect 2 "invalid arch 'sm9'" cache prewarm --arch sm9
expect 2 "cache export needs a FILE" cache export
expect 2 "--head-dim applies only to cache prewarm" cache import "$tmp/fleet.fjpack" --head-dim 64
"$FJ" cache clear >/dev/null

# cache prewarm --from-tune-db: the forward's entries of the arch; those
# with modifications (|mods=<hash>) and of classes a variant cannot hold (a
# head_dim_v) are skipped and counted -- their plain dense kernels are ones
# nobody asks for -- as are the backward's and another arch's, silently.
TD="$tmp/tunedb"
mkdir -p "$TD"
entry() {
  printf '"NVIDIA H200|%s|13000|d%s|f16|kv=f16|causal=%s|q=2^12|k=2^12|gqa=1%s": {"variant": {"tile_m": %s, "tile_n": 64, "warps": %s, "stages": 2, "swizzle": "xor", "softmax": "regs", "mma": "%s"}, "ms": 1.0, "default_ms": 1.25, "shape": "4,16/16,4096/4096,%s", "date": "2026-12-05T00:00:00Z"}' "$@"
}
{
  printf '{"format": 1, "entries": {'
  entry sm_90a 64 none "" 64 4 mma 64; printf ', '
  entry sm_90a 64 none "|mods=0123456789abcdef" 128 4 mma 64; printf ', '
  entry sm_90a 64 top-left "|mods=fedcba9876543210" 128 4 mma 64; printf ', '
  entry sm_90a 64 none "|bwd" 64 12 wgmma 64; printf ', '
  entry sm_90a 192 none "|dv=128" 128 12 wgmma 192; printf ', '
  entry sm_80 64 none "|mods=0123456789abcdef" 128 4 mma 64
  printf '}}\n'
} >"$TD/tune.json"
FLASHJIT_CACHE_DIR="$TD" "$FJ" cache prewarm --arch sm_90a --from-tune-db >"$tmp/warm" 2>"$tmp/err" \
  && grep -qx "ok     fj_attn_d64_m64_n64_w4_s2_xor_regs_mma_nc_f16" "$tmp/warm" \
  && grep -qx "prewarm sm_90a: 1 variants, 1 kernels: 1 compiled, 0 already cached, 0 failed" "$tmp/warm" \
  && grep -qx "2 entries with modifications skipped: their expressions are not in the database" "$tmp/warm" \
  && grep -qx "1 entries of classes a variant cannot hold skipped (a head_dim_v, or a key this flashjit does not read)" "$tmp/warm" \
  && [ "$(wc -l <"$tmp/warm")" = 4 ] \
  || fail "cache prewarm --from-tune-db: $(cat "$tmp/warm" "$tmp/err")"

# cache prewarm --backward: the backward's three kernels of each problem,
# with no GPU, into a fresh directory; emit --backward of a problem of the
# same kind then finds each of them there, and so does a machine that
# imports the directory's pack.
BW="$tmp/bwd-cache"
FLASHJIT_CACHE_DIR="$BW" "$FJ" cache prewarm --backward --arch sm_90a --head-dim 64 --dtype f16 --causal none,top-left --workers 2 >"$tmp/warm" 2>"$tmp/err" \
  && grep -qx "prewarm sm_90a (backward): 2 variants, 4 kernels: 4 compiled, 0 already cached, 0 failed" "$tmp/warm" \
  && grep -qx "ok     fj_bwd_pre_d64_f16 fj_bwd_attn_d64_m64_n128_w12_s2_xor_regs_wgmma_tl_f16 fj_bwd_post_d64_f16_tiled" "$tmp/warm" \
  && grep -q "prewarm: 2/2 compiled" "$tmp/err" \
  || fail "cache prewarm --backward: $(cat "$tmp/warm" "$tmp/err")"
FLASHJIT_CACHE_DIR="$BW" "$FJ" emit --backward --shape 1,4,128,64 --causal --what resources >"$tmp/res" 2>"$tmp/err" \
  && [ "$(grep -c '^cache=hit$' "$tmp/res")" = 3 ] \
  || fail "emit --backward after prewarm --backward: not a hit for each kernel: $(grep -e '^variant=' -e '^cache=' "$tmp/res" | tr '\n' ' ') $(cat "$tmp/err")"
FLASHJIT_CACHE_DIR="$BW" "$FJ" cache prewarm --backward --arch sm_90a --head-dim 64 --dtype f16 --causal none,top-left 2>/dev/null \
  | grep -qx "prewarm sm_90a (backward): 2 variants, 4 kernels: 0 compiled, 4 already cached, 0 failed" \
  || fail "cache prewarm --backward twice compiled again"
FLASHJIT_CACHE_DIR="$BW" "$FJ" cache export "$tmp/bwd.fjpack" >/dev/null \
  && FLASHJIT_CACHE_DIR="$tmp/bwd-fresh" "$FJ" cache import "$tmp/bwd.fjpack" >/dev/null \
  && [ "$(FLASHJIT_CACHE_DIR="$tmp/bwd-fresh" "$FJ" emit --backward --shape 2,8,64,64 --what resources 2>/dev/null | grep -c '^cache=hit$')" = 3 ] \
  || fail "the backward's kernels did not travel in an export pack"

# run: on a machine without a GPU it says so (exit 1); with one it runs.
if "$FJ" run --shape 1,2,64,64 >"$tmp/out" 2>"$tmp/err"; then
  grep -q "TFLOP/s" "$tmp/out" || fail "run printed no timing"
  for pg in "" "--page-size 16"; do
    "$FJ" run --shape 3,4,200,64 --heads-kv 2 --seq-kv 300 --varlen 17,0:5,200:300 $pg --causal=bottom-right --check >"$tmp/out" 2>&1 \
      && grep -q "varlen=17,0:5,200:300" "$tmp/out" && grep -q "check: .* -> PASS" "$tmp/out" \
      || fail "run --varlen $pg --check: $(cat "$tmp/out")"
  done
  # Modifications on the GPU, against the reference (host copies of the
  # parameters): a window, a softcap, an ALiBi-like bias from --seed, a
  # document mask read from a file (all one document) and a random one.
  head -c 1200 /dev/zero >"$tmp/doc.bin"
  for mods in "--window 64,0 --softcap 30" \
              "--causal --score-mod 's + bias(h, q - kv + 300)' --param 'bias:f32[4,600]'" \
              "--mask-mod 'doc(q) == doc(kv)' --param 'doc:i32[300]@$tmp/doc.bin' --window -1,32" \
              "--mask-mod 'doc(q) % 4 == doc(kv) % 4 || q == kv' --param 'doc:i32[300]' --score-mod 's * w' --param w=0.5 --seed 7" \
              "--mma mma --stages 2 --window 32,32 --softcap 30 --score-mod 's - slope(h) * (float)abs(q - kv)' --param 'slope:bf16[4]'" \
              "--mma wgmma --causal=bottom-right --window 40,-1 --score-mod 's + t' --param t=-0.25 --param 'u:f16[3,2,5,7]'"; do
    eval "\"\$FJ\" run --shape 2,4,300,64 $mods --check" >"$tmp/out" 2>&1 \
      && grep -q "check: .* -> PASS" "$tmp/out" || fail "run $mods --check: $(cat "$tmp/out")"
  done
  # The backward on the GPU, against the float64 reference (every
  # element): GQA with a causal mask; bottom-right with unequal lengths, a
  # window, a softcap and sinks (dsinks checked) in bf16 and BSHD; its tuner.
  for bw in "--shape 2,4,256,64 --heads-kv 2 --causal" \
            "--shape 1,4,200,128 --seq-kv 300 --causal=bottom-right --dtype bf16 --layout bshd --window 64,0 --softcap 30 --sinks 0.5" \
            "--shape 1,2,130,96"; do
    "$FJ" run --backward --check $bw >"$tmp/out" 2>&1 && grep -q "^backward: fj_bwd_attn_" "$tmp/out" \
      && grep -q "(2.5 x the forward's FLOPs)" "$tmp/out" && grep -q "check: .* -> PASS" "$tmp/out" \
      || fail "run --backward --check $bw: $(cat "$tmp/out")"
    case "$bw" in
      *--sinks*) grep -q " dsinks rel_err=" "$tmp/out" || fail "run --backward --check $bw: no dsinks: $(cat "$tmp/out")";;
    esac
  done
  "$FJ" tune --backward --shape 1,8,1024,64 --iters 3 --no-save >"$tmp/out" 2>&1 \
    && grep -q "^best:      fj_bwd_attn_" "$tmp/out" && grep -q "^candidates [23]: " "$tmp/out" \
    || fail "tune --backward: $(cat "$tmp/out")"
else
  grep -q "no NVIDIA driver\|no CUDA device\|CUDA" "$tmp/err" || fail "run without GPU: $(cat "$tmp/err")"
  echo "ok   flashjit run without a GPU -> $(cat "$tmp/err")"
  # run --backward and tune --backward fail as run does, with the same line.
  "$FJ" run --backward --check --shape 1,2,64,64 >"$tmp/out" 2>"$tmp/err_bwd"
  code=$?
  [ "$code" = 1 ] && cmp -s "$tmp/err" "$tmp/err_bwd" \
    || fail "run --backward without GPU: exit $code: $(cat "$tmp/err_bwd"), run says $(cat "$tmp/err")"
  echo "ok   flashjit run --backward without a GPU -> $code"
  "$FJ" tune --shape 1,2,64,64 >"$tmp/out" 2>"$tmp/err"
  "$FJ" tune --backward --shape 1,2,64,64 >"$tmp/out" 2>"$tmp/err_bwd"
  code=$?
  [ "$code" = 1 ] && [ "$(wc -l <"$tmp/err_bwd")" = 1 ] && cmp -s "$tmp/err" "$tmp/err_bwd" \
    && grep -q "^flashjit tune: .*\(no NVIDIA driver\|no CUDA device\|CUDA\)" "$tmp/err_bwd" \
    || fail "tune --backward without GPU: exit $code: $(cat "$tmp/err_bwd"), tune says $(cat "$tmp/err")"
  echo "ok   flashjit tune --backward without a GPU -> $code"
fi

[ "$fails" = 0 ] && echo "cli: all passed" || echo "cli: $fails failed"
[ "$fails" = 0 ]
