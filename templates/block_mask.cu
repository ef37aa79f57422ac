{#
  block_mask.cu: the kernel of fj_block_mask_build.  One thread block per
  query block (grid x) of one head (y) of one batch index (z) -- the
  mask's own batch and heads, 1 where the mask expression does not read
  b or h -- walks the key blocks that the built-in rules (mask.lua: the
  sequence ends, the causal mask, the window) let its rows reach, tests
  every (query, key) pair of each, and lists the blocks it keeps:
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
// Where the lists go (src/block_mask.c lays them out in one buffer):
// counts [rows], full counts [rows], indices [rows][kv_blocks], full
// indices [rows][kv_blocks], rows = batch x heads x q_blocks of the mask.
struct MaskOut {
  int *num, *full_num, *idx, *full_idx;
  int kv_blocks, pad_;
};
}  // namespace fj

extern "C" __global__ void __launch_bounds__({{ THREADS }})
{{ symbol }}(const fj::Params p, const fj::MaskOut out{{ mods.kernel_param }}) {
  const int b = blockIdx.z, h = blockIdx.y, m0 = blockIdx.x * {{ BQ }};
  const long long row = ((long long)b * gridDim.y + h) * gridDim.x + blockIdx.x;
  // The key blocks the built-in rules let rows m0 .. m0 + {{ BQ - 1 }} reach.
  const int n_end = {{ mrule.keys_end("m0 + " .. BQ) }};
  const int kb_lo = {{ mrule.keys_begin("m0") }} / {{ BKV }};
  const int kb_hi = min((n_end + {{ BKV - 1 }}) / {{ BKV }}, out.kv_blocks);
  int np = 0, nf = 0;  // thread 0's counts
  for (int kb = kb_lo; kb < kb_hi; ++kb) {
    const int n0 = kb * {{ BKV }};
    bool any = false, all = true;
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
    any = __syncthreads_or(any);
    all = __syncthreads_and(all);
    if (threadIdx.x == 0 && any) {
      if (all) out.full_idx[row * out.kv_blocks + nf++] = kb;
      else out.idx[row * out.kv_blocks + np++] = kb;
    }
  }
  if (threadIdx.x == 0) {
    out.num[row] = np;
    out.full_num[row] = nf;
  }
}
{% if mods.any then %}
{{ include("mods.cuh", { mods = mods, part = "defs" }) }}
{% end %}
