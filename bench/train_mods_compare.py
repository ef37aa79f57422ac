"""Issue 33's bar: the forward and backward of each score and mask
modification beside FlexAttention's, on one GPU, in one process.

The seven cases of ../shared/anchors/train_flex_anchors.py (their table:
bench/mods_cases.py, which bench/mods_compare.py's forward shares), shape
(4, 16, 4096, 128) bf16, q, k, v and dO normal.  For each case:

- forward + backward: one flashjit.attention() call and
  torch.autograd.grad(o, (q, k, v), dO), against the same through
  torch.compile(flex_attention) with its create_block_mask BlockMask
  (bar: Flex / flashjit >= 1.5 on every case); the backward alone too,
  the forward's graph retained (as bench/bwd_compare.py times it).  The
  document case runs with the library's block mask (flashjit.block_mask);
  where the backward refuses it, the row keeps the error and is timed
  without one (its case name says so);
- a modification's backward cost: flashjit's plain causal call timed right
  after the case, then the case once more (the clocks drift over the
  run's minutes of Flex), the mean of the case's two times over the plain
  one (bar <= 1.15, the softcap <= 1.25; for softcap, ALiBi and the bias
  table).  The window and the documents are masks: their backward's
  fraction of the causal one and their block density are reported;
- the gradients: flashjit's dq, dk, dv against Flex's (max |diff|, and
  the largest |Flex gradient| beside them);
- cuDNN (SDPA) forward + backward and backward for the full and causal
  cases, a reference;
- the first forward + backward of each modification (bar <= 1.5 s): on a
  fresh flashjit context whose disk cache is an empty directory (the
  package's context for the GPU replaced, its cached calls forgotten; no
  kernel package), wall time to the gradients (the document case's block
  mask built first, its time apart too).  Twice: a fresh context per case
  (everything from nothing: the layout probe, the pre- and postprocess
  kernels, the case's forward and backward), and one fresh context that
  ran a plain causal forward + backward first, so that each case's first
  call compiles its own kernels alone.  What a process pays once (loading
  NVRTC and the driver) it has paid by then.

Times: median of --iters CUDA-event timed calls after 3 untimed ones.
Prints one `train` line a case (`train first` for the first calls),
writes train_mods_compare.json (after every case) and
train_mods_compare.md to --out, and prints the table in docs/PERF.md's
shape at the end.  --list prints the cases as each side runs them, with
no GPU.

Run on the GPU machine from the repository root, with this build's library:
    PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so \\
        python3 bench/train_mods_compare.py [--quick] [--iters 20] [--cases softcap,alibi] \\
        [--out DIR]
or `PARTS=trainmods bash bench/device_check.sh COMMIT` (TRAINMODS_ARGS).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import flashjit
from flashjit import _calls as fj_calls
from flashjit import _core as fj_core

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mods_cases import attention_kwargs, bench, make_cases, modified, pick  # noqa: E402

DEVICE = "cuda"
B, H, S, D = 4, 16, 4096, 128
SHAPE = f"{B},{H},{S},{D} bf16"
PLAIN = {"causal": "top_left"}  # the first calls' plain call
BAR_FLEX = 1.5      # Flex / flashjit, forward + backward
BAR_COST = 1.15     # a score modification's backward over the plain one
BAR_SOFTCAP = 1.25
BAR_FIRST_S = 1.5   # a new modification's first forward + backward
JSON_NAME = "train_mods_compare.json"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="Issue 33's bar: forward and backward of each "
                                 "score and mask modification beside FlexAttention's.")
    ap.add_argument("--iters", type=int, default=None,
                    help="timed calls per measurement (default 20; 5 with --quick)")
    ap.add_argument("--quick", action="store_true", help="5 timed calls unless --iters says")
    ap.add_argument("--cases", default="",
                    help="a comma-separated subset by key or name (default: all): "
                         "full, causal, softcap, alibi, relbias, window, document")
    ap.add_argument("--out", default=os.environ.get("OUT", "."), help="where the files go")
    ap.add_argument("--commit", default=None, help="the table's commit (default: git's HEAD)")
    ap.add_argument("--list", action="store_true", help="print the cases and exit (no GPU)")
    a = ap.parse_args(argv)
    if a.iters is None:
        a.iters = 5 if a.quick else 20
    if a.iters < 1:
        ap.error(f"--iters {a.iters}: at least 1")
    try:
        pick(make_cases(1, 1, 8, "cpu"), a.cases)  # the names, before any GPU work
    except ValueError as e:
        ap.error(f"--cases: {e}")
    return a


def describe(c):
    """Case c as both sides run it, one line (the tensors by dtype and shape)."""
    kw = {n: {p: f"{t.dtype}{tuple(t.shape)}" for p, t in v.items()} if n == "params" else v
          for n, v in attention_kwargs(c).items()}
    mask = c.flex_mask.__name__ if c.flex_mask else None
    return (f"{c.key}: {c.name}  flashjit {kw}{' + block_mask' if c.block_mask else ''}  "
            f"| Flex score_mod={c.flex_score.__name__} mask_mod={mask}")


def one_line(ex):
    """An exception as one line for a row (no "|": it goes into a table)."""
    text = str(ex).splitlines()[0] if str(ex) else ""
    return f"{type(ex).__name__}: {text}".replace("|", "/")[:200]


# ---- timing -------------------------------------------------------------------------


def fwd_bwd(attn, q, k, v, do):
    """One forward and the gradients of q, k and v: a training step's attention."""
    return torch.autograd.grad(attn(q, k, v), (q, k, v), do)


