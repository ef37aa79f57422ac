"""A small GPT trained with flashjit's attention beside the same GPT with SDPA.

The model is examples/gpt_flashjit.py's (causal, grouped-query heads, q, k
and v as strided views of one projection), trained with float32 weights
under bfloat16 autocast by AdamW, once with torch's
scaled_dot_product_attention and once with flashjit.attention (forward and
backward), from the same weights on the same batches.  The data is
synthetic and learnable: rows of a sparse random Markov chain of lag 2
(--lag), where the token at position t is one of --branch successors
(fixed, random) of the token at t - 2.  A bigram model learns nothing from
it; a model whose attention finds the position before the last takes the
loss from ln(vocab) towards ln(branch).

A third copy trains with the attention written out in float32
(gpt_flashjit.py's ReferenceAttention): the same attention rounded
differently.  Where the model finds the position before the last, the
loss curve is chaotic: small rounding differences move the step where
the loss falls by a hundred steps either way (three runs on H100s at 300
steps: flashjit's fell first in two, 2.0 nats below SDPA's at step 217,
and last in one; SDPA's ended at 1.96, 3.89 and 1.62), so neither the
curves nor their ends are a test.  The checks are:
  - the gradients at the first step (the same weights and batch) and at
    the last (flashjit's trained weights, the last batch, each attention
    in turn): for every parameter, the relative difference between
    flashjit's gradient and the float32 run's at most twice SDPA's from
    the float32 run's, plus 0.001 -- a wrong backward shows there;
  - every loss finite, and flashjit's last 10 steps' mean at least
    ln(--branch) - --tol, the data's entropy, which no causal model
    beats (a mask that leaks later tokens does).
The three runs' losses at the end are printed beside them.
Measured on the CPU with a smaller model (dim 256, 2 layers, seq 128;
vocab, branch, lag as here), whose loss fell from 4.90 to 1.52 in 300
steps, steepest near step 110: gpt_flashjit.py's written-out attention
left SDPA's curve by at most 0.031 (at the steep part, 0.003 elsewhere).
The script prints the three loss curves (every --log-every steps) and the
median time of a training step (forward, backward, gradient clipping and
AdamW; after --warmup steps) of each.  Those times come from runs one
after the other, minutes apart, and a host-bound step's time drifts with
the host (H100 runs of the same code: flashjit's step 0.96x, 1.00x and
1.34x SDPA's); the step is then timed again with the runs interleaved
(--time-rounds rounds of --time-steps steps each, SDPA's and flashjit's
steps alternating one by one, on the trained weights, every kernel
already built): the median of the rounds' ratios is the comparison to
read.

    python3 examples/gpt_train.py [--steps 300] [--compile] [--device cuda:0]

Needs PyTorch and a CUDA GPU; the package (pip install ./python, or
PYTHONPATH=python FLASHJIT_LIB=build/libflashjit.so from a build).  Exits
0 when the checks pass, 1 when one does not, 2 when it cannot run here.
"""
import argparse
import copy
import math
import os
import statistics
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

