{#
  block_mask.cu: the kernel of fj_block_mask_build.  One thread block per
  (query block, key block) pair (grid x) of one head (y) of one batch
  index (z) -- the mask's own batch and heads, 1 where the mask
  expression does not read b or h.  A pair the built-in rules (mask.lua:
  the sequence ends, the causal mask, the window) let no row reach is
  dropped at once; otherwise the block tests every (query, key) pair in
  it.  The last block of a row of blocks to finish lists the row's kept
  key blocks, and the last block of a column of blocks (one key block's
  query blocks) the column's kept query blocks, both directions in the
  same launch (the forward walks rows, the backward columns):
    partial   some pair kept, and some pair the built-in rules keep is
              hidden by the mask expression (the attention kernel then
              runs the expression per element);
    full      some pair kept, and the mask expression keeps every pair
              the built-in rules keep (the attention kernel runs only the
              built-in rules, which it applies anyway).
  A block no pair of which is kept is in neither list.  Only the counts
  and the lists are stored: the dense mask never exists.
  Parameters: causal, window, mask_mod, mod_params, block_q, block_kv,
  symbol.
#}
{%
  local mrule = import("mask.lua").new(causal, false, nil, window)
  local mods = import("mods.lua").new{ mask = mask_mod, params = mod_params }
  local BQ, BKV = block_q, block_kv
  local THREADS = 256
  meta.symbol = symbol
  meta.threads = THREADS
  meta.smem_bytes = 0
  meta.rows_per_block = BQ
  -- The user's own expression compiles in a child process.
  if mods.mask_text then meta.isolate = 1 end
%}
{{ include("common.cuh") }}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "decls" }) }}
{% end %}

namespace fj {
// Where the lists go (src/block_mask.c lays them out in one buffer): per
// row (batch x heads x q_blocks of the mask) a count of partial and of
// full key blocks and their indices [rows][kv_blocks]; per column (batch
// x heads x kv_blocks) the same of query blocks, [cols][q_blocks].  The
// host zeroes num and q_num first: until a row (column) is done its count
// is the number of its blocks tested so far.
struct MaskOut {
  int *num, *full_num, *idx, *full_idx;
  int *q_num, *full_q_num, *q_idx, *full_q_idx;
  int kv_blocks, q_blocks;
};

// One warp turns the n states of a row or column (0 none kept, 1 partial,
// 2 full: written where the partial list goes) into its lists, ascending:
// 32 states at a time, read (from L2: other blocks wrote them) before any
// is overwritten, since an index goes to or before a state read.
__device__ __forceinline__ void states_to_lists(int *state, int *full, int n, int *num,
                                                int *full_num, int lane) {
  int np = 0, nf = 0;
  for (int c = 0; c < n; c += 32) {
    const int k = c + lane;
    const int st = k < n ? __ldcg(state + k) : 0;
    const unsigned part = __ballot_sync(0xffffffffu, st == 1), whole = __ballot_sync(0xffffffffu, st == 2);
    const unsigned below = (1u << lane) - 1u;
    if (st == 1) state[np + __popc(part & below)] = k;
    if (st == 2) full[nf + __popc(whole & below)] = k;
    np += __popc(part);
    nf += __popc(whole);
  }
  if (lane == 0) {
    *num = np;
    *full_num = nf;
  }
}
}  // namespace fj

extern "C" __global__ void __launch_bounds__({{ THREADS }})
{{ symbol }}(const fj::Params p, const fj::MaskOut out{{ mods.kernel_param }}) {
  const int qb = blockIdx.x / out.kv_blocks, kb = blockIdx.x % out.kv_blocks;
  const int b = blockIdx.z, h = blockIdx.y, m0 = qb * {{ BQ }}, n0 = kb * {{ BKV }};
  const long long row = ((long long)b * gridDim.y + h) * out.q_blocks + qb;
  // Whether the built-in rules let rows m0 .. m0 + {{ BQ - 1 }} reach this key block.
  const int n_end = {{ mrule.keys_end("m0 + " .. BQ) }};
  const int kb_lo = {{ mrule.keys_begin("m0") }} / {{ BKV }};
  bool any = false, all = true;
  if (kb >= kb_lo && n0 < n_end) {
    for (int e = threadIdx.x; e < {{ BQ * BKV }}; e += {{ THREADS }}) {
      const int q = m0 + e / {{ BKV }}, kv = n0 + e % {{ BKV }};
      if (q >= p.seq_q || kv >= p.seq_kv) continue;
      const bool builtin = {{ mrule.visible("q", "kv") }};
{% if mods.mask then %}
      const bool user = fj_mask_mod(b, h, h / p.group, q, kv{{ mods.args and ", fj_ma" or "" }});
{% else %}
      const bool user = true;
{% end %}
      any |= builtin && user;
      all &= !builtin || user;
    }
  }
  any = __syncthreads_or(any);
  all = __syncthreads_and(all);
  // The block's state (0 none kept, 1 partial, 2 full) goes where the
  // row's index list will be and where the column's will be (separate
  // storage: the two conversions never touch the other's); the row's last
  // block to finish (its count reaching kv_blocks) turns the row's states
  // into its lists with warp 0, the column's last (q_blocks) the column's
  // with warp 1.
  const long long col = ((long long)b * gridDim.y + h) * out.kv_blocks + kb;
  int *const state = out.idx + row * out.kv_blocks;
  int *const cstate = out.q_idx + col * out.q_blocks;
  __shared__ bool last, clast;
  if (threadIdx.x == 0) {
    const int st = any ? (all ? 2 : 1) : 0;
    state[kb] = st;
    cstate[qb] = st;
    __threadfence();
    last = atomicAdd(out.num + row, 1) == out.kv_blocks - 1;
    clast = atomicAdd(out.q_num + col, 1) == out.q_blocks - 1;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp == 0 && last) {
    __threadfence();
    fj::states_to_lists(state, out.full_idx + row * out.kv_blocks, out.kv_blocks, out.num + row,
                        out.full_num + row, lane);
  } else if (warp == 1 && clast) {
    __threadfence();
    fj::states_to_lists(cstate, out.full_q_idx + col * out.q_blocks, out.q_blocks, out.q_num + col,
                        out.full_q_num + col, lane);
  }
}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "defs" }) }}
{% end %}
