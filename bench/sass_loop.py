"""The instruction mix of a kernel's innermost loops that hold tensor-core
products, from its SASS: what a key tile costs each warp.

    flashjit emit --shape 4,16,4096,128 --dtype e4m3 --what cubin -o k.cubin
    nvdisasm -c k.cubin > k.sass        # the CUDA toolkit's (or Triton's copy)
    python3 bench/sass_loop.py k.sass [KERNEL_NAME]

For every loop (a branch back to an earlier label) of the kernel (the
last one in the file unless KERNEL_NAME names it) that holds a GMMA
instruction, innermost first: its static instruction count and the count
of each opcode (the part before the first '.').  Static counts: a branch
inside the loop (a tail's mask, a lazy rescale) counts whether it is
taken or not; docs/PERF.md says which paths a tile takes.
"""
import collections
import re
import sys


def kernels(text):
    """{name: [(address, opcode, operands)], ...} in file order."""
    out, cur, labels = {}, None, {}
    for line in text.split("\n"):
        m = re.match(r"^\.text\.([A-Za-z0-9_]+):", line)
        if m:
            cur = out.setdefault(m.group(1), ([], {}))
            continue
        if cur is None:
            continue
        m = re.match(r"^\s*\.(L_x_\d+):", line)
        if m:
            cur[1][m.group(1)] = len(cur[0])
            continue
        m = re.match(r"^\s*/\*([0-9a-f]+)\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*);", line)
        if m:
            cur[0].append((int(m.group(1), 16), m.group(3), m.group(4)))
    return out


def loops(ins, labels):
    """(first, last) index pairs of the loops that hold a GMMA, smallest first."""
    found = []
    for i, (_, op, rest) in enumerate(ins):
        t = re.search(r"\.(L_x_\d+)", rest) if op.startswith("BRA") else None
        if t and labels.get(t.group(1), i) < i:
            s = labels[t.group(1)]
            if any("GMMA" in x[1] for x in ins[s:i + 1]):
                found.append((s, i))
    return sorted(set(found), key=lambda se: se[1] - se[0])


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    ks = kernels(open(argv[1]).read())
    if not ks:
        sys.exit(f"{argv[1]}: no kernel's SASS (nvdisasm -c output expected)")
    name = argv[2] if len(argv) > 2 else list(ks)[-1]
    if name not in ks:
        sys.exit(f"{argv[1]}: no kernel {name}; it holds {', '.join(ks)}")
    ins, labels = ks[name]
    print(name)
    for s, e in loops(ins, labels):
        body = ins[s:e + 1]
        mix = collections.Counter(op.split(".")[0] for _, op, _ in body)
        gmma = sum(1 for _, op, _ in body if "GMMA" in op)
        print(f"  loop of {len(body)} instructions ({gmma} GMMA): "
              + ", ".join(f"{k} {v}" for k, v in mix.most_common(16)))


if __name__ == "__main__":
    main(sys.argv)
