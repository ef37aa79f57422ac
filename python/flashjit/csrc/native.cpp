// native.cpp -- the package's training call in C++ (libflashjit_torch.so):
// the op flashjit_native::train, an eager forward whose backward is a C++
// autograd node, for the calls whose every decision the package made once
// (python/flashjit/_native.py builds the record below).
//
// Why: a Python autograd.Function's backward runs on PyTorch's device
// thread, which must take the GIL, wrap every tensor for Python and hand
// the result back; on an H100's host that is some 100-180 us of a layer's
// forward + backward that cuDNN's SDPA (a C++ node) does not pay
// (bench/probes/mods_host.py).  This node does what _TrainCall's backward
// does for such a call -- the same library calls with the same arguments
// -- and nothing else: every choice (the entries, which gradients are
// views of one buffer) is the package's, recorded in a fjn_call.
//
// The library's functions come as addresses from the package's own
// binding (the same library instance the package loaded), so this file
// links only PyTorch.  The op is eager only: under torch.compile the
// graphs call compiled.cpp's ops.
#include "native.h"

#include <ATen/Context.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/headeronly/version.h>
#include <torch/library.h>

#include <optional>
#include <vector>

namespace {

using namespace fjn;

// One training call as the package decided it (python/flashjit/_native.py's
// Call mirrors this layout; every field is set there before the first use).
struct fjn_call {
  int64_t extras;    // how many extra tensors a call passes
  int64_t sinks_at;  // which of them are the sinks (their gradient: dsinks), or -1
  // The forward's entry (O is q's dtype, contiguous in q's shape), and the
  // backward's by mode (0, 1: torch's deterministic flag).
  fjn_entry fwd;
  fjn_entry bwd[2];
  // The gradients' layout: which of q, k, v are dense (their gradient is
  // empty_like); the others are views of one new buffer of `shared_elems`
  // elements at the offsets they have in the storage they share, which a
  // call must share as the first did (else the package's own path runs).
  int64_t dense[3];
  int64_t shared_elems;
  int64_t shared_offset[3];
  // q's, k's and v's strides (4 dimensions), those the backward's entries
  // were made for.
  int64_t strides[3][4];
};

// Whether q, k and v are laid out as the call's first ones were for its
// gradients: the non-dense ones in one storage at the recorded offsets.
bool layout_holds(const fjn_call *c, const at::Tensor *t) {
  const void *base = nullptr;
  for (int i = 0; i < 3; i++) {
    if (c->dense[i])
      continue;
    const void *s = t[i].storage().data();
    if (base && s != base)
      return false;
    base = s;
    if (t[i].storage_offset() != c->shared_offset[i] ||
        (int64_t)t[i].storage().nbytes() != c->shared_elems * (int64_t)t[i].element_size())
      return false;
  }
  return true;
}

// The backward's q, k and v in the layout its entries were made for: as
// they are where they already are (the forward's own tensors), else copied
// into it (a saved-tensor hook gave the backward copies in other strides:
// offloaded activations, say).
void conform(const fjn_call *c, at::Tensor *t) {
  bool same = true;
  for (int i = 0; i < 3 && same; i++)
    same = t[i].strides().equals(c10::IntArrayRef(c->strides[i], 4));
  if (same && layout_holds(c, t))
    return;
  at::Tensor buf;
  for (int i = 0; i < 3; i++) {
    c10::IntArrayRef st(c->strides[i], 4);
    at::Tensor to;
    if (c->dense[i]) {
      to = at::empty_strided(t[i].sizes(), st, t[i].options());
    } else {
      if (!buf.defined())
        buf = at::empty({c->shared_elems}, t[i].options());
      to = buf.as_strided(t[i].sizes(), st, c->shared_offset[i]);
    }
    to.copy_(t[i]);
    t[i] = to;
  }
}

struct Train : public torch::autograd::Function<Train> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext *ctx,
                                                const at::Tensor &q, const at::Tensor &k,
                                                const at::Tensor &v,
                                                const std::optional<at::Tensor> &sinks,
                                                std::vector<at::Tensor> extras, int64_t addr) {
    (void)sinks;  // an input for its gradient; the library reads extras[sinks_at]
    auto *c = reinterpret_cast<const fjn_call *>(addr);
    fill(c->fwd.slots, extras.data());
    auto out = at::empty(q.sizes(), q.options());
    auto lse = at::empty({c->fwd.lse_shape[0], c->fwd.lse_shape[1], c->fwd.lse_shape[2]},
                         q.options().dtype(at::kFloat));
    run_fwd(c->fwd, q, k, v, out, lse);
    torch::autograd::variable_list keep = {q, k, v, out, lse};
    keep.insert(keep.end(), extras.begin(), extras.end());
    ctx->save_for_backward(keep);
    ctx->saved_data["call"] = addr;
    ctx->set_materialize_grads(false);
    return {out, lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    auto *c = reinterpret_cast<const fjn_call *>(ctx->saved_data["call"].toInt());
    auto saved = ctx->get_saved_variables();
    at::Tensor in[3] = {saved[0], saved[1], saved[2]};
    conform(c, in);
    at::Tensor q = in[0], k = in[1], v = in[2], out = saved[3], lse = saved[4];
    at::Tensor dout = grads[0], dlse = grads[1];
    if (!dout.defined() && !dlse.defined())
      return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
              at::Tensor()};
    if (!dout.defined())  // a loss of the log-sum-exp alone
      dout = at::zeros_like(out);
    const fjn_entry &e = c->bwd[at::globalContext().deterministicAlgorithms() ? 1 : 0];
    fill(e.slots, saved.data() + 5);
    // The gradients in q's, k's and v's strides (_grads_as_laid_out).
    at::Tensor g[3], buf;
    for (int i = 0; i < 3; i++) {
      if (c->dense[i]) {
        g[i] = e.zero ? at::zeros_like(in[i]) : at::empty_like(in[i]);
      } else {
        if (!buf.defined())
          buf = e.zero ? at::zeros({c->shared_elems}, in[i].options())
                       : at::empty({c->shared_elems}, in[i].options());
        g[i] = buf.as_strided(in[i].sizes(), in[i].strides(), in[i].storage_offset());
      }
    }
    at::Tensor dsinks;
    if (c->sinks_at >= 0)
      dsinks = at::empty({e.heads_q}, q.options().dtype(at::kFloat));
    run_bwd(e, q, k, v, out.contiguous(), dout.contiguous(), lse, dlse, g[0], g[1], g[2],
            dsinks.defined() ? dsinks.data_ptr() : nullptr);
    return {g[0], g[1], g[2], dsinks, at::Tensor(), at::Tensor()};
  }
};

