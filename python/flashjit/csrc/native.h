// native.h -- what the package's C++ training calls share (native.cpp:
// the eager call and its autograd node; compiled.cpp: the ops that
// torch.compile's graphs call): the library's functions as the package
// passes their addresses, the slots that take a call's extra tensors, and
// the stream, capture and error helpers.
#pragma once

#include <ATen/core/Tensor.h>
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

}  // namespace fjn
