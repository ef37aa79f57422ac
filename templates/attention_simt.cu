{#
  attention_simt.cu: the first kernel of the tiered JIT (src/tier.c) --
  attention on the CUDA cores, without the matrix units and with its loops
  left rolled, so that NVRTC compiles it in a fraction of a family's time.
  It answers a problem's first calls while the variant chosen for it
  compiles in the background; then the variant takes over.  It rounds P to
  the element type before P V, as the families' matrix products take it
  (their largest rounding; the row sums take P unrounded, as theirs do),
  so that its answer and the variant's differ about as two variants'
  would; the products' order and float32 sums are its own.  The tiered JIT
  is the caller's choice (fj_ctx_opts.jit_tiers).

  The same rules as every family: mask.lua's keys (sequence end, causal,
  window), mods.lua's score and mask functions (the user's expressions, the
  softcap) applied per element, the sinks in the denominator, and the
  epilogue's conventions (O = 0 and LSE = -inf for a row that saw no key;
  LSE in natural units, [batch][heads_q][seq_q]); a caller's block mask
  walked as the families walk it.  Dense problems only (src/tier.c leaves
  varlen, paged, FP8 K/V and checked mode to the chosen kernel, compiled
  at once).

  One block of 8 warps covers BM = 8 query rows of one (batch, head), a
  row per warp; keys come in chunks of BN = 32.  Lane c holds the score of
  key n0 + c (the warp's lanes are its row's 32 keys: the max and the sum
  are warp reductions) and O's columns c, c + 32, ...  One row a thread
  keeps the code short (NVRTC's time follows it); the block's rows share
  each chunk.  Q sits in shared memory as float; K, then V, of a chunk in
  one buffer of elements, rows padded by 2 (a lane's K row is 65 words
  from its neighbour's at head dim 128: no bank conflicts).
#}
{%
  local D, BM, BN = head_dim, 8, 32
  local DJ = D // 32
  if D % 32 ~= 0 then refuse(("head_dim %d: the first kernel takes multiples of 32"):format(D)) end
  local mask = import("mask.lua").new(causal, false, nil, window)
  -- A caller's block mask (fj_block_mask): its lists say which key blocks
  -- each query block walks.  The block's 8 rows lie in one query block.
  local BMASK = (block_kv or 0) > 0 and { q = block_q, kv = block_kv } or nil
  local mods = import("mods.lua").new{ score = score_mod, mask = mask_mod, params = mod_params,
                                       softcap = softcap, sinks = sinks, b = "b", hkv = "hkv" }
  meta.symbol = symbol
  meta.threads = 32 * BM
  meta.smem_bytes = 0
  meta.rows_per_block = BM
  if mods.score_text or mods.mask_text then meta.isolate = 1 end
  -- The first kernel answers while the chosen one compiles: its compile
  -- is the first result's wait, its own time a few tens of milliseconds.
  meta.quick = 1
  -- The score function's extra arguments, which the families build per
  -- tile (mods.lua's kvq and dg): here per element, as the text reads them.
  local KVQ = mods.kvq and (mods.kvq_scale and "fj_kvq_scale(b, h, hkv, p" .. (mods.args and ", fj_ma" or "") .. ") * (float)(key - row)"
                                           or "(float)(key - row)")
  local DG = mods.dg and mods.dg_read("row", "h", "key")
%}
{{ include("common.cuh") }}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "decls" }) }}
{% end %}

