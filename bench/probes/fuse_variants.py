#!/usr/bin/env python3
"""fuse_variants.py OUTDIR -- template folders (FLASHJIT_TEMPLATE_DIR) that
take parts of the dQ conversion's work out of the converting backward
kernel (attention_bwd_wgmma.cu's CONV), to find which part costs its time
(s26.sh's part fuseparts).  Every variant launches as the fused plan does
(FLASHJIT_BWD_FUSE=1: no postprocess), so its dQ is wrong except in
`fused`; only the times mean anything.
  D   no conversion work at all: no converter, no arrivals, no queue (the
      default's code with the converting kernel's shared memory)
  F1  the converter takes every step and counts its key tiles, but never
      converts (the arrivals and the queue stay)
  F2  F1 without the arrivals (no completion wait, fence or atomic: the
      writer queues every step with count 0)
  F3  F2 without the count (the converter only takes the queue's entries)
"""
import os
import shutil
import sys

out = sys.argv[1]
src = open("templates/attention_bwd_wgmma.cu").read()


def count_piece():
    i = src.index('{{ PC.piece(include("scheduler.cuh", { part = "kv_count"')
    return src[i:src.index("}}\n", i) + 3]


F1 = [("        if ((int)q4.z + 1 != count) {", "        if (true || (int)q4.z + 1 != count) {")]
F2 = F1 + [("  bulk_wait<0>();\n  fence_async_global();\n  // The tile's first turn word",
            "  conv_push(scq, full, late.x, late.y, 0);\n  if (late.x >= 0) return;\n  // The tile's first turn word")]
F3 = F2 + [(count_piece(), "        count = 0;\n")]
D = [("} else if (warp >= 2 && g.fuse) {", "} else if (warp >= 2 && g.fuse && false) {"),
     ("        if (g.fuse && !g.deterministic) {\n          // The step before",
      "        if (false && g.fuse && !g.deterministic) {\n          // The step before"),
     ("{% if CONV then %}\n        if (g.fuse) {\n", "{% if CONV then %}\n        if (false && g.fuse) {\n"),
     ("      if (g.fuse) {\n        if (!g.deterministic) fj::conv_late",
      "      if (false && g.fuse) {\n        if (!g.deterministic) fj::conv_late")]
for name, reps in (("D", D), ("F1", F1), ("F2", F2), ("F3", F3)):
    d = os.path.join(out, "tmpl-" + name)
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree("templates", d)
    s = src
    for a, b in reps:
        if s.count(a) != 1:
            sys.exit("fuse_variants.py: %s: %r found %d times" % (name, a[:50], s.count(a)))
        s = s.replace(a, b)
    open(os.path.join(d, "attention_bwd_wgmma.cu"), "w").write(s)
    print(d)
