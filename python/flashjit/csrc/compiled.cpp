// compiled.cpp -- the training ops that torch.compile's graphs call, in C++:
// flashjit_native::attention_train and ::attention_bwd, for the dense
// training call with the built-in masks (what flashjit::attention_train
// and ::attention_bwd, the package's Python custom ops, take without their
// varlen arguments).
//
// Why: a compiled graph calls a Python custom op through PyTorch's Python
// dispatch and the op's Python body (the call's options, its entry's
// lookup, the launch through ctypes): 24.5 us forward and 30.2 us backward
// a call on the build machine; on an H100's host, where the compiled GPT
// step ran 1.14x SDPA's (PERF.md G3), the package's eager training call
// took some four times the build machine's host time, launches included
// (these ops' host time there is not measured).  These ops
// find the call's library entry in a table of their own, keyed by the
// arguments and the tensors' metadata, and launch it; a signature they
// have not seen asks the package once (flashjit_native::prepare_fwd /
// prepare_bwd, Python: _native.py), which makes the entry as its own op
// would and returns its record -- or 0 where a record cannot express the
// call (an empty output, say): the package's op runs then, through the
// dispatcher.
//
// The forward's autograd is here too (TrainOp: the backward op on the
// saved tensors, the deterministic flag read when the backward runs or is
// traced, as the package's formula does), so that a compiled graph's call
// passes no Python; their fake implementations are the package's
// (_native.py), so a traced graph has the shapes and strides the Python
// ops' would have.
#include "native.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros_like.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace {

using namespace fjn;

// The signatures this thread has seen: the key's bytes -> the record (0:
// the package's op).  By thread, as the package's call tables are: a call
// writes its pointers into its entry's problem, which another thread's
// call of the same signature must not share.
thread_local std::unordered_map<std::string, int64_t> table;
std::atomic<int64_t> made{0};  // records made, every thread

void put(std::string &key, int64_t v) { key.append(reinterpret_cast<const char *>(&v), 8); }

void put(std::string &key, double v) {
  int64_t bits;
  std::memcpy(&bits, &v, 8);
  put(key, bits);
}

void put(std::string &key, const at::Tensor &t) {
  if (!t.defined()) {
    put(key, (int64_t)-1);
    return;
  }
  put(key, (int64_t)t.scalar_type());
  put(key, (int64_t)t.device().type() * 1000 + t.device().index());
  put(key, (int64_t)t.dim());
  for (int64_t i = 0; i < t.dim(); i++) {
    put(key, t.size(i));
    put(key, t.stride(i));
  }
}

// The sinks' metadata and the call's options, after the tensors'.
void put_options(std::string &key, const std::optional<at::Tensor> &sinks, int64_t causal,
                 double scale, int64_t layout, int64_t window_left, int64_t window_right,
                 double softcap) {
  put(key, sinks ? *sinks : at::Tensor());
  for (int64_t v : {causal, layout, window_left, window_right})
    put(key, v);
  put(key, scale);
  put(key, softcap);
}

// The record of key, asking prepare (a boxed call of the package's
// prepare op with these arguments) on a miss.
int64_t record_of(const std::string &key, const char *prepare, torch::jit::Stack args) {
  auto it = table.find(key);
  if (it != table.end())
    return it->second;
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(prepare, "");
  {
    // The preparation makes no graph: below autograd.
    c10::impl::ExcludeDispatchKeyGuard no_autograd(c10::autograd_dispatch_keyset);
    op.callBoxed(&args);
  }
  int64_t rec = args.at(0).toInt();
  table.emplace(key, rec);
  made++;
  return rec;
}

// The package's own op (name) on these arguments, its defaults after them,
// for a signature no record expresses.
torch::jit::Stack package_op(const char *name, torch::jit::Stack args) {
  auto op = c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
  const auto &params = op.schema().arguments();
  for (size_t i = args.size(); i < params.size(); i++)
    args.push_back(*params[i].default_value());
  op.callBoxed(&args);
  return args;
}