HERE = os.path.dirname(os.path.abspath(__file__))


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    ap.add_argument("--compile", action="store_true", help="torch.compile both models")
    ap.add_argument("--device", default="cuda", help="a CUDA device (default cuda)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=128)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--branch", type=int, default=4, help="successors of a token in the data")
    ap.add_argument("--lag", type=int, default=2,
                    help="a token follows the token this many positions back (default 2)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tol", type=float, default=0.1,
                    help="how far below ln(--branch) flashjit's end may be (nats)")
    ap.add_argument("--log-every", type=int, default=0, help="default: about 15 lines")
    ap.add_argument("--time-rounds", type=int, default=6,
                    help="interleaved timing rounds after training (default 6; 0: none)")
    ap.add_argument("--time-steps", type=int, default=20,
                    help="steps a run takes in each timing round (default 20)")
    ap.add_argument("--warmup", type=int, default=-1,
                    help="steps left out of the median time (default min(10, steps/4))")
    a = ap.parse_args(argv)
    if min(a.steps, a.batch, a.branch, a.lag, a.time_steps) < 1 or min(a.seq, a.vocab) < 2 \
            or a.time_rounds < 0:
        ap.error("--steps, --batch, --branch, --lag and --time-steps must be at least 1, --seq "
                 "and --vocab at least 2, --time-rounds at least 0")
    if a.dim % a.heads or a.heads % a.kv_heads:
        ap.error(f"--dim {a.dim} must be a multiple of --heads {a.heads}, and --heads of "
                 f"--kv-heads {a.kv_heads}")
    if a.log_every <= 0:
        a.log_every = max(1, a.steps // 15)
    if a.warmup < 0:
        a.warmup = min(10, a.steps // 4)
    a.warmup = min(a.warmup, a.steps - 1)
    return a


def cannot_run(why):
    print(f"gpt_train.py: {why}", file=sys.stderr)
    return 2


def setup(a):
    """The device and examples/gpt_flashjit.py (the model; it imports
    flashjit), or (why it cannot run here, None)."""
    if torch is None:
        return "needs PyTorch (pip install torch)", None
    try:
        dev = torch.device(a.device)
    except RuntimeError as e:
        return f"--device {a.device!r} is not a device ({e})", None
    if dev.type != "cuda":
        return f"--device {a.device}: flashjit trains on a CUDA device (cuda or cuda:N)", None
    if not torch.cuda.is_available():
        return "needs a CUDA GPU: torch.cuda.is_available() is False", None
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        return (f"--device {a.device}: this machine has {torch.cuda.device_count()} CUDA "
                "devices"), None
    sys.path.insert(0, HERE)
    import gpt_flashjit
    return dev, gpt_flashjit


def dataset(a, device):
    """(inputs, targets), each (steps, batch, seq): rows of a Markov chain
    of lag --lag (a token's successors are those of the token --lag places
    back), the targets the inputs shifted by one; the same for every run
    of a seed."""
    g = torch.Generator().manual_seed(a.seed + 1)
    rows = a.steps * a.batch
    successors = torch.randint(0, a.vocab, (a.vocab, a.branch), generator=g)
    pick = torch.randint(0, a.branch, (rows, a.seq + 1), generator=g)
    x = torch.randint(0, a.vocab, (rows, a.seq + 1), generator=g)
    for t in range(a.lag, a.seq + 1):
        x[:, t] = successors[x[:, t - a.lag], pick[:, t]]
    x = x.view(a.steps, a.batch, a.seq + 1)
    return x[..., :-1].contiguous().to(device), x[..., 1:].contiguous().to(device)


def lr_factor(step, a):
    """Linear warm-up over a tenth of the steps (at most 30), then a cosine
    down to a tenth of --lr."""
    warm = max(1, min(30, a.steps // 10))
    if step < warm:
        return (step + 1) / warm
    t = (step - warm) / max(1, a.steps - warm)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * t))


class Trainer:
    """A model with its AdamW and schedule; step(i) trains on batch i (past
    the last batch, the first again)."""

    def __init__(self, model, inputs, targets, a, device):
        self.model, self.inputs, self.targets, self.a, self.device = (
            model, inputs, targets, a, device)
        self.opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95),
                                     weight_decay=0.01, fused=True)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: lr_factor(s, a))
        self.run = torch.compile(model) if a.compile else model

    def step(self, i):
        """(loss, seconds): one synchronised training step on batch i."""
        a, n = self.a, len(self.inputs)
        torch.cuda.synchronize(self.device)
        t = time.perf_counter()
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            logits = self.run(self.inputs[i % n])
        loss = F.cross_entropy(logits.float().view(-1, a.vocab), self.targets[i % n].view(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()
        torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - t
        return loss.item(), seconds


def train(model, inputs, targets, a, device):
    """Trains model in place over the --steps batches; returns (losses,
    seconds a step)."""
    tr = Trainer(model, inputs, targets, a, device)
    out = [tr.step(i) for i in range(a.steps)]
    return [x for x, _ in out], [t for _, t in out]


def models(gf, a, device):
    """{name: model}: SDPA's, flashjit's and the float32 reference's, the
    same weights, attention swapped."""
    torch.manual_seed(a.seed)
    base = gf.GPT(gf.Config(a)).to(device)
    for p in base.parameters():
        if p.dim() > 1:
            torch.nn.init.normal_(p, std=0.02)
    fj = gf.swap_attention(copy.deepcopy(base), gf.FlashjitAttention)
    ref = gf.swap_attention(copy.deepcopy(base), gf.ReferenceAttention)
    return {"sdpa": base.train(), "flashjit": fj.train(), "float32": ref.train()}


def grads_at(model, inputs, targets, step, a, device):
    """{parameter name: its gradient} for batch `step`, the weights left
    as they are; through torch.compile with --compile, as training ran."""
    run = torch.compile(model) if a.compile else model
    with torch.autocast(device.type, dtype=torch.bfloat16):
        logits = run(inputs[step])
    F.cross_entropy(logits.float().view(-1, a.vocab), targets[step].view(-1)).backward()
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


def interleaved_times(runs, inputs, targets, a, device):
    """[(sdpa ms, flashjit ms)] a round: each run's median step over
    --time-steps steps, SDPA's and flashjit's steps alternating one by
    one (AB, then BA, ...), after one untimed step each, so that a drift
    of the host's speed falls on both alike."""
    if a.time_rounds == 0:
        return []
    names = ("sdpa", "flashjit")
    tr = {n: Trainer(runs[n], inputs, targets, a, device) for n in names}
    for n in names:
        tr[n].step(0)
    rounds, i = [], 1
    for _ in range(a.time_rounds):
        sec = {n: [] for n in names}
        for _ in range(a.time_steps):
            for n in (names if i % 2 else names[::-1]):
                sec[n].append(tr[n].step(i)[1])
            i += 1
        rounds.append(tuple(statistics.median(sec[n]) * 1e3 for n in names))
    return rounds


def interleaved_report(rounds):
    """The lines that print interleaved_times' rounds."""
    if not rounds:
        return []
    ratios = [f / s for s, f in rounds]
    return [f"interleaved ({len(rounds)} rounds, steps alternating): median step sdpa "
            f"{statistics.median(s for s, _ in rounds):.2f} ms, flashjit "
            f"{statistics.median(f for _, f in rounds):.2f} ms; flashjit / sdpa per round "
            + " ".join(f"{x:.2f}" for x in ratios) + f", median {statistics.median(ratios):.2f}x"]


def rel(x, y):
    """|x - y| / |y| (Frobenius norms; 0 where both are 0)."""
    d, n = (x - y).norm().item(), y.norm().item()
    return d / n if n else d


def grad_diffs(runs, inputs, targets, step, a, device):
    """{"sdpa" or "flashjit": {parameter: relative difference of its
    gradient from the float32 run's}} at batch `step`, the runs' weights
    as they are."""
    g = {n: grads_at(m, inputs, targets, step, a, device) for n, m in runs.items()}
    return {n: {p: rel(g[n][p], g["float32"][p]) for p in g[n]} for n in ("sdpa", "flashjit")}


def grad_check(when, grads):
    """(passed, line): flashjit's gradients against float32's, beside SDPA's."""
    fjg, sdg = grads["flashjit"], grads["sdpa"]
    # A NaN difference (weights or gradients gone NaN) is over any bound.
    bad = [n for n in fjg if not fjg[n] <= 2 * sdg[n] + 1e-3]
    worst = bad[0] if bad else max(fjg, key=lambda n: fjg[n] - 2 * sdg[n])
    return (not bad, f"{when}: gradients against float32's, relative: flashjit's "
            f"{max(fjg.values()):.2e} at most, SDPA's {max(sdg.values()):.2e}; nearest the "
            f"bound {worst} (flashjit {fjg[worst]:.2e}, SDPA {sdg[worst]:.2e})" +
            (f"; {len(bad)} over 2 x SDPA's + 0.001: {', '.join(bad[:4])}" if bad else ""))


def checks(a, curves, first, last):
    """[(passed, line)]: the checks of the docstring.  first, last:
    grad_diffs at the first step and at flashjit's trained weights."""
    out = [grad_check("the first step", first),
           grad_check("flashjit's trained weights, the last batch", last)]
    finite = all(math.isfinite(x) for c in curves.values() for x in c)
    end = statistics.mean(curves["flashjit"][-10:])
    floor = math.log(a.branch) - a.tol
    out.append((finite and end >= floor, ("every loss finite; " if finite else "a loss is not "
                "finite; ") + f"flashjit's last 10 steps' mean {end:.3f}, at least ln(branch) - "
                f"tol = {floor:.3f} (no causal model goes lower)"))
    return out


def report(a, curves, times, first, last, rounds=()):
    names = list(curves)
    print(f"{'step':>6} " + " ".join(f"{n + ' loss':>14}" for n in names) +
          f" {'|fj-sdpa|':>10} {'|f32-sdpa|':>10}")
    for s in range(a.steps):
        if s % a.log_every == 0 or s == a.steps - 1:
            row = [curves[n][s] for n in names]
            print(f"{s:6d} " + " ".join(f"{x:14.4f}" for x in row) +
                  f" {abs(curves['flashjit'][s] - curves['sdpa'][s]):10.4f}"
                  f" {abs(curves['float32'][s] - curves['sdpa'][s]):10.4f}")
    med = {n: statistics.median(times[n][a.warmup:]) * 1e3 for n in names}
    for n in names:
        ratio = "" if n == "sdpa" else f"  {med[n] / med['sdpa']:.2f}x sdpa's"
        print(f"{n:9s} median step {med[n]:8.2f} ms (forward, backward, AdamW; steps "
              f"{a.warmup}-{a.steps - 1}){ratio}")
    for line in interleaved_report(rounds):
        print(line)
    end = {n: statistics.mean(c[-10:]) for n, c in curves.items()}
    print("the last 10 steps' mean loss: " + ", ".join(f"{n} {x:.3f}" for n, x in end.items()) +
          f" (ln(vocab) {math.log(a.vocab):.3f}, ln(branch) {math.log(a.branch):.3f}; "
          "where the loss falls is chaotic: not a check)")
    results = checks(a, curves, first, last)
    for ok, line in results:
        print(("  ok    " if ok else "  FAIL  ") + line)
    ok = all(r[0] for r in results)
    print("PASS: flashjit's gradients are as near float32's as SDPA's, at the start and trained"
          if ok else "FAIL: a check above failed")
    return 0 if ok else 1


def main(argv=None):
    a = parse(argv)
    device, gf = setup(a)
    if gf is None:
        return cannot_run(device)
    torch.cuda.set_device(device)
    inputs, targets = dataset(a, device)
    runs = models(gf, a, device)
    print(f"model: {a.layers} layers, dim {a.dim}, heads {a.heads}/{a.kv_heads}, seq {a.seq}, "
          f"batch {a.batch}, vocab {a.vocab}; bfloat16 autocast, AdamW lr {a.lr}, "
          f"{a.steps} steps{', torch.compile' if a.compile else ''}; "
          f"{torch.cuda.get_device_name(device)}")
    curves, times = {}, {}
    try:
        first = grad_diffs(runs, inputs, targets, 0, a, device)
        for name, model in runs.items():
            curves[name], times[name] = train(model, inputs, targets, a, device)
        trained = runs["flashjit"].state_dict()
        for m in runs.values():
            m.load_state_dict(trained)
        last = grad_diffs(runs, inputs, targets, a.steps - 1, a, device)
        rounds = interleaved_times(runs, inputs, targets, a, device)
    except (gf.flashjit.NoDevice, gf.flashjit.LibraryNotFound) as e:
        return cannot_run(f"flashjit cannot run here: {e}")
    return report(a, curves, times, first, last, rounds)


if __name__ == "__main__":
    sys.exit(main())
