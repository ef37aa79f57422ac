#!/bin/bash
# pending.sh PART OUTDIR -- what sessions without (enough) GPU time built
# and prepared, to run on the next device calls, each part within one
# call's ten minutes; from the repository root with build/ carried
# (bench/device_check.sh's conventions: logs to OUTDIR).  e, a, p and g
# ran on the H200 on 2026-12-05 (docs/PERF.md C22, C23, G1); the twelfth
# session's d (the backward's next step) and b (the FP8 ring's k16 and
# regs sets) ran there too and landed (5f6597c, cf46ccd; PERF.md C24).
# The thirteenth session ran h, m, f and b on the H100 (PERF.md C25;
# perf-history's session-13 entry): m and b landed (9bfa652, 966bfc6), f
# missed (as the fourth session's same idea had).  The fourteenth session
# had no device; it added l, and rebased the branches split504 and bwdrot
# onto its main (both build, no spills; their CPU tests pass).  The
# fifteenth got H100 calls only (its H200 calls were refused): l's C part
# ran (PERF.md's P1 row: 95/95, 43/43) with the cluster pair; s15b.sh
# (P2: the wide kernel's checked calls, the fixed pair 0.89-0.92 of the
# 64-key kernel's time, widepipe slower).  l's Python part did not run.
# The sixteenth got the H100 only (the H200 refused): main's backward
# (48eb736) passed every GPU test and check (PERF.md C26), l's Python part
# 36 of 38 (two stale tests, fixed in cb8c394, not rerun); branches fdpw
# and fdpwl (bench/probes/s16.sh; perf-history's session-16 entry) were
# A/B'd there: d256 2.5-3.6% faster, FP8 d128 +-1.5%, short causal 1-1.5%
# slower, not landed.
# The seventeenth got H100s only (every call named nvidia-h200): bwdrows
# and fdpwl passed their checks and tests and A/B'd 0.6-3.5% faster, and
# landed (PERF.md C27; perf-history's seventeenth-session entry), the
# package's training tests passed; ncu put FP8's _vt pass at 4.7-7% of an
# FP8 call.
# The carries (each under 64 MB together, build/ slimmed to ~20 MB: no
# CMakeFiles, *.a, tests/consumer or caches): build-X/templates from
# `git archive X templates | tar -x -C build-X`; build-X/ a slimmed build
# of branch X where its host differs.
# The eighteenth got H100s only (two calls; then none could be
# started): branch vtin (FP8's V transposed inside the kernel) was lost
# with the checkout -- only main survives a session -- and is not rebuilt;
# its faster _vt pass was rebuilt as vtfast and landed with the
# deterministic backward's rotation (part r: bwdrot2) after their checks
# (PERF.md C28; perf-history's eighteenth-session entry).
# The nineteenth got four H100 calls (no H200; failed starts and the
# idle machine spent the rest): fp8wide.patch (widened to key tiles of
# 128-256 in steps of 32) passed its checks and tests there and landed
# with the wider tiles as the library's FP8 choice (PERF.md F4, C29).
# The twentieth ran all of s19.sh (fp8chk and fp8mods on an H100; fp8,
# bwd, short, shorttune and comb on the H200: PERF.md F5, T12, H4, C30,
# C31).  The twenty-first ran comb's conditional commit on an H100 (its
# tests passed; single MLA decodes 0.92-0.98 of main's time, batched
# ones equal) and landed it (6fbfb77; PERF.md L3, C32); its bench/probes/
# s21.sh's det (the deterministic mode on the d256 pair, landed in
# 228cbf4: T13, C33) and nvrtc (J8) ran on an H100.  The twenty-second
# ran s21.sh's trainmods and det on an H100 (the pair's test passed: C34),
# then bench/probes/s22.sh (fwdsparse, pytrain, bwdpre, bwddoc, pyquick;
# issue 33's table on the H200 at 00da432: PERF.md R2-R4; R5's sweeps;
# tin: fj_variant.table_inside on an H100, J10, C36).  The twenty-third
# got H100s only: bench/probes/s23.sh's det (the wide kernel's
# deterministic turns passed late, the rotation on it, the pair's relaxed
# arrival: landed as 7b7c2b9, PERF.md T14, C37) and detncu; its
# 0e79c13 (the backward's table_inside) ran on no GPU.  The twenty-fourth
# got H100s only: s23.sh's bwdtin and tiers (PERF.md R6, J13, C38),
# sendearly (landed: 518bcca, 1ccfc48; T15) and narrowlate (missed),
# bench/probes/s24.sh's host (3e45dd1: R7), bwd, detab, detrt and train
# (R6).  The twenty-fifth got one H100 call (every later start failed
# and spent the rest): s25.sh's unrun (the twenty-fourth's unrun commits:
# gpu_backward_param_grads_sets 4/4, gpu_backward_param_grads 15/15,
# gpu_backward_mods 43/43, gpu_cli with run --backward --deterministic,
# the package's tests 151 OK); its d05de29 (the narrow wgmma backward
# converting dQ in its main kernel, off by default) ran on no GPU.  The
# twenty-sixth got H100 calls only: s25.sh's fuse (gpu_backward_fused 26
# ok at 144c8eb and 98eee77, gpu_backward 101 ok; the conversion 1.06-
# 1.24x slower than the postprocess: PERF.md T16, C40; off by default).
# The twenty-seventh removed the conversion (its own work cost 340-490
# us in the main kernel against the postprocess's 64: PERF.md T16), and
# s26.sh's fuseparts with it, unrun; on H100s (PERF.md C41, C42, R8) it
# ran s26.sh's py, gpu_backward whole (the padded head dims: pad's
# first half), bench/probes/s27.sh's detpg (the deterministic parameter
# gradients) and the deterministic block-mask tests; gpu_tune_split
# failed (mma candidates offered for split dims; fixed after, unrun).
# The twenty-eighth got four H200 calls at its start (then every start
# failed or was refused): s28.sh's bwd (the --quick table), train
# (issue 33's table: PERF.md R9), check (s27.sh's tune part,
# gpu_backward, gpu_backward_block_mask_deterministic: C43) and the full
# backward sweep (T17: every head dim at its speed bar; the deterministic
# mode's misses at d96, d192 and GQA).  Branch gqadet (the deterministic
# mode's descending walk under GQA, FLASHJIT_BWD_DESCEND=1, off; built
# by a helper, its CPU tests pass) did not run.
# The twenty-ninth got three H100 calls (both that named the H200 got
# an H100 or none; two failed starts spent 330 s): s28b.sh's gqcheck and
# gqtime (the descending walk right, 1.30x the default where the plain
# order took 2.27x: landed on by default, PERF.md T18), s29.sh's det,
# mha (the walk without GQA: slower, dropped), gqa and gpt (the example's
# new checks).  Unrun: s29.sh's f16 (H200 only), prof and gap.
# The thirtieth got five H100 calls (each named nvidia-h200 and got an
# H100; failed or refused starts spent 676 s): qkvviews ran and landed (5f384ca;
# PERF.md Q1, C44), defer.patch missed (slower at every head dim; kept
# as the record), s29.sh's gqa and gpt (T19, G2: the GPT step 1.02-1.06x
# SDPA's interleaved), gpu_backward_deterministic whole (100 ok).
# The thirty-first got no machine (every start failed or was refused:
# 1606 of 1800 s); it split the package (_args.py, _train.py), refused
# the backward's sizes past its 32-bit counts and fixed the review's
# concurrency findings, none of it run on a GPU.
# The thirty-second got one H100 for five calls (three calls before got
# no machine: 286 s): s31a.sh's gptc, py, tc and prof (f16 skipped: not an
# H200; PERF.md G3, T20, R10), then ctest -L gpu whole (72: every one
# passed or skipped, on the library of 9a02db3) and the package's tests
# whole (318 OK).  turnclock.patch's wide-kernel walk clocks were
# unbalanced there (fixed since: one start a finishing lane).
# Next, first: bash bench/probes/s32a.sh $OUT with build/ and build-tc/
# carried (the fp16 sweep on an H200, gpt_attn_prof.py: the GPT
# example's attention call alone, kernels against host time,
# train_prof.py's host ops for the documents case's gap, turnclock.sh
# with d192/d256 counted; then S32A_PARTS=gptc: gpt_train.py --compile
# on the H200); or, the older plan: S29_PARTS="f16 gqa gap prof" bash
# bench/probes/s29.sh (the bar's fp16 half, the GQA deterministic ratio
# there, where the harness's autograd backward spends 380-480 us more
# than the op: issue 33's full and causal rows) -- or, where one call is
# all there is, bash bench/probes/s30c.sh (the fp16 sweep on an H200, the
# GQA rows, the GPT step twice eagerly and once under torch.compile, with
# gpt_train.py's steps alternating one by one); then, on any GPU,
# bench/probes/turnclock.sh with build-tc/ (turnclock.patch's build,
# slimmed: its header says how) carried: the share of the deterministic
# backward's main loop spent spinning in dQ's turn waits, per head dim
# and mask (d96/d128 without a mask spill 8 bytes when instrumented),
# before anything more is tried on the deterministic bars; then, as
# before (s24.sh's bwd and train ran as T17 and R9):
# S23_PARTS=det bash bench/probes/s23.sh (T14's figures there, with
# the templates of 6f2a9f7 as build/tmpl-old), then the backward's whole
# table (s19.sh's bwd: T12 again, d256's default since the relaxed
# arrival); then, as the twenty-second left it, on the H200:
# S22_PARTS=tin bash bench/probes/s22.sh (the bias table's first call on
# the H200's host: the bar) and issue 33's whole table (trainmods);
# s21.sh's det (T13's figure there); every GPU test's float64
# reference now runs on the host's cores (7da8553): the tests that ended
# at their bounds (serving_decode, serving_varlen, fp8_kv,
# backward_deterministic) may now finish;
# then s19.sh's shortn
# (the short cells below 1 beside 128-key tiles); s17.sh's cmp (the backward's ratio with bwdrows and the rotation), the
# forward sweep (`PARTS=bench`), the FP8 KV ratios at d80/d96 (`PARTS=fp8kv
# bash bench/device_check.sh`); then a, j, s and c as below.
#   l: the gradient through the returned log-sum-exp (fj_problem.dlse,
#      the fourteenth session's, which had no device): gpu_backward (its
#      six dlse cases: d64, d128 with sinks and rows that see no key,
#      d256 softcap, varlen, NaN dlse at rows that see no key; and head
#      dims 80, 112, 144, 240, which the wgmma backward plans but no test
#      had run) and the package's
#      test_gpu.Backward (test_lse_in_the_loss, test_parts_merged: two
#      calls over parts of the keys merged by flashjit.merge, whose
#      backward is new too) and test_ring (the ring with dlse); the
#      backward of varlen with expressions (gpu_backward_mods' varlen
#      cases, test_train_varlen.VarlenBackward.test_expressions);
#   a: the GPU tests of what landed unrun -- head dims padded to 16 on the
#      mma family (gpu_wide_heads, gpu_serving_varlen, gpu_mla_paged),
#      FP8 K/V (gpu_fp8_kv, with the regs path's new "split keys" cases),
#      the tiered JIT (gpu_jit_tiers: with 0ddf2ff's defaults -- on in
#      fj_ctx_opts_init, deterministic problems waiting, fj_ctx_tiers_wait
#      -- and the demo, whose first calls now take the first kernel);
#   b: the FP8 ring's sets (bench/probes/fp8_ring_next.sh; regs_widths
#      ran on the H100 and landed as 966bfc6: its patch is gone);
#   f: bench/probes/fp8_poly.sh: fp8_poly.patch (one exponential in k on
#      the FMA pipe, FP8 at head dims up to 128) -- the FP8 tests with
#      k = 4 (set w4: also 16-bit head dims up to 64), then the medians
#      of the FP8 forward and the bf16 d64 forward, the tree and each set;
#      where it wins, `PARTS=fp8 bash bench/device_check.sh` with the
#      winner's templates for the ratio against cuDNN's FP8;
#   h: one call's worth of each kernel family's GPU tests, for the H100
#      (nvidia-h100-x1), which has not run any kernel change since the
#      eighth session: the backward (wgmma and mma), the FP8 forward, out
#      and KV caches, the wgmma forward's axes, wide heads, the tiered JIT;
#      each test bounded (a test cut short by its bound says so: exit 124);
#   c: bench/probes/s10_probe.sh (single-decode kernel times by ncu, the
#      d128 backward under ncu's full set, the short shapes' tuner);
#   e: the eleventh session's FP8 output and scales: gpu_fp8_out (f16 and
#      e4m3 O, the amax), gpu_fp8_needle (one key at 1k..128k of 131072),
#      gpu_fp8_forward (with its per-tensor descale cases and d64, d192),
#      compute-sanitizer on one e4m3-O call (memcheck, racecheck);
#   p: the package's tests of all that (training, FP8), then
#      examples/gpt_train.py's step beside SDPA;
#   g: the GPT step's shapes tuned: its backward at (8, 8/2, 512, 64)
#      bf16 causal plans wgmma's 4 x 2 x 8 = 64 blocks on 132
#      multiprocessors (the wgmma backward runs 12 warps, 128-key tiles
#      only); the tuner times the mma family's 64-key tiles (128 blocks)
#      beside it.  The step before, the tuner's reports, the step after.
set -u
part=${1:?part a, b, c, e, f, h, j, l, p, r, s or g}
out=${2:-/tmp/fj-pending}
mkdir -p "$out"
. bench/device_env.sh
case $part in
l)
  for tb in gpu_backward:200 gpu_backward_mods:150; do
    t=${tb%%:*}
    timeout ${tb##*:} ./tests/fj_tests "$t" >"$out/l_$t.log" 2>&1
    echo "l $t: exit $? ($(grep -c '^ok' "$out/l_$t.log") ok, $(grep -c '^FAIL' "$out/l_$t.log") FAIL)"
    grep -E "^FAIL| dlse| varlen" "$out/l_$t.log" | head -8
  done
  (cd /work/main/python/tests && PYTHONPATH=.. FLASHJIT_LIB=/work/main/build/libflashjit.so timeout 200 \
    python3 -m unittest -v test_gpu.Backward test_ring test_train_varlen.VarlenBackward) \
    >"$out/l_python.log" 2>&1
  echo "l python: exit $? ($(grep -E '^Ran [0-9]+ tests' "$out/l_python.log" | tail -1); $(grep -cE '\.\.\. ok$' "$out/l_python.log") ok)"
  grep -E "^(FAIL|ERROR):|Error" "$out/l_python.log" | head -6
  ;;
a)
  for t in gpu_wide_heads gpu_threads_workspace gpu_serving_varlen gpu_mla_paged gpu_fp8_kv gpu_jit_tiers; do
    timeout 110 ./tests/fj_tests "$t" >"$out/a_$t.log" 2>&1
    echo "a $t: exit $? ($(grep -c ' ok$' "$out/a_$t.log") ok, $(grep -c FAIL "$out/a_$t.log") FAIL)"
    grep -E "FAIL|error" "$out/a_$t.log" | head -5
  done
  timeout 120 ./flashjit-demo >"$out/a_demo.log" 2>&1
  echo "a demo: exit $?; $(grep -cE 'PASS$' "$out/a_demo.log") PASS, $(tail -1 "$out/a_demo.log")"
  ;;