def timings(attn, q, k, v, do, iters, fwd_into=None, key=None):
    """(forward + backward, backward) of attn in µs: the first a forward
    and torch.autograd.grad each call, the second the grad alone with the
    forward's graph retained.  With fwd_into, the forward alone too (its
    graph built, as in training), as fwd_into[key]: fwd+bwd less bwd
    came out the same for every mask at 2745797, which no forward does."""
    both = bench(lambda: fwd_bwd(attn, q, k, v, do), iters)
    o = attn(q, k, v)
    bwd = bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), iters)
    if fwd_into is not None:
        fwd_into[key] = round(bench(lambda: attn(q, k, v), iters), 1)
    return round(both, 1), round(bwd, 1)


def fj_attn(kw):
    return lambda q, k, v: flashjit.attention(q, k, v, **kw)


def block_density(bm):
    """The fraction of a flashjit.BlockMask's blocks that its lists keep."""
    kept = bm.kv_num.sum() + (bm.full_num.sum() if bm.full_num is not None else 0)
    return round(float(kept) / (bm.batch * bm.heads * bm.q_blocks * bm.kv_blocks), 4)


def library_block_mask(c, q, k):
    return flashjit.block_mask(q, k, mask_mod=c.mask_mod, params=c.params,
                               causal=attention_kwargs(c)["causal"])


# ---- one case -------------------------------------------------------------------------


def flashjit_side(c, q, k, v, do, iters, row):
    """Times case c in flashjit into row; returns (its attention, its
    gradients).  A block-mask case whose backward raises is run without
    the block mask, the error in the row."""
    kw = attention_kwargs(c)
    if c.block_mask:
        bm = library_block_mask(c, q, k)
        row["fj_block_density"] = block_density(bm)
        try:
            fwd_bwd(fj_attn({**kw, "block_mask": bm}), q, k, v, do)
            kw["block_mask"] = bm
        except Exception as ex:  # the backward does not take it (yet): without it
            row["block_mask_err"] = one_line(ex)
            row["case"] += " (without block mask)"
    attn = fj_attn(kw)
    grads = fwd_bwd(attn, q, k, v, do)
    row["fj_fwd_bwd_us"], row["fj_bwd_us"] = timings(attn, q, k, v, do, iters, row, "fj_fwd_us")
    return attn, grads


def plain_side(c, attn, q, k, v, do, iters, row):
    """flashjit's plain call on c's causal mask (or none) right after case
    c, then c once more: a score modification's cost over it, a mask's
    fraction of it."""
    plain = fj_attn({"causal": attention_kwargs(c)["causal"]})
    row["plain_fwd_bwd_us"], row["plain_bwd_us"] = timings(plain, q, k, v, do, iters)
    row["fj_again_fwd_bwd_us"], row["fj_again_bwd_us"] = timings(attn, q, k, v, do, iters)
    both = (row["fj_fwd_bwd_us"] + row["fj_again_fwd_bwd_us"]) / 2 / row["plain_fwd_bwd_us"]
    bwd = (row["fj_bwd_us"] + row["fj_again_bwd_us"]) / 2 / row["plain_bwd_us"]
    if c.score_cost:
        row["bwd_cost"], row["fwd_bwd_cost"] = round(bwd, 3), round(both, 3)
        row["bwd_cost_bar"] = BAR_SOFTCAP if c.key == "softcap" else BAR_COST
    else:
        row["bwd_over_causal"], row["fwd_bwd_over_causal"] = round(bwd, 3), round(both, 3)


