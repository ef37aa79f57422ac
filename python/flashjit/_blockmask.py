"""flashjit.BlockMask: which key blocks each query block computes, for
attention(..., block_mask=).

FlexAttention's BlockMask layout (fj_block_mask in include/flashjit.h):
per query block of block_q rows, the key blocks of block_kv keys that the
mask keeps in part (kv_num, kv_indices: the kernel applies the mask
expression there, element by element) and, optionally, those it keeps
whole (full_num, full_indices: no mask expression; the causal mask, the
window and the sequence ends still apply).  Key blocks in neither list are
never loaded.  int32 tensors, row-major:

    kv_num     (batch, heads, q_blocks)              partial key blocks per query block
    kv_indices (batch, heads, q_blocks, kv_blocks)   their indices, first kv_num used
    full_num, full_indices                           the same for full blocks

and the same blocks per key block (FlexAttention's q_num_blocks,
q_indices, full_q_num_blocks, full_q_indices), which the backward walks:

    q_num      (batch, heads, kv_blocks)             partial query blocks per key block
    q_indices  (batch, heads, kv_blocks, q_blocks)   their indices, ascending
    full_q_num, full_q_indices                       the same for full blocks

batch is 1 (one list for every batch index) or the problem's batch, heads
1 or its heads_q; q_blocks = ceil(seq_q / block_q), kv_blocks =
ceil(seq_kv / block_kv); block sizes 64, 128 or 256.  flashjit.block_mask()
builds one from a mask on the GPU; BlockMask(...) wraps the caller's own
lists; BlockMask.from_flex takes a FlexAttention BlockMask's.  A mask
without the transposed lists runs forward only (a call through it whose
inputs require grad is refused).

Imported only where torch imports.
"""
import torch

from . import _capi as capi
from . import _problem as pr

_WHO = "flashjit.BlockMask"
_NAMES = ("kv_num", "kv_indices", "full_num", "full_indices",
          "q_num", "q_indices", "full_q_num", "full_q_indices")
# BlockMask._key's tokens: what of a mask a call's key holds -> an object
# of its own (unique however threads interleave; cleared past _TOKENS_MAX,
# when a token still in a key stays unique: no other object has it).
_TOKENS = {}
_TOKENS_MAX = 4096


