{#
  common.cuh: pieces every attention template (and the split-KV combine)
  shares -- the header comment naming the variant, the kernel parameter block (which must match
  fj_kparams in src/attention.c byte for byte; params_bytes is its size as
  the host sees it), the element type, its pairs and their conversions.
#}
// flashjit generated kernel: {{ symbol }}
{% if tile_m then %}
// variant: head_dim={{ head_dim }}{{ head_dim_v and (" head_dim_v=%d"):format(head_dim_v) or "" }} tile_m={{ tile_m }} tile_n={{ tile_n }} warps={{ warps }} stages={{ stages }} swizzle={{ swizzle }} softmax={{ softmax }} mma={{ mma }} causal={{ causal }} dtype={{ dtype }} kv_dtype={{ kv_dtype }}{{ pack_gqa and " pack_gqa" or "" }}{{ split_kv and " split_kv" or "" }}{{ varlen and " varlen" or "" }}{{ paged and " paged" or "" }}{{ window and " window" or "" }}{{ softcap and " softcap" or "" }}{{ (score_mod or "") ~= "" and " score_mod" or "" }}{{ (mask_mod or "") ~= "" and " mask_mod" or "" }}
{% end %}
// target: {{ arch }}; rendered by flashjit {{ version }} from templates/{{ template }}
{# Only the headers a kernel uses: each costs NVRTC parse time (mma.h about
   30 ms a compile). #}
#include <cuda_fp16.h>
{# FP8 attention (dtype e4m3) writes O in bfloat16. #}
{% if dtype ~= "f16" or mma == "wmma" then %}
#include <cuda_bf16.h>
{% end %}
{% if mma == "wmma" then %}
#include <mma.h>
{% end %}

namespace fj {

struct Params {
  const void *q, *k, *v;
  void *o;
  float *lse;               // nullable: [batch][heads_q][seq_q]
  const float *k_scale;     // FP8 K/V: [batch][heads_kv]
  const float *v_scale;
  long long q_stride[3], k_stride[3], v_stride[3], o_stride[3];  // b, h, s
  int batch, heads_q, heads_kv, seq_q, seq_kv;
  int group;                // heads_q / heads_kv
  int causal_offset;        // key j visible to row i when j <= i + offset
  float scale_log2;         // softmax scale * log2(e)
  int splits;               // split-KV: key ranges per row tile
  float *o_part;            // split-KV: [splits][batch][heads_q][seq_q][head_dim]
  float *lse_part;          // split-KV: [splits][batch][heads_q][seq_q]
  // Varlen (cu_seqlens_q / _kv: [batch + 1] prefix sums, seqused_kv:
  // [batch] key counts) and paged K/V (block_table: [batch][max_pages]
  // page numbers, pages of 2^page_shift keys); NULL where absent.
  const int *cu_seqlens_q, *cu_seqlens_kv, *seqused_kv, *block_table;
  int max_pages, page_shift, num_pages;
  // Built-in modifications (fj_mods): the window's sides (FJ_WINDOW_MAX
  // for an unbounded side; a causal mask's right side is 0) and the
  // softcap with its reciprocal, and the softcap's fixed shift of the
  // exponentials in score units (0: the running max; mods.lua's bounded).
  int window_left, window_right;
  float softcap, softcap_inv, softcap_shift;
  int combine_warps;  // split-KV: the combine's warps a row (1, 2 or 4)
  // A dynamic walk of work tiles (block.cuh's claim): the counter, zeroed
  // before each launch.
  unsigned *work;
  // A block mask (fj_block_mask; NULL where absent): the counts and lists
  // of batch b, head h start at query block b * bm_stride_b + h *
  // bm_stride_h (0 for a dimension the mask broadcasts).
  const int *bm_num, *bm_idx, *bm_full_num, *bm_full_idx;
  int bm_stride_b, bm_stride_h, bm_q_blocks, bm_kv_blocks;
  const float *sinks;       // attention sinks: [heads_q] logits, or NULL
  // FP8 attention (dtype e4m3): Q's descales [batch][heads_kv], and V^T in
  // the workspace, [batch][heads_kv][head_dim][vt_keys] bytes.
  const float *q_scale;
  unsigned char *vt;
  int vt_keys;
  int scale_per_head;       // FP8 descales: 1 per (batch, KV head), 0 one a tensor
  // FP8 attention: an e4m3 O's scale (NULL: 1), and where max |O| goes
  // (NULL: not kept; the host zeroes it before the launch).
  const float *o_scale;
  float *o_amax;
};
static_assert(sizeof(Params) == {{ params_bytes }}, "host and device disagree on the parameter block");

// The index of batch b's KV head hk in the FP8 descales (q_scale, k_scale,
// v_scale): [batch][heads_kv], or 0 for one a tensor.
__device__ __forceinline__ int scale_at(const Params &p, int b, int hk) {
  return (b * p.heads_kv + hk) * p.scale_per_head;
}

{# elem_t: Q's and O's element; for FP8 attention (dtype e4m3) O's:
   o_dtype's (bf16 where nil, f16, or e4m3 -- a byte, converted with
   round-to-nearest-even and saturation to +-448 by sm_89's cvt). #}
{% if o_dtype == "e4m3" then %}
struct e4m3_t { unsigned char bits; };
struct e4m3x2_t { unsigned short bits; };  // the first element in the low byte
typedef e4m3_t elem_t;
typedef e4m3x2_t elem2_t;
__device__ __forceinline__ elem2_t to_elem2(float a, float b) {
  elem2_t e;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(e.bits) : "f"(b), "f"(a));
  return e;
}
__device__ __forceinline__ elem_t to_elem(float x) {
  return elem_t{(unsigned char)to_elem2(x, 0.f).bits};
}
{% elseif dtype == "f16" or o_dtype == "f16" then %}
typedef __half elem_t;
typedef __half2 elem2_t;
__device__ __forceinline__ elem_t to_elem(float x) { return __float2half_rn(x); }
__device__ __forceinline__ elem2_t to_elem2(float a, float b) { return __floats2half2_rn(a, b); }
__device__ __forceinline__ float from_elem(elem_t x) { return __half2float(x); }
{% else %}
typedef __nv_bfloat16 elem_t;
typedef __nv_bfloat162 elem2_t;
__device__ __forceinline__ elem_t to_elem(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ elem2_t to_elem2(float a, float b) { return __floats2bfloat162_rn(a, b); }
__device__ __forceinline__ float from_elem(elem_t x) { return __bfloat162float(x); }
{% end %}

{% if varlen or paged then %}
// One sequence of a varlen or paged batch: its lengths, clamped to the
// problem's bounds (a bad array never moves a block past them), and the
// first rows of its queries and keys.
struct Seq {
  int len_q, len_kv;
  long long q_row0, kv_row0;
};

__device__ __forceinline__ Seq seq_of(const Params &p, int b) {
  Seq s;
  s.len_q = p.seq_q;
  s.len_kv = p.seq_kv;
  s.q_row0 = s.kv_row0 = 0;
  if (p.cu_seqlens_q) {
    const int a = p.cu_seqlens_q[b];
    s.q_row0 = max(a, 0);
    s.len_q = p.cu_seqlens_q[b + 1] - a;
  }
  if (p.cu_seqlens_kv) {
    const int a = p.cu_seqlens_kv[b];
    s.kv_row0 = max(a, 0);
    s.len_kv = p.cu_seqlens_kv[b + 1] - a;
  }
  if (p.seqused_kv) s.len_kv = p.seqused_kv[b];
  s.len_q = min(max(s.len_q, 0), p.seq_q);
  s.len_kv = min(max(s.len_kv, 0), p.seq_kv);
  return s;
}

{% end %}
// -inf without <math.h> (NVRTC has no INFINITY macro of its own).
#define FJ_NEG_INF (__int_as_float(0xff800000u))

__device__ __forceinline__ float warp_max(float x) {
  for (int m = 16; m > 0; m >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, m));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// Whether an online softmax's row max x is so large in magnitude (2^12 or
// more, not -inf) that the row subtracts it from its scores before the
// exponentials (softmax_regs.cuh): x * log2(e) rounded is off by 2^-12 or
// more, which would scale P at the max.
__device__ __forceinline__ bool big_max(float x) {
  return fabsf(x) >= 4096.f && x != FJ_NEG_INF;
}

// 2^x through the SFU; exp2(-inf) is 0.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1 / x correctly rounded, as 1.f / x is, for normal x and a normal result;
// denormals flush to zero.  The epilogues' row sums are at least 1 (the row
// max's own term), so the results are 1.f / x's; without the denormal path
// ptxas emits no slow-path call, which needs registers of its own where a
// kernel has none to spare (fewer instructions in every epilogue).
__device__ __forceinline__ float rcp_ftz(float x) {
  float y;
  asm("rcp.rn.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fj