b) NEXT_SETS=${NEXT_SETS-} NEXT_TEST_TIMEOUT=${NEXT_TEST_TIMEOUT:-120} NEXT_SWEEP=${NEXT_SWEEP:-0} \
     NEXT_TESTS=${NEXT_TESTS-gpu_fp8_kv gpu_fp8_kv_paged} timeout 560 bash ../bench/probes/fp8_ring_next.sh "$out" ;;
c) timeout 560 bash ../bench/probes/s10_probe.sh "$out" ;;
h)
  nvidia-smi --query-gpu=name --format=csv,noheader | sed 's/^/h gpu: /'
  for tb in gpu_backward:110 gpu_backward_deterministic:150 gpu_fp8_forward:60 gpu_fp8_out:40 \
            gpu_fp8_kv:60 gpu_wgmma_axes:60 gpu_wide_heads:60 gpu_jit_tiers:80; do
    t=${tb%%:*}
    timeout ${tb##*:} ./tests/fj_tests "$t" >"$out/h_$t.log" 2>&1
    echo "h $t: exit $? ($(grep -c ' ok$\|^ok ' "$out/h_$t.log") ok, $(grep -c FAIL "$out/h_$t.log") FAIL)"
    grep -E "^FAIL|FAIL$" "$out/h_$t.log" | head -4
  done
  ;;
j) # issue 36: why the GPU host compiled slower than the 2-core machine
   # (PERF.md J7: whole processes, 0.74-1.66 s against 0.46-0.82): the
   # host's CPU, NVRTC alone on the twenty picks rendered on the build
   # machine (build/bench/srcs, /tmp/pick_sources there; the same files
   # timed there: perf-history's session-13 entry), the library's own
   # compile_ms beside the process's wall time, and a bare kernel's
   # compile (NVRTC's start-up).  Build machine first:
   #   cc -O2 bench/nvrtc_time.c -I/usr/local/cuda/include -L/usr/local/cuda/lib64 \
   #      -lnvrtc -Wl,-rpath,/usr/local/cuda/lib64 -o build/bench/nvrtc_time
   #   mkdir build/bench/srcs && FLASHJIT_CACHE_DIR=/tmp/ps /tmp/pick_sources build/bench/srcs
  lscpu | grep -E 'Model name|^CPU\(s\)|MHz|Thread' | sed 's/^/j cpu: /'
  nproc | sed 's/^/j nproc: /'; uptime | sed 's/^/j load: /'
  printf '__global__ void k(float *x) { x[threadIdx.x] += 1.f; }\n' >/tmp/bare.cu
  ./bench/nvrtc_time -n 5 --phases /tmp/bare.cu -default-device -std=c++17 --no-cache \
    --gpu-architecture=sm_90a 2>&1 | tail -1 | sed 's/^/j bare: /'
  NVRTC_TIME=$PWD/bench/nvrtc_time timeout 400 bash ../bench/compile_cost.sh bench/srcs 3 | tee "$out/j_phases.md"
  for d in 64 128 256; do for c in "" --causal; do
    t0=$EPOCHREALTIME
    ms=$(FLASHJIT_CACHE_DIR=$(mktemp -d) ./flashjit emit --arch sm_90a --head-dim $d $c --what resources |
         grep -E '^compile_ms' | cut -d= -f2)
    echo "j emit d$d$c: process $(awk "BEGIN{printf \"%.0f\", ($EPOCHREALTIME - $t0) * 1000}") ms, compile_ms $ms"
  done; done
  ;;
