{#
  rel_table.cu: a score expression's relative table (src/rel_table.c).
  The score's subtree that depends on nothing but the query head, the
  parameters and the distance kv - q (expr.h's fj_expr_facts rt: a
  bucketed bias read through two tables, a log-distance bias) is
  evaluated here once a launch, per query head h and distance d, into
  the table the attention kernels then read per score in its place
  (mods.lua's dg: a row pointer and constant offsets along a key tile):
  the parameter fj_rt after the user's, float32 [heads_q][seq_q + seq_kv
  - 1] (Q seq_q rounded up to pad, src/mods_kernel.h's FJ_MODS_RT_PAD,
  K seq_kv rounded up to it, plus pad), distance d at column d + Q - 1.
  The subtree uses q and kv
  only as kv - q or q - kv, so it is taken at q 0 and kv d.  One thread a
  column, grid-stride over columns (x) and heads (y).
  Parameters: score_mod, mod_params, mod_facts, pad, symbol.
#}
{%
  local mods = import("mods.lua").new{ score = score_mod, params = mod_params, rt_fill = true }
  if not mods.rt_fill then refuse("rel_table: the score expression has no relative table (mod_facts' score.rt)") end
  local THREADS = 256
  meta.symbol = symbol
  meta.threads = THREADS
  meta.smem_bytes = 0
  meta.rows_per_block = 1  -- not an attention kernel: never planned
  -- The user's own expression compiles in a child process.
  meta.isolate = 1
%}
{{ include("common.cuh") }}
{{ include("mods.cuh", { mods = mods, part = "decls" }) }}

extern "C" __global__ void __launch_bounds__({{ THREADS }})
{{ symbol }}(const fj::Params p{{ mods.kernel_param }}) {
  const long long n = fj_ma.{{ mods.dg.name }}.e[1];  // at most 2^31 - 1 (src/rel_table.c)
  for (int h = blockIdx.y; h < fj_ma.{{ mods.dg.name }}.e[0]; h += gridDim.y) {
    float *const row = const_cast<float *>(fj_ma.{{ mods.dg.name }}.data) + h * n;
    for (long long i = blockIdx.x * {{ THREADS }} + threadIdx.x; i < n; i += (long long)gridDim.x * {{ THREADS }})
      row[i] = fj_rt_value(h, 0, (int)(i - ((p.seq_q + {{ pad - 1 }}) / {{ pad }} * {{ pad }} - 1)), p, fj_ma);
  }
}
{{ include("mods.cuh", { mods = mods, part = "defs" }) }}