extern "C" __global__ void __launch_bounds__({{ 32 * BM }})
{{ symbol }}(const fj::Params p{{ mods.kernel_param }}) {
  using namespace fj;
  constexpr int D = {{ D }}, BM = {{ BM }}, BN = {{ BN }}, KP = D + 2, T = 32 * BM;
  __shared__ float qs[BM][D];
  __shared__ elem_t kvs[BN][KP];
  __shared__ float ps[BM][BN];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int m0 = blockIdx.x * BM, h = blockIdx.y, b = blockIdx.z, hkv = h / p.group;
  const elem_t *qg = (const elem_t *)p.q + b * p.q_stride[0] + h * p.q_stride[1];
  const elem_t *kg = (const elem_t *)p.k + b * p.k_stride[0] + hkv * p.k_stride[1];
  const elem_t *vg = (const elem_t *)p.v + b * p.v_stride[0] + hkv * p.v_stride[1];
  elem_t *og = (elem_t *)p.o + b * p.o_stride[0] + h * p.o_stride[1];
{% if mods.score then %}
  const float qk_scale = {{ mods.qk_scale("p.scale_log2 * 0.69314718056f") }};
{% else %}
  const float qk_scale = p.scale_log2 * 0.69314718056f;
{% end %}
  const float sl2 = {{ mods.score and mods.sl2 or "1.44269504089f" }};

  // Q's rows as float (rows past the sequence read 0).
  for (int i = tid; i < BM * D; i += T) {
    const int r = i / D, c = i % D;
    qs[r][c] = m0 + r < p.seq_q ? from_elem(qg[(long long)(m0 + r) * p.q_stride[2] + c]) : 0.f;
  }
  // The warp's row: its running max (base-2 units), sum and O.
  const int row = m0 + warp;
  float m = FJ_NEG_INF, l = 0.f, o[{{ DJ }}];
#pragma unroll
  for (int j = 0; j < {{ DJ }}; ++j) o[j] = 0.f;
{% if BMASK then %}
  // A caller's block mask: the partial key blocks of this query block,
  // then the full ones, read as block.cuh reads them (counts clamped, an
  // index outside the key blocks the block just past the last); the mask
  // expression applies only on partial blocks' keys.
  const long long bm_row = (long long)b * p.bm_stride_b + (long long)h * p.bm_stride_h + m0 / {{ BMASK.q }};
  const int kvb = p.bm_kv_blocks;
  const int np = min(max(p.bm_num[bm_row], 0), kvb);
  const int nb = np + (p.bm_full_num ? min(max(p.bm_full_num[bm_row], 0), kvb) : 0);
  const int *part = p.bm_idx + bm_row * kvb;
  const int *full = p.bm_full_idx ? p.bm_full_idx + bm_row * kvb : part;
  const int chunks = nb * {{ BMASK.kv // BN }};
{% else %}
  // The keys some row of the block may see, in whole chunks.
  const int last = min(m0 + BM, p.seq_q);
  const int kv_begin = ({{ mask.keys_begin("m0") }}) / BN * BN;
  const int chunks = ({{ mask.keys_end("last") }} - kv_begin + BN - 1) / BN;
{% end %}
  for (int ci = 0; ci < chunks; ++ci) {
{% if BMASK then %}
    const int e = ci / {{ BMASK.kv // BN }};
    const unsigned bi = (unsigned)(e < np ? part[e] : full[e - np]);
    const int n0 = (bi < (unsigned)kvb ? (int)bi : kvb) * {{ BMASK.kv }} + ci % {{ BMASK.kv // BN }} * BN;
    const bool bm_part = e < np;
{% else %}
    const int n0 = kv_begin + ci * BN;
{% end %}
    __syncthreads();  // the last chunk's V and P are read
    for (int i = tid; i < BN * D; i += T) {
      const int r = i / D, c = i % D;
      kvs[r][c] = n0 + r < p.seq_kv ? kg[(long long)(n0 + r) * p.k_stride[2] + c] : to_elem(0.f);
    }
    __syncthreads();
    // Lane c: the score of key n0 + c.
    float x = 0.f;
#pragma unroll 4
    for (int c = 0; c < D; ++c) x = fmaf(qs[warp][c], from_elem(kvs[lane][c]), x);
    const int key = n0 + lane;
{% if mods.score then %}
    {{ mods.apply_score("x", "row", "h", "key", nil, KVQ, DG) }}
{% else %}
    x *= qk_scale;
{% end %}
{% if mods.mask and BMASK then %}
    if (bm_part) { {{ mods.apply_mask("x", "row", "h", "key", nil) }} }
{% elseif mods.mask then %}
    {{ mods.apply_mask("x", "row", "h", "key", nil) }}
{% end %}
    const float t = row < p.seq_q && {{ mask.visible("row", "key") }} ? x * sl2 : FJ_NEG_INF;
    // The online softmax of the row over this chunk's 32 keys.
    const float mn = fmaxf(m, warp_max(t));
    const float alpha = m == FJ_NEG_INF ? 0.f : fast_exp2(m - mn);
    const float pv = mn == FJ_NEG_INF ? 0.f : fast_exp2(t - mn);
    l = l * alpha + warp_sum(pv);
    m = mn;
    ps[warp][lane] = from_elem(to_elem(pv));  // P as the matrix units take it
#pragma unroll
    for (int j = 0; j < {{ DJ }}; ++j) o[j] *= alpha;
    __syncthreads();  // K is read
    for (int i = tid; i < BN * D; i += T) {
      const int r = i / D, c = i % D;
      kvs[r][c] = n0 + r < p.seq_kv ? vg[(long long)(n0 + r) * p.v_stride[2] + c] : to_elem(0.f);
    }
    __syncthreads();
    for (int c = 0; c < BN; ++c) {
      const float pc = ps[warp][c];
#pragma unroll
      for (int j = 0; j < {{ DJ }}; ++j) o[j] = fmaf(pc, from_elem(kvs[c][lane + 32 * j]), o[j]);
    }
  }
  // O / l and the log-sum-exp (natural units); a row that saw no key gets
  // O = 0 and LSE = -inf (with sinks: LSE = its sink), as every family.
  if (row >= p.seq_q) return;
  float lt = l, mt = m, scale_o = 1.f;
{% if mods.sinks then %}
  const float sk = p.sinks[h] * 1.44269504089f;
  const float mb = lt > 0.f ? mt : FJ_NEG_INF;
  mt = fmaxf(mb, sk);
  const float mz = mt == FJ_NEG_INF ? 0.f : mt;
  scale_o = fast_exp2(mb - mz);
  lt = lt * scale_o + (sk >= mb ? (sk == FJ_NEG_INF ? 0.f : 1.f) : fast_exp2(sk - mz));
  mt = mz;
  const float inv = !(lt <= 0.f) ? scale_o / lt : 0.f;
{% else %}
  const float inv = lt > 0.f ? scale_o / lt : 0.f;
{% end %}
#pragma unroll
  for (int j = 0; j < {{ DJ }}; ++j)
    og[(long long)row * p.o_stride[2] + lane + 32 * j] = to_elem(o[j] * inv);
  if (p.lse && lane == 0)
    p.lse[((long long)b * p.heads_q + h) * p.seq_q + row] =
        !(lt <= 0.f) ? (mt + __log2f(lt)) * 0.69314718056f : FJ_NEG_INF;
}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "defs" }) }}
{% end %}