s) # the split decode's combine found by O's head dim (f720fcf): with the
   # branch split504's build carried as build/ (576/504 and 520/264 taken
   # again, their cases restored: 576/504 after 576/512 in one context)
  for t in gpu_wide_heads gpu_mla_paged; do
    timeout 150 ./tests/fj_tests "$t" >"$out/s_$t.log" 2>&1
    echo "s $t: exit $? ($(grep -c ' ok$\|^ok ' "$out/s_$t.log") ok, $(grep -c FAIL "$out/s_$t.log") FAIL)"
    grep -E "FAIL|576/504|72/40" "$out/s_$t.log" | head -6
  done
  ;;
r) # the deterministic backward's rotation (landed: main's build)
  timeout 560 bash ../bench/probes/bwd_rot.sh "$out" ;;
f) timeout 560 bash ../bench/probes/fp8_poly.sh "$out" ;;
e)
  for t in gpu_fp8_out gpu_fp8_needle gpu_fp8_forward; do
    timeout 140 ./tests/fj_tests "$t" >"$out/e_$t.log" 2>&1
    echo "e $t: exit $? ($(grep -c ' ok$' "$out/e_$t.log") ok, $(grep -c FAIL "$out/e_$t.log") FAIL)"
    grep -E "FAIL|error|fp8 out" "$out/e_$t.log" | head -8
  done
  for tool in memcheck racecheck; do
    timeout 70 compute-sanitizer --tool $tool ./flashjit run --shape 1,4,300,128 --seq-kv 333 --dtype e4m3 \
      --o-dtype e4m3 --o-scale 8 --causal=bottom-right --check --iters 1 --warmup 0 >"$out/e_$tool.log" 2>&1
    echo "e $tool: exit $?; $(grep -E 'ERROR SUMMARY|^check|^amax' "$out/e_$tool.log" | tr '\n' '|')"
  done
  ;;