// (out, lse) of a recorded call, or an empty list where the record does
// not hold: q, k and v not sharing storage as the call's first did, or an
// extra tensor but the sinks requiring grad (the package's path runs then).
std::vector<at::Tensor> train(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                              at::TensorList extras, int64_t addr) {
  auto *c = reinterpret_cast<const fjn_call *>(addr);
  const at::Tensor in[3] = {q, k, v};
  if ((int64_t)extras.size() != c->extras || !layout_holds(c, in))
    return {};
  for (size_t i = 0; i < extras.size(); i++)
    if (extras[i].requires_grad() && (int64_t)i != c->sinks_at)
      return {};
  std::optional<at::Tensor> sinks;
  if (c->sinks_at >= 0)
    sinks = extras[c->sinks_at];
  return Train::apply(q, k, v, sinks, extras.vec(), addr);
}

// The record's size, for the package's check of its own layout.
int64_t record_bytes() { return (int64_t)sizeof(fjn_call); }
// The PyTorch this library was built against, major * 100 + minor (the
// package refuses the library under another: its C++ ABI is not kept).
int64_t torch_version() { return TORCH_VERSION_MAJOR * 100 + TORCH_VERSION_MINOR; }
int64_t dlse_offset() { return (int64_t)offsetof(fj_problem, dlse); }

}  // namespace

TORCH_LIBRARY(flashjit_native, m) {
  m.def("train(Tensor q, Tensor k, Tensor v, Tensor[] extras, int call) -> Tensor[]", &train);
  m.def("record_bytes() -> int", &record_bytes);
  m.def("torch_version() -> int", &torch_version);
  m.def("dlse_offset() -> int", &dlse_offset);
}
