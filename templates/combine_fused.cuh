{#
  combine_fused.cuh: split-KV's combine inside the split kernel (the mma
  family; the host's rule is plan.h's fj__plan_fused).  Where the host
  passes p.work -- one 32-bit counter a row tile, each 0 before the launch
  -- every block counts itself done with its row tile once its partial
  rows are written (the epilogue's out.f32, all threads), and the block
  that counts last merges the tile's rows as combine.cu does:
    lse = log(sum_s exp(lse_s))        (max first: no overflow)
    O   = sum_s exp(lse_s - lse) O_s   splits in order; a range that saw
                                       no key (lse_s = -inf) adds nothing
  then puts the counter back to 0 for the next launch.  The fences order
  each block's partials before its count, and the last block's reads
  after it; the partials come into shared memory by cp.async (16 bytes,
  through L2: other multiprocessors wrote them) while each warp finds its
  rows' log-sum-exps, then each warp sums its rows, a column a lane.  The
  bits are those of combine.cu's kernel where it gives a row one warp
  (combine_warps 1: 4 or fewer splits); with more it adds the splits in
  another grouping.
  Contract: runs last in the kernel, every thread of every block arriving
  (none returned before it); the kernel's dynamic shared memory `smem`
  holds the tile's splits x rows x (DV + 1) floats and nothing in it is
  needed any more; DV % 4 == 0; stages > 1 (cp.async).
  Parameters: BM (the tile's rows), W (warps), THREADS, DV (O's columns,
  a partial row's floats); rows_end (C int: where the kernel's rows end:
  a varlen sequence's own); row0 (C, or nil: a varlen sequence's first
  row of O, where its rows start);
  flat(r), head(r), pos(r) (Lua: C expressions of a row r -- its index in
  [batch][heads_q][seq_q], its query head, its query position).
#}
{% local PER = (DV + 31) // 32 %}
{% local GUARD = DV % 32 ~= 0 and ("lane + 32 * i < %d"):format(DV) or nil %}
  if (p.work) {
    unsigned *const count = p.work + ((long long)blockIdx.z * gridDim.y + blockIdx.y) * (gridDim.x / p.splits) + blockIdx.x / p.splits;
    __threadfence();  // this thread's partials, before the count
    __syncthreads();
    if (!__syncthreads_or(threadIdx.x == 0 && atomicAdd(count, 1u) == (unsigned)p.splits - 1)) return;
    __threadfence();  // the other blocks' partials, after it
    const int nr = min({{ BM }}, {{ rows_end }} - m0), ns = p.splits;
    const long long rows = (long long)p.batch * p.heads_q * p.seq_q;
    float *const x = reinterpret_cast<float *>(smem);  // [row][split][{{ DV }}]
    float *const w = x + nr * ns * {{ DV }};            // [row][split]
    for (int c = threadIdx.x; c < nr * ns * {{ DV // 4 }}; c += {{ THREADS }}) {
      const int j = c % {{ DV // 4 }}, rs = c / {{ DV // 4 }}, s = rs % ns, r = m0 + rs / ns;
      fj::cp_async16(x + 4 * c, p.o_part + (s * rows + {{ flat("r") }}) * {{ DV }} + 4 * j, 16);
    }
    fj::cp_async_commit();
    // A warp a row: the splits' log-sum-exps (a lane each), the row's, and
    // each split's weight.
    for (int t = warp; t < nr; t += {{ W }}) {
      const int r = m0 + t;
      const long long f = {{ flat("r") }};
      float mx = FJ_NEG_INF;
      for (int s = lane; s < ns; s += 32) {
        w[t * ns + s] = __ldcg(p.lse_part + s * rows + f);
        mx = fmaxf(mx, w[t * ns + s]);
      }
      mx = fj::warp_max(mx);
      float sum = 0.f;
      if (mx != FJ_NEG_INF)
        for (int s = lane; s < ns; s += 32) sum += expf(w[t * ns + s] - mx);
      sum = fj::warp_sum(sum);
      const float lse = sum > 0.f ? mx + logf(sum) : FJ_NEG_INF;
      for (int s = lane; s < ns; s += 32)
        w[t * ns + s] = w[t * ns + s] == FJ_NEG_INF ? 0.f : expf(w[t * ns + s] - lse);
      if (p.lse && lane == 0) p.lse[f] = lse;
    }
    fj::cp_async_wait<0>();
    __syncthreads();
    for (int t = warp; t < nr; t += {{ W }}) {
      const int r = m0 + t;
      float acc[{{ PER }}];
#pragma unroll
      for (int i = 0; i < {{ PER }}; ++i) acc[i] = 0.f;
      for (int s = 0; s < ns; ++s) {
        const float ws = w[t * ns + s], *const xs = x + (t * ns + s) * {{ DV }} + lane;
#pragma unroll
        for (int i = 0; i < {{ PER }}; ++i)
          {{ GUARD and ("if (%s) "):format(GUARD) or "" }}acc[i] = fmaf(ws, xs[32 * i], acc[i]);
      }
      elem_t *const dst = fj::head_rows<elem_t>(p.o, p.o_stride, blk.b, {{ head("r") }}) + ({{ row0 and row0 .. " + " or "" }}(long long)({{ pos("r") }})) * p.o_stride[2];
#pragma unroll
      for (int i = 0; i < {{ PER }}; ++i)
        {{ GUARD and ("if (%s) "):format(GUARD) or "" }}dst[lane + 32 * i] = fj::to_elem(acc[i]);
    }
    if (threadIdx.x == 0) atomicExch(count, 0u);
  }