std::tuple<at::Tensor, at::Tensor> attention_train(const at::Tensor &q, const at::Tensor &k,
                                                   const at::Tensor &v,
                                                   const std::optional<at::Tensor> &sinks,
                                                   int64_t causal, double scale, int64_t layout,
                                                   int64_t window_left, int64_t window_right,
                                                   double softcap) {
  std::string key = "f";
  for (const at::Tensor *t : {&q, &k, &v})
    put(key, *t);
  put_options(key, sinks, causal, scale, layout, window_left, window_right, softcap);
  torch::jit::Stack args = {q, k, v, sinks, causal, scale, layout, window_left, window_right,
                            softcap};
  int64_t addr = record_of(key, "flashjit_native::prepare_fwd", args);
  if (!addr) {
    auto got = package_op("flashjit::attention_train", args);
    return {got.at(0).toTensor(), got.at(1).toTensor()};
  }
  auto *e = reinterpret_cast<const fjn_entry *>(addr);
  if (sinks)
    fill(e->slots, &*sinks);
  auto out = at::empty(q.sizes(), q.options());
  auto lse = at::empty({e->lse_shape[0], e->lse_shape[1], e->lse_shape[2]},
                       q.options().dtype(at::kFloat));
  run_fwd(*e, q, k, v, out, lse);
  return {out, lse};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> attention_bwd(
    const at::Tensor &dout, const at::Tensor &q_in, const at::Tensor &k_in,
    const at::Tensor &v_in, const at::Tensor &out, const at::Tensor &lse,
    const std::optional<at::Tensor> &sinks, int64_t causal, double scale, int64_t layout,
    int64_t window_left, int64_t window_right, double softcap, bool deterministic,
    const std::optional<at::Tensor> &dlse) {
  std::string key = "b";
  for (const at::Tensor *t : {&dout, &q_in, &k_in, &v_in, &out, &lse})
    put(key, *t);
  put_options(key, sinks, causal, scale, layout, window_left, window_right, softcap);
  put(key, (int64_t)deterministic);
  torch::jit::Stack args = {dout,         q_in,          k_in,    v_in,          out,
                            lse,          sinks,         causal,  scale,         layout,
                            window_left,  window_right,  softcap, deterministic};
  int64_t addr = record_of(key, "flashjit_native::prepare_bwd", args);
  if (!addr) {
    // flashjit::attention_bwd's order: ..., softcap, sinks, deterministic,
    // the varlen arguments (none), dlse.
    torch::jit::Stack pkg = {dout,          q_in,          k_in,          v_in,
                             out,           lse,           causal,        scale,
                             layout,        window_left,   window_right,  softcap,
                             sinks,         deterministic, c10::IValue(), c10::IValue(),
                             c10::IValue(), (int64_t)0,    (int64_t)0,    dlse};
    auto got = package_op("flashjit::attention_bwd", pkg);
    return {got.at(0).toTensor(), got.at(1).toTensor(), got.at(2).toTensor(),
            got.at(3).toTensor()};
  }
  auto *e = reinterpret_cast<const fjn_entry *>(addr);
  at::Tensor q = e->copy[0] ? q_in.contiguous() : q_in;
  at::Tensor k = e->copy[1] ? k_in.contiguous() : k_in;
  at::Tensor v = e->copy[2] ? v_in.contiguous() : v_in;
  if (sinks)
    fill(e->slots, &*sinks);
  at::Tensor dq = e->zero ? at::zeros_like(q) : at::empty_like(q);
  at::Tensor dk = e->zero ? at::zeros_like(k) : at::empty_like(k);
  at::Tensor dv = e->zero ? at::zeros_like(v) : at::empty_like(v);
  at::Tensor dsinks = at::empty({sinks ? e->heads_q : 0}, q.options().dtype(at::kFloat));
  run_bwd(*e, q, k, v, out.contiguous(), dout.contiguous(), lse, dlse ? *dlse : at::Tensor(),
          dq, dk, dv, sinks ? dsinks.data_ptr() : nullptr);
  return {dq, dk, dv, dsinks};
}

// attention_train's autograd: the op below autograd forward, the
// backward op on its saved tensors.
struct TrainOp : public torch::autograd::Function<TrainOp> {
  static torch::autograd::variable_list forward(
      torch::autograd::AutogradContext *ctx, const at::Tensor &q, const at::Tensor &k,
      const at::Tensor &v, const std::optional<at::Tensor> &sinks, int64_t causal,
      double scale, int64_t layout, int64_t window_left, int64_t window_right,
      double softcap) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("flashjit_native::attention_train", "")
                         .typed<decltype(attention_train)>();
    at::Tensor out, lse;
    {
      at::AutoDispatchBelowADInplaceOrView below;
      std::tie(out, lse) = op.call(q, k, v, sinks, causal, scale, layout, window_left,
                                   window_right, softcap);
    }
    ctx->save_for_backward({q, k, v, out, lse, sinks ? *sinks : at::Tensor()});
    ctx->saved_data["ints"] = std::vector<int64_t>{causal, layout, window_left, window_right};
    ctx->saved_data["floats"] = std::vector<double>{scale, softcap};
    ctx->set_materialize_grads(false);
    return {out, lse};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext *ctx,
                                                 torch::autograd::variable_list grads) {
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("flashjit_native::attention_bwd", "")
                         .typed<decltype(attention_bwd)>();
    auto saved = ctx->get_saved_variables();
    torch::autograd::variable_list none(10);
    at::Tensor dout = grads[0], dlse = grads[1];
    if (!dout.defined() && !dlse.defined())
      return none;
    if (!dout.defined())  // a loss of the log-sum-exp alone
      dout = at::zeros_like(saved[3]);
    auto n = ctx->saved_data["ints"].toIntVector();
    auto f = ctx->saved_data["floats"].toDoubleVector();
    std::optional<at::Tensor> sinks;
    if (saved[5].defined())
      sinks = saved[5];
    std::optional<at::Tensor> dl;
    if (dlse.defined())
      dl = dlse;
    auto [dq, dk, dv, dsinks] =
        op.call(dout, saved[0], saved[1], saved[2], saved[3], saved[4], sinks, n[0], f[0], n[1],
                n[2], n[3], f[1], at::globalContext().deterministicAlgorithms(), dl);
    none[0] = dq;
    none[1] = dk;
    none[2] = dv;
    if (sinks)
      none[3] = dsinks;
    return none;
  }
};