p) # the package's tests of what landed unrun: the training path through
   # _Train (its backward now takes the forward's options), FP8's O, amax,
   # per-tensor descales, d64/d192 and tune; then examples/gpt_train.py's
   # step beside SDPA.
  (cd /work/main/python/tests && PYTHONPATH=/work/main/python FLASHJIT_LIB=/work/main/build/libflashjit.so \
    TORCHINDUCTOR_CACHE_DIR=/tmp/fj-inductor timeout 330 python3 -m unittest -v test_train test_train_varlen \
    test_calls test_gpu.Fp8 test_serving.KvCache.test_fp8_cache_per_tensor test_serving.KvCache.test_fp8_cache) \
    >"$out/p_python.log" 2>&1
  echo "p python: exit $? ($(grep -E '^Ran [0-9]+ tests' "$out/p_python.log" | tail -1); $(grep -cE '\.\.\. ok$' "$out/p_python.log") ok)"
  grep -E "^(FAIL|ERROR):" "$out/p_python.log" | head -8
  (cd /work/main && PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout 200 \
    python3 examples/gpt_train.py --steps 300) >"$out/p_gpt.log" 2>&1
  echo "p gpt_train: exit $?; $(grep -E 'median step|max \|loss|PASS|FAIL' "$out/p_gpt.log" | tr '\n' '|')"
  ;;
g)
  gpt() {
    (cd /work/main && PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so timeout 150 \
      python3 examples/gpt_train.py --steps 200) >"$out/g_gpt_$1.log" 2>&1
    echo "g gpt $1: exit $?; $(grep -E 'median step|PASS|FAIL' "$out/g_gpt_$1.log" | tr '\n' '|')"
  }
  gpt before
  for dir in "--backward" ""; do
    timeout 120 ./flashjit tune $dir --shape 8,8,512,64 --heads-kv 2 --causal --dtype bf16 \
      >"$out/g_tune${dir:+_bwd}.log" 2>&1
    echo "g tune $dir: exit $?; $(tail -4 "$out/g_tune${dir:+_bwd}.log" | tr '\n' '|')"
  done
  gpt after
  ;;
*) echo "pending.sh: part $part is not a, b, c, e, f, h, j, p, r, s or g"; exit 2 ;;
esac
