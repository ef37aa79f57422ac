"""compare_dumps.py OUT REF OTHER...: the tensors bench/mla_compare.py
--dump saved under OUT/dump_REF beside those of the same name under each
OUT/dump_OTHER -- bit for bit ("identical" or "DIFFER") and the largest
absolute difference, with the reference's largest magnitude."""
import glob
import os
import sys

import torch

out, ref_tag, others = sys.argv[1], sys.argv[2], sys.argv[3:]
for f in sorted(glob.glob(os.path.join(out, "dump_" + ref_tag, "*.pt"))):
    ref = torch.load(f)
    for other in others:
        g = os.path.join(out, "dump_" + other, os.path.basename(f))
        if not os.path.exists(g):
            continue
        x = torch.load(g)
        same = "identical" if torch.equal(ref, x) else "DIFFER"
        d = (x.float() - ref.float()).abs().max().item()
        print(f"outputs {os.path.basename(f)} {ref_tag} vs {other}: {same}, max |diff| {d:.3e} "
              f"(|O| max {ref.float().abs().max().item():.3e})")