std::tuple<at::Tensor, at::Tensor> attention_train_autograd(
    const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
    const std::optional<at::Tensor> &sinks, int64_t causal, double scale, int64_t layout,
    int64_t window_left, int64_t window_right, double softcap) {
  bool grad = false;
  if (at::GradMode::is_enabled())
    for (const at::Tensor *t : {&q, &k, &v})
      grad = grad || t->requires_grad();
  if (!grad && !(sinks && sinks->requires_grad() && at::GradMode::is_enabled())) {
    // No graph to record (a compiled graph's call runs so): no node, the
    // op below autograd (through the dispatcher: a fake tensor mode, say,
    // takes it there).
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("flashjit_native::attention_train", "")
                         .typed<decltype(attention_train)>();
    at::AutoDispatchBelowADInplaceOrView below;
    return op.call(q, k, v, sinks, causal, scale, layout, window_left, window_right, softcap);
  }
  auto r = TrainOp::apply(q, k, v, sinks, causal, scale, layout, window_left, window_right,
                          softcap);
  return {r[0], r[1]};
}

int64_t entry_bytes() { return (int64_t)sizeof(fjn_entry); }

// How many signatures the threads' tables have taken (the package's tests
// count them).
int64_t signatures() { return made.load(); }

// Empties this thread's table (the package's tests: their records call
// their own stubs).
int64_t forget() {
  int64_t n = (int64_t)table.size();
  table.clear();
  return n;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(flashjit_native, m) {
  m.def("attention_train(Tensor q, Tensor k, Tensor v, Tensor? sinks, int causal, "
        "float scale, int layout, int window_left, int window_right, float softcap) "
        "-> (Tensor, Tensor)");
  m.def("attention_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
        "Tensor? sinks, int causal, float scale, int layout, int window_left, "
        "int window_right, float softcap, bool deterministic, Tensor? dlse) "
        "-> (Tensor, Tensor, Tensor, Tensor)");
  m.def("prepare_fwd(Tensor q, Tensor k, Tensor v, Tensor? sinks, int causal, float scale, "
        "int layout, int window_left, int window_right, float softcap) -> int");
  m.def("prepare_bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
        "Tensor? sinks, int causal, float scale, int layout, int window_left, "
        "int window_right, float softcap, bool deterministic) -> int");
  m.def("entry_bytes() -> int", &entry_bytes);
  m.def("signatures() -> int", &signatures);
  m.def("forget() -> int", &forget);
}

TORCH_LIBRARY_IMPL(flashjit_native, Autograd, m) {
  m.impl("attention_train", &attention_train_autograd);
}

TORCH_LIBRARY_IMPL(flashjit_native, CUDA, m) {
  m.impl("attention_train", &attention_train);
  m.impl("attention_bwd", &attention_bwd);
}

// CPU: the package's tests, their tensors on the CPU and the library's
// calls stubbed.
TORCH_LIBRARY_IMPL(flashjit_native, CPU, m) {
  m.impl("attention_train", &attention_train);
  m.impl("attention_bwd", &attention_bwd);
}
