// native.h -- what the package's C++ training calls share (native.cpp:
// the eager call and its autograd node; compiled.cpp: the ops that
// torch.compile's graphs call): the library's functions as the package
// passes their addresses, a library entry as the package records it, the
// slots that take a call's extra tensors, and the launches.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAStream.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

extern "C" {
#include "flashjit.h"
}

namespace fjn {

typedef int (*fwd_fn)(void *ctx, const void *p, const void *q, const void *k, const void *v,
                      void *o, void *lse, void *stream);
typedef int (*fwd_plan_fn)(void *ctx, const void *p, const void *plan, const void *q,
                           const void *k, const void *v, void *o, void *lse, void *ws,
                           size_t ws_bytes, void *stream);
typedef int (*bwd_fn)(void *ctx, const void *p, const void *q, const void *k, const void *v,
                      const void *o, const void *dout, const void *lse, void *dq, void *dk,
                      void *dv, void *dsinks, void *stream);
typedef int (*bwd_run_fn)(void *ctx, const void *p, const void *plan, const void *q,
                          const void *k, const void *v, const void *o, const void *dout,
                          const void *lse, void *dq, void *dk, void *dv, void *dsinks, void *ws,
                          size_t ws_bytes, void *stream);
typedef int (*capturing_fn)(void *stream, int *status);  // cuStreamIsCapturing
typedef const char *(*message_fn)(void *ctx);            // fj_errmsg

// Where a call's extra tensors go: slot i's pointer field (at[i], in a
// struct the package keeps) takes extras[of[i]]'s address.
enum { FJN_SLOTS = 24 };
struct fjn_slots {
  int64_t n;
  void *at[FJN_SLOTS];
  int64_t of[FJN_SLOTS];
};

inline void fill(const fjn_slots &s, const at::Tensor *extras) {
  for (int64_t i = 0; i < s.n; i++)
    *static_cast<void **>(s.at[i]) = extras[s.of[i]].data_ptr();
}

// A failed library call as an exception: the library's message for the
// calling thread (fj_errmsg), or the status.
inline void check(int st, message_fn message, void *ctx, const char *what) {
  if (st != 0) {
    const char *m = message ? message(ctx) : nullptr;
    throw std::runtime_error(std::string("flashjit: ") + what + ": " +
                             (m && *m ? m : "error " + std::to_string(st)));
  }
}

// PyTorch's current stream on t's device; NULL for CPU tensors (the
// package's tests, with the library's calls stubbed).
inline void *stream_of(const at::Tensor &t) {
  if (!t.is_cuda())
    return nullptr;
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

// Whether stream is being captured into a CUDA graph (as
// torch.cuda.is_current_stream_capturing: active or invalidated).
inline bool capturing(capturing_fn fn, void *stream) {
  int s = 0;
  return fn && fn(stream, &s) == 0 && s != 0;
}

// One library entry -- a forward's or a backward's -- as the package made
// it (python/flashjit/_native.py's Entry mirrors this layout; _entry fills
// it): the functions it runs with, the context, problem, plan and
// workspace bytes, and the slots that take a call's extra tensors.
struct fjn_entry {
  void *fn;              // fj_attention_fwd, or fj_attention_bwd
  void *fn_plan;         // fj_attention_fwd_plan, or fj_attention_bwd_run
  capturing_fn capturing;
  message_fn message;
  void *ctx;
  void *p;
  void *plan;
  int64_t ws;
  int64_t lse_shape[3];  // a forward's: [batch][heads_q][seq_q]
  int64_t heads_q;       // a backward's dsinks size where sinks are given
  int64_t copy[3];       // a backward's q, k, v read as dense copies
  int64_t zero;          // a backward's gradients start as zeros
  fjn_slots slots;
};

// Forward entry e on q, k, v into out and lse, on PyTorch's current stream;
// under CUDA-graph capture with the graph's own workspace (from PyTorch's
// allocator: the context's cannot grow there), as the package's calls do.
inline void run_fwd(const fjn_entry &e, const at::Tensor &q, const at::Tensor &k,
                    const at::Tensor &v, const at::Tensor &out, const at::Tensor &lse) {
  void *stream = stream_of(q);
  int st;
  if (e.ws && capturing(e.capturing, stream)) {
    auto ws = at::empty({e.ws}, q.options().dtype(at::kByte));
    st = reinterpret_cast<fwd_plan_fn>(e.fn_plan)(e.ctx, e.p, e.plan, q.data_ptr(),
                                                  k.data_ptr(), v.data_ptr(), out.data_ptr(),
                                                  lse.data_ptr(), ws.data_ptr(),
                                                  (size_t)e.ws, stream);
  } else {
    st = reinterpret_cast<fwd_fn>(e.fn)(e.ctx, e.p, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                        out.data_ptr(), lse.data_ptr(), stream);
  }
  check(st, e.message, e.ctx, "attention");
}

// Backward entry e: the loss's gradient at the log-sum-exp (dlse, float32
// and contiguous as fj_problem.dlse reads it; undefined: none) set in its
// problem, then the gradients written (dsinks NULL without sinks), as
// run_fwd launches.
inline void run_bwd(const fjn_entry &e, const at::Tensor &q, const at::Tensor &k,
                    const at::Tensor &v, const at::Tensor &o, const at::Tensor &dout,
                    const at::Tensor &lse, at::Tensor dlse, const at::Tensor &dq,
                    const at::Tensor &dk, const at::Tensor &dv, void *dsinks) {
  if (dlse.defined())
    dlse = dlse.to(at::kFloat).contiguous();
  static_cast<fj_problem *>(e.p)->dlse = dlse.defined() ? dlse.data_ptr<float>() : nullptr;
  void *stream = stream_of(q);
  int st;
  if (capturing(e.capturing, stream)) {
    auto ws = at::empty({e.ws}, q.options().dtype(at::kByte));
    st = reinterpret_cast<bwd_run_fn>(e.fn_plan)(
        e.ctx, e.p, e.plan, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
        dout.data_ptr(), lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dsinks,
        ws.data_ptr(), (size_t)e.ws, stream);
  } else {
    st = reinterpret_cast<bwd_fn>(e.fn)(e.ctx, e.p, q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                        o.data_ptr(), dout.data_ptr(), lse.data_ptr(),
                                        dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), dsinks,
                                        stream);
  }
  check(st, e.message, e.ctx, "attention backward");
}

}  // namespace fjn