def flex_side(c, flex, q, k, v, do, iters, row):
    """Times case c through the compiled flex_attention with its BlockMask
    into row; returns its gradients."""
    bm = None
    if c.flex_mask is not None:
        bm = create_block_mask(c.flex_mask, B=None, H=None, Q_LEN=S, KV_LEN=S, device=DEVICE)
        row["density"] = round(1.0 - bm.sparsity() / 100.0, 4)

    def attn(q_, k_, v_):
        return flex(q_, k_, v_, score_mod=c.flex_score, block_mask=bm)

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    grads = fwd_bwd(attn, q, k, v, do)
    torch.cuda.synchronize()
    row["flex_first_s"] = round(time.perf_counter() - t0, 2)  # its compiles
    row["flex_fwd_bwd_us"], row["flex_bwd_us"] = timings(attn, q, k, v, do, iters, row, "flex_fwd_us")
    return grads


def cudnn_side(c, q, k, v, do, iters, row):
    """cuDNN's SDPA forward + backward and backward (full and causal)."""
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        attn = lambda q_, k_, v_: F.scaled_dot_product_attention(  # noqa: E731
            q_, k_, v_, is_causal=c.causal)
        row["cudnn_fwd_bwd_us"], row["cudnn_bwd_us"] = timings(attn, q, k, v, do, iters)


def grad_diffs(got, want, row):
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        row[f"{name}_max_diff"] = float((g.float() - w.float()).abs().max())
    row["flex_grad_max_abs"] = max(float(w.float().abs().max()) for w in want)


def run_case(c, flex, q, k, v, do, iters):
    row = {"case": c.name, "key": c.key, "shape": SHAPE}
    fj_grads = flex_grads = attn = None
    try:
        attn, fj_grads = flashjit_side(c, q, k, v, do, iters, row)
        if modified(c):
            plain_side(c, attn, q, k, v, do, iters, row)
    except Exception as ex:  # report, go on
        row["fj_err"] = one_line(ex)
    try:
        flex_grads = flex_side(c, flex, q, k, v, do, iters, row)
    except Exception as ex:
        row["flex_err"] = one_line(ex)
    if "fj_fwd_bwd_us" in row and "flex_fwd_bwd_us" in row:
        row["flex_over_fj"] = round(row["flex_fwd_bwd_us"] / row["fj_fwd_bwd_us"], 3)
        row["flex_bwd_over_fj"] = round(row["flex_bwd_us"] / row["fj_bwd_us"], 3)
    if fj_grads is not None and flex_grads is not None:
        grad_diffs(fj_grads, flex_grads, row)
    if not modified(c):
        try:
            cudnn_side(c, q, k, v, do, iters, row)
        except Exception as ex:
            row["cudnn_err"] = one_line(ex)
        if "cudnn_fwd_bwd_us" in row and "fj_fwd_bwd_us" in row:
            row["cudnn_over_fj"] = round(row["cudnn_fwd_bwd_us"] / row["fj_fwd_bwd_us"], 3)
    return row


# ---- first calls -------------------------------------------------------------------------

CACHE_ENV, PACKAGE_ENV = "FLASHJIT_CACHE_DIR", "FLASHJIT_PACKAGE_DIR"


def fresh_context(index):
    """Replaces the package's context of GPU `index` by a new one whose
    disk cache is a new, empty directory and which reads no kernel
    package, and forgets the cached calls of every thread (they hold the
    old context; the backward's are autograd's device thread's), so that
    the next call compiles what it needs.  The old context is left alone
    (never destroyed: nothing here owns it).  Returns (the directory, ms
    to create the context)."""
    cache = tempfile.mkdtemp(prefix="fj-train-first-")
    os.environ[CACHE_ENV] = cache   # read by fj_ctx_create
    os.environ.pop(PACKAGE_ENV, None)
    with fj_core._lock:
        fj_core._gpu_ctxs.pop(index, None)
    fj_calls.tables = fj_calls._Tables()
    t0 = time.perf_counter()
    fj_core.gpu_context(index)
    return cache, round((time.perf_counter() - t0) * 1e3, 1)