class BlockMask:
    """A block mask for attention(..., block_mask=): the int32 lists of
    key blocks per query block (FlexAttention's BlockMask layout; the
    module's docstring and include/flashjit.h's fj_block_mask say it
    whole).

    BlockMask(kv_num, kv_indices, full_num=None, full_indices=None, *,
    block_q=128, block_kv=128, q_num=None, q_indices=None, full_q_num=None,
    full_q_indices=None) wraps the caller's own tensors (not copied: they
    must live as long as this object and are read by every call it is
    passed to): int32, contiguous, on one device, kv_num (batch, heads,
    q_blocks) and kv_indices (batch, heads, q_blocks, kv_blocks), the full
    pair of the same shapes or neither.  Counts are clamped to 0..kv_blocks
    and an index outside 0..kv_blocks - 1 reads no keys: a wrong list gives
    wrong results, never a read outside the tensors.  Each key block should
    appear at most once in a query block's two lists.  The transposed
    lists, for the backward: q_num (batch, heads, kv_blocks) and q_indices
    (batch, heads, kv_blocks, q_blocks), and full_q_num, full_q_indices of
    the same shapes where full_num and full_indices are given; they must
    describe the same blocks (the backward walks them, the forward the
    others).

    A repeated attention() call finds the mask's part of its key once
    (_key: the lists' shapes, strides, dtypes, devices), again where a list
    is another tensor or has changed in place (its version counter moved;
    inference-mode lists, which have none, each call); a list's .data
    replaced is not seen -- set the attribute.

    flashjit.block_mask(...) builds one from a mask expression on the GPU.
    Attributes: block_q, block_kv, batch, heads, q_blocks, kv_blocks, the
    eight tensors (None where absent), device, and seq_q / seq_kv (the
    lengths it was built for; None for the caller's own lists, which fit
    every length of those blocks).
    """

    def __init__(self, kv_num, kv_indices, full_num=None, full_indices=None, *,
                 block_q=128, block_kv=128, q_num=None, q_indices=None, full_q_num=None,
                 full_q_indices=None):
        self.block_q = _block_size("block_q", block_q)
        self.block_kv = _block_size("block_kv", block_kv)
        _check_lists(kv_num, kv_indices, full_num, full_indices, q_num, q_indices,
                     full_q_num, full_q_indices)
        self.kv_num, self.kv_indices = kv_num, kv_indices
        self.full_num, self.full_indices = full_num, full_indices
        self.q_num, self.q_indices = q_num, q_indices
        self.full_q_num, self.full_q_indices = full_q_num, full_q_indices
        self.batch, self.heads, self.q_blocks = (int(n) for n in kv_num.shape)
        self.kv_blocks = int(kv_indices.shape[3])
        self.device = kv_num.device
        self.seq_q = self.seq_kv = None
        self._buf = None  # a built mask's one buffer, which the four tensors view

    @classmethod
    def from_flex(cls, mask):
        """The lists of a FlexAttention BlockMask
        (torch.nn.attention.flex_attention.create_block_mask): its
        kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, the
        transposed q_num_blocks, q_indices, full_q_num_blocks,
        full_q_indices (the backward's; None where it lacks them) and
        BLOCK_SIZE, made contiguous where they are not (a copy then)."""
        missing = [a for a in ("kv_num_blocks", "kv_indices", "BLOCK_SIZE")
                   if not hasattr(mask, a)]
        if missing:
            raise TypeError(f"{_WHO}.from_flex: a {type(mask).__name__} is not a FlexAttention "
                            f"BlockMask (it has no {', '.join(missing)})")
        size = mask.BLOCK_SIZE
        if isinstance(size, int):
            size = (size, size)
        lists = [getattr(mask, a, None) for a in ("kv_num_blocks", "kv_indices",
                                                  "full_kv_num_blocks", "full_kv_indices",
                                                  "q_num_blocks", "q_indices",
                                                  "full_q_num_blocks", "full_q_indices")]
        lists = [t.contiguous() if isinstance(t, torch.Tensor) else t for t in lists]
        return cls(*lists[:4], block_q=size[0], block_kv=size[1], **_transposed(lists[4:]))

    @property
    def shape(self):
        """(batch, heads, q_blocks, kv_blocks)."""
        return self.batch, self.heads, self.q_blocks, self.kv_blocks

    def to(self, device):
        """The same lists on device (copies; this object where they are
        there already)."""
        device = torch.device(device)
        if device == self.device:
            return self
        moved = [None if t is None else t.to(device) for t in self._tensors()]
        out = BlockMask(*moved[:4], block_q=self.block_q, block_kv=self.block_kv,
                        **_transposed(moved[4:]))
        out.seq_q, out.seq_kv = self.seq_q, self.seq_kv
        return out

    def _tensors(self):
        """The eight lists in _NAMES' order (None where absent)."""
        return (self.kv_num, self.kv_indices, self.full_num, self.full_indices,
                self.q_num, self.q_indices, self.full_q_num, self.full_q_indices)

    def __setattr__(self, name, value):
        # Any attribute set: _key finds the mask's part of a key again.
        if name != "_sig":
            object.__setattr__(self, "_sig", None)
        object.__setattr__(self, name, value)

    def __getstate__(self):
        # A token is this process's (_TOKENS): never pickled or copied.
        state = dict(self.__dict__)
        state["_sig"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        object.__setattr__(self, "_sig", None)

    def _key(self):
        """(token, lists): what a repeated attention() call's key holds of
        this mask -- an object that stands for its block sizes and each
        list's presence, shape, strides, dtype and device (masks alike in
        these share it: _token) -- and the lists present, in _NAMES'
        order.  Kept while each list is the same tensor (its TensorImpl:
        an attribute set, vars() written or torch.utils.swap_tensors are
        seen) at the same version (any in-place change: resize_, set_ and
        transpose_ among them, values too).  Lists with an inference-mode
        tensor have no version counter: their token is found each call."""
        lists = self._tensors()
        ids = tuple(None if t is None else t._cdata for t in lists)
        sig = self._sig  # (ids, versions or None, token, present)
        if sig is not None and sig[0] == ids:
            if sig[1] is None:  # inference lists: nothing to compare
                return _token(self.block_q, self.block_kv, lists), sig[3]
            versions = _versions(lists)
            if versions == sig[1]:
                return sig[2], sig[3]
        else:
            versions = _versions(lists)
        token = _token(self.block_q, self.block_kv, lists)
        present = tuple(t for t in lists if t is not None)
        self._sig = (ids, versions, token, present)
        return token, present

    @property
    def has_backward(self):
        """Whether the transposed lists the backward walks are here."""
        return self.q_num is not None

    def _check_problem(self, batch, heads_q, seq_q, seq_kv, device, who):
        """Refuses, in one line naming the value and the rule, a mask that
        does not fit the problem (the library's rule, fj_block_mask)."""
        if self.device != device:
            raise ValueError(f"{who}: block_mask is on {self.device}; the attention inputs "
                             f"are on {device}")
        if self.batch not in (1, batch):
            raise ValueError(f"{who}: block_mask has batch {self.batch}; it must be 1 (one "
                             f"list for every batch index) or the problem's {batch}")
        if self.heads not in (1, heads_q):
            raise ValueError(f"{who}: block_mask has heads {self.heads}; it must be 1 (one "
                             f"list for every head) or the problem's heads_q {heads_q}")
        qb, kb = pr.blocks(seq_q, self.block_q), pr.blocks(seq_kv, self.block_kv)
        if (self.q_blocks, self.kv_blocks) != (qb, kb):
            raise ValueError(f"{who}: block_mask is {self.q_blocks} x {self.kv_blocks} blocks "
                             f"of {self.block_q} x {self.block_kv}; seq_q {seq_q} and seq_kv "
                             f"{seq_kv} need {qb} x {kb}")

    def __repr__(self):
        full = "" if self.full_num is None else " with full blocks"
        full += "" if self.q_num is None else ", transposed"
        built = "" if self.seq_q is None else f" for seq_q {self.seq_q}, seq_kv {self.seq_kv}"
        return (f"<flashjit.BlockMask {self.batch}x{self.heads}x{self.q_blocks}x"
                f"{self.kv_blocks} of blocks {self.block_q}x{self.block_kv}{full}{built} on "
                f"{self.device}>")

    @classmethod
    def _of_buffer(cls, buf, raw, seq_q, seq_kv):
        """A built mask: raw (fj_block_mask, from fj_block_mask_build) points
        into buf (a uint8 tensor); the eight tensors are views of buf."""
        base, size = buf.data_ptr(), buf.numel()
        rows = (raw.batch, raw.heads, raw.q_blocks)
        cols = (raw.batch, raw.heads, raw.kv_blocks)
        lists = (rows, rows + (raw.kv_blocks,), cols, cols + (raw.q_blocks,))

        def view(ptr, shape, name):
            n = 1
            for d in shape:
                n *= d
            off = -1 if ptr is None else ptr - base
            if off < 0 or off % 4 or off + 4 * n > size:
                raise RuntimeError(f"{_WHO}: the library's {name} ({ptr}) is not within the "
                                   f"{size}-byte buffer at {base}")
            return buf[off:off + 4 * n].view(torch.int32).view(shape)

        tensors = [view(getattr(raw, name), lists[i // 4 * 2 + i % 2], name)
                   for i, name in enumerate(_NAMES)]
        self = cls(*tensors[:4], block_q=raw.block_q, block_kv=raw.block_kv,
                   **_transposed(tensors[4:]))
        self._buf, self.seq_q, self.seq_kv = buf, seq_q, seq_kv
        return self


def _versions(lists):
    """The lists' version counters (None for an absent list), or None where
    one is an inference tensor (it has none: reading it raises, slowly --
    BlockMask._key reads them again only where the lists are other
    tensors)."""
    try:
        return tuple(None if t is None else t._version for t in lists)
    except RuntimeError:
        return None


def _token(block_q, block_kv, lists):
    """The token of a mask of these block sizes and lists (_TOKENS)."""
    what = (block_q, block_kv) + tuple(
        None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in lists)
    token = _TOKENS.get(what)
    if token is None:
        if len(_TOKENS) >= _TOKENS_MAX:
            _TOKENS.clear()
        token = _TOKENS.setdefault(what, object())
    return token


def _block_size(what, value):
    try:
        return pr.block_size(what, value)
    except (TypeError, ValueError) as e:
        raise type(e)(str(e).replace("flashjit:", f"{_WHO}:", 1)) from None


def _transposed(lists):
    """The transposed lists (q_num, q_indices, full_q_num, full_q_indices)
    as BlockMask's keyword arguments."""
    return dict(zip(_NAMES[4:], lists))


def _check_pair(given, num, idx, what):
    """Counts and indices go together."""
    if (given[num] is None) != (given[idx] is None):
        have, lack = (num, idx) if given[idx] is None else (idx, num)
        raise ValueError(f"{_WHO}: {have} is given but {lack} is not: give both ({what}) or "
                         "neither")


def _check_lists(kv_num, kv_indices, full_num, full_indices, q_num=None, q_indices=None,
                 full_q_num=None, full_q_indices=None):
    given = dict(zip(_NAMES, (kv_num, kv_indices, full_num, full_indices, q_num, q_indices,
                              full_q_num, full_q_indices)))
    for name, t in given.items():
        if t is None and name in ("kv_num", "kv_indices"):
            raise TypeError(f"{_WHO}: {name} is None; the partial blocks' counts and indices "
                            "are required")
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{_WHO}: {name} is a {type(t).__name__}, not a torch.Tensor")
    _check_pair(given, "full_num", "full_indices", "full blocks")
    _check_pair(given, "q_num", "q_indices", "the transposed lists")
    _check_pair(given, "full_q_num", "full_q_indices", "full blocks of the transposed lists")
    if q_num is None and full_q_num is not None:
        raise ValueError(f"{_WHO}: full_q_num is given but q_num is not: the transposed lists "
                         "need their partial blocks' counts and indices")
    if q_num is not None and (full_num is None) != (full_q_num is None):
        have, lack = ("full_num", "full_q_num") if full_q_num is None else (
            "full_q_num", "full_num")
        raise ValueError(f"{_WHO}: {have} is given but {lack} is not: full blocks need their "
                         "lists in both directions")
    for name, t in given.items():
        if t is None:
            continue
        if t.dtype != torch.int32:
            raise TypeError(f"{_WHO}: {name} has dtype {t.dtype}; it must be torch.int32")
        if t.device != kv_num.device:
            raise ValueError(f"{_WHO}: {name} is on {t.device} and kv_num on "
                             f"{kv_num.device}; the lists must be on one device")
        if not t.is_contiguous():
            raise ValueError(f"{_WHO}: {name} is not contiguous (strides {tuple(t.stride())}); "
                             "call .contiguous()")
    if kv_num.dim() != 3:
        raise ValueError(f"{_WHO}: kv_num has {kv_num.dim()} dimensions "
                         f"{tuple(kv_num.shape)}; it takes 3: (batch, heads, q_blocks)")
    if kv_indices.dim() != 4 or tuple(kv_indices.shape[:3]) != tuple(kv_num.shape):
        want = ", ".join(str(n) for n in kv_num.shape)
        raise ValueError(f"{_WHO}: kv_indices has shape {tuple(kv_indices.shape)}; with kv_num "
                         f"{tuple(kv_num.shape)} it must be ({want}, kv_blocks)")
    for name, dim in zip(("batch", "heads", "q_blocks", "kv_blocks"),
                         tuple(kv_indices.shape)):
        if dim < 1:
            raise ValueError(f"{_WHO}: {name} {dim} is below 1 (kv_indices has shape "
                             f"{tuple(kv_indices.shape)})")
        if dim > 2 ** 31 - 1:
            raise ValueError(f"{_WHO}: {name} {dim} does not fit a C int")
    b, h, qb, kb = (int(n) for n in kv_indices.shape)
    shapes = {"full_num": ((b, h, qb), "kv_num's"), "full_indices": ((b, h, qb, kb), "kv_indices's"),
              "q_num": ((b, h, kb), "(batch, heads, kv_blocks)"),
              "q_indices": ((b, h, kb, qb), "(batch, heads, kv_blocks, q_blocks)"),
              "full_q_num": ((b, h, kb), "q_num's"), "full_q_indices": ((b, h, kb, qb), "q_indices's")}
    for name, (want, why) in shapes.items():
        t = given[name]
        if t is not None and tuple(t.shape) != want:
            raise ValueError(f"{_WHO}: {name} has shape {tuple(t.shape)}; it must be {want}, "
                             f"{why}")


def struct_of(block_q, block_kv, *lists):
    """The fj_block_mask of checked lists (the eight in _NAMES' order, None
    where absent; pointers into the tensors, which the caller keeps alive
    for the call)."""
    kv_num, kv_indices = lists[0], lists[1]
    b, h, qb = kv_num.shape
    return capi.BlockMask(block_q, block_kv, b, h, qb, kv_indices.shape[3],
                          *(None if t is None else t.data_ptr() for t in lists))


# The bytes of a built mask's buffer for its dimensions, as
# fj_block_mask_size counts them: the four count arrays (rows and columns),
# then (16-byte aligned) the four index arrays.  For the tests' cross-check
# of the library.
def buffer_bytes(batch, heads, q_blocks, kv_blocks):
    rows, cols = batch * heads * q_blocks, batch * heads * kv_blocks
    return (2 * (rows + cols) * 4 + 15) // 16 * 16 + 4 * rows * kv_blocks * 4

