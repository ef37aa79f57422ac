{#
  bwd_common.cuh: the backward's own parameter block, beside the forward's
  fj::Params (common.cuh), which the backward's kernels take too (the
  problem's sizes, strides, mask and modifications).  It must match
  fj_bwd_kparams in src/kparams.h byte for byte; bwd_params_bytes is its
  size as the host sees it.
#}
namespace fj {

struct BwdParams {
  const void *dout;        // dO, laid out as p.o_stride says (do_stride)
  void *dq, *dk, *dv;      // the gradients, in the inputs' dtype
  const float *lse;        // the forward's natural-log sum-exp [batch][heads_q][seq_q]
  // Rows of the workspace are padded to seq_pad (seq_q rounded up to 64) a
  // (batch, head): whole tiles with no tail; padding rows hold delta 0 and
  // LSE2 +inf, so their P is 0.
  float *delta;            // rowsum(dO o O), float32 [batch][heads_q][seq_pad]
  float *lse2;             // LSE * log2(e) (+inf where LSE is -inf), same rows
  float *dq_acc;           // dQ / scale, float32 [batch][heads_q][seq_pad][head_dim]
  float *dsinks;           // [heads_q] gradients of the sinks, or NULL
  long long do_stride[3], dq_stride[3], dk_stride[3], dv_stride[3];  // b, h, s
  float scale;             // the softmax scale (dQ and dK carry it)
  int seq_pad;
};
static_assert(sizeof(BwdParams) == {{ bwd_params_bytes }}, "host and device disagree on the backward's parameter block");

}  // namespace fj