def first_call(kw, bm_case, q, k, v, do):
    """The wall times of one first forward + backward with attention()'s
    kw (the block mask of bm_case built first where it is not None)."""
    row = {}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if bm_case is not None:
        kw = {**kw, "block_mask": library_block_mask(bm_case, q, k)}
        torch.cuda.synchronize()
        row["block_mask_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    t1 = time.perf_counter()
    o = flashjit.attention(q, k, v, **kw)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    torch.autograd.grad(o, (q, k, v), do)
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    row["first_fwd_ms"] = round((t2 - t1) * 1e3, 1)
    row["first_bwd_ms"] = round((t3 - t2) * 1e3, 1)
    row["first_fwd_bwd_s"] = round(t3 - t0, 3)
    return row


def first_calls(cases, bm_ok, q, k, v, do):
    """Each modified case's first forward + backward: on a fresh context
    of its own ("fresh"), then all on one fresh context after a plain
    causal call ("after_plain", the plain call's row key "plain").
    bm_ok: the keys whose forward + backward took the block mask."""
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    saved = {n: os.environ.get(n) for n in (CACHE_ENV, PACKAGE_ENV)}
    rows = []

    def attempt(c, context, fresh):
        row = {"kind": "first", "context": context, "key": c.key if c else "plain",
               "case": c.name if c else "causal (the context's first call)"}
        bm_case = c if c is not None and c.block_mask and c.key in bm_ok else None
        if c is not None and c.block_mask and bm_case is None:
            row["case"] += " (without block mask)"
        try:
            if fresh:
                row["cache_dir"], row["ctx_create_ms"] = fresh_context(index)
            row.update(first_call(attention_kwargs(c) if c else PLAIN, bm_case, q, k, v, do))
            row["bar_s"] = BAR_FIRST_S
        except Exception as ex:  # report, go on
            row["err"] = one_line(ex)
        rows.append(row)
        print("train first " + " ".join(f"{k_}={v_}" for k_, v_ in row.items()), flush=True)

    mods = [c for c in cases if modified(c)]
    try:
        for c in mods:
            attempt(c, "fresh", True)
        if mods:
            attempt(None, "after_plain", True)
            for c in mods:
                attempt(c, "after_plain", False)
    finally:
        for n, val in saved.items():
            if val is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = val
    return rows


# ---- the table ----------------------------------------------------------------------------


def bar_text(value, bar, at_least):
    if value is None:
        return ""
    met = value >= bar if at_least else value <= bar
    return f"{'≥' if at_least else '≤'} {bar}: {'met' if met else 'missed'}"


def cost_text(r):
    if "bwd_cost" in r:
        return f"**{r['bwd_cost']}** of causal (fwd+bwd {r['fwd_bwd_cost']})"
    if "bwd_over_causal" in r:
        dens = f", density {r['density']}" if "density" in r else ""
        return f"{r['bwd_over_causal']} of causal{dens}"
    return ""


def first_of(firsts, key, context):
    """The first-call row of case `key` on `context`, or {}."""
    return next((f for f in firsts if f["key"] == key and f["context"] == context), {})


def first_text(firsts, key):
    """ "fresh / after a plain call" seconds of case `key`."""
    got = [first_of(firsts, key, c) for c in ("fresh", "after_plain")]
    if not any(got):
        return ""
    return " / ".join(str(f.get("first_fwd_bwd_s", "?")) for f in got)


HEADER = ("| case | flashjit fwd+bwd / bwd µs | bwd cost or fraction | bar "
          "| Flex fwd+bwd / bwd µs | against Flex (fwd+bwd / bwd) | bar "
          "| cuDNN fwd+bwd / bwd µs | first fwd+bwd s (fresh / after plain) | bar "
          "| dq / dk / dv max diff vs Flex | date · commit · cmd |")


def table_row(r, firsts, stamp):
    """Row r (a case's) as a line of the table."""
    def pair(a, b):
        return f"{r[a]} / {r[b]}" if a in r and b in r else ""
    cost_bar = bar_text(r["bwd_cost"], r["bwd_cost_bar"], False) if "bwd_cost" in r else ""
    against = (f"**{r['flex_over_fj']}** / {r['flex_bwd_over_fj']}" if "flex_over_fj" in r
               else r.get("fj_err", r.get("flex_err", "")))
    fresh = first_of(firsts, r["key"], "fresh").get("first_fwd_bwd_s")
    diffs = (" / ".join(f"{r[n + '_max_diff']:.3g}" for n in ("dq", "dk", "dv"))
             if "dq_max_diff" in r else "")
    cells = [r["case"], pair("fj_fwd_bwd_us", "fj_bwd_us"), cost_text(r), cost_bar,
             pair("flex_fwd_bwd_us", "flex_bwd_us"), against,
             bar_text(r.get("flex_over_fj"), BAR_FLEX, True),
             pair("cudnn_fwd_bwd_us", "cudnn_bwd_us"), first_text(firsts, r["key"]),
             bar_text(fresh, BAR_FIRST_S, False), diffs, stamp]
    return "| " + " | ".join(str(x) for x in cells) + " |"


def table(rows, firsts, stamp):
    """The markdown table of the run, in docs/PERF.md's shape, and its notes."""
    lines = [f"Forward + backward beside FlexAttention ({SHAPE}; torch.compile(flex_attention) "
             "with its block mask, cuDNN where SDPA has the case; medians; a modification's "
             "first forward + backward on a fresh context with an empty disk cache: its own, "
             "and after a plain causal call; the context's creation apart, ctx_create_ms in "
             "the JSON):", "", HEADER, "|" + "---|" * 12]
    lines += [table_row(r, firsts, stamp) for r in rows]
    plain = first_of(firsts, "plain", "after_plain")
    if plain:
        lines += ["", f"The plain causal call, first on its fresh context (layout probe "
                      f"included): {plain.get('first_fwd_bwd_s', plain.get('err'))} s."]
    grads = [r["flex_grad_max_abs"] for r in rows if "flex_grad_max_abs" in r]
    if grads:
        lines += ["", f"Flex's gradients reach |{max(grads):.3g}| at most."]
    for r in rows:
        if "block_mask_err" in r:
            lines += ["", f"{r['case']}: forward + backward with the library's block mask "
                          f"raised ({r['block_mask_err']}); the row is the case without it."]
    return "\n".join(lines)


def commit_of(given):
    if given:
        return given
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip() or "?"
    except (OSError, subprocess.CalledProcessError):
        return "?"


# ---- main ---------------------------------------------------------------------------------


def run_meta(a):
    """What the run ran on, for its first line and its JSON."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"device": props.name, "sms": props.multi_processor_count,
            "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
            "flashjit": flashjit.library_version(), "commit": commit_of(a.commit),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "shape": SHAPE,
            "iters": a.iters, PACKAGE_ENV: os.environ.get(PACKAGE_ENV, ""),
            "FLASHJIT_JIT_TIERS": os.environ.get("FLASHJIT_JIT_TIERS", "")}


def main(argv=None):
    a = parse_args(argv)
    if a.list:
        for c in pick(make_cases(B, H, S, "cpu"), a.cases):
            print(describe(c))
        return
    meta = run_meta(a)
    print("train " + " ".join(f"{k_}={v_}" for k_, v_ in meta.items()), flush=True)
    dev = torch.device(DEVICE)
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    do = torch.randn(B, H, S, D, device=dev, dtype=torch.bfloat16)
    cases = pick(make_cases(B, H, S, dev), a.cases)
    # Each case is a new function to Dynamo: room for all of them.
    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(64, getattr(torch._dynamo.config, limit)))
    # The backward alone is timed with the forward's graph retained, which
    # a compiled backward that donates its saved buffers refuses.
    if hasattr(torch._functorch.config, "donated_buffer"):
        torch._functorch.config.donated_buffer = False
    flex = torch.compile(flex_attention, dynamic=False)
    os.makedirs(a.out, exist_ok=True)
    rows, firsts = [], []

    def dump():
        with open(os.path.join(a.out, JSON_NAME), "w") as fh:
            json.dump({**meta, "cases": rows, "first_calls": firsts}, fh, indent=1)

    for c in cases:
        rows.append(run_case(c, flex, q, k, v, do, a.iters))
        print("train " + " ".join(f"{k_}={v_}" for k_, v_ in rows[-1].items()), flush=True)
        dump()
        torch.cuda.empty_cache()
    bm_ok = {r["key"] for r in rows if "block_mask_err" not in r}
    firsts += first_calls(cases, bm_ok, q, k, v, do)
    dump()
    text = table(rows, firsts, f"{meta['date'][:10]} · {meta['commit']} · train_mods_compare.py")
    with open(os.path.join(a.out, "train_mods_compare.md"), "w") as fh:
        fh.write(text + "\n")
    print("\n" + text, flush=True)


if __name__ == "__main__":
    main()
