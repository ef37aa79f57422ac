#!/usr/bin/env python3
"""gqa_descend_sim.py -- a list-scheduling model of the deterministic
backward's launch order and dQ turns under a causal mask with GQA
(attention_bwd_wgmma.cu's walks, scheduler.cuh's kv_rank, bwd_common.cuh's
kv_tile; gqa_descend.sh's prediction).  Blocks take the multiprocessors in
kv_tile's order (sections of KV heads as backward.c's section_of makes
them); each takes one step of its walk a round where its dQ tile's turn
has come (as many adds as its rank, each visible `lat` rounds after it was
made), so a round is a step's time.  The plain order: heads outer, query
tiles ascending, later key tiles first, launched last first; the
descending one (g.deterministic 3): query tiles descending, heads inner,
earlier key tiles first, launched first first.  Top-left causal, seq_q =
seq_kv, tiles of 64 queries and 128 keys.

  python3 bench/probes/gqa_descend_sim.py [--sms 132] [--lat 1] B,HQ/HKV,S ...
"""
import argparse


def launch_order(heads, tiles, section, last_first):
    """kv_tile's (KV head, key tile) of each block, in launch order."""
    order = []
    for lin in range(heads * tiles):
        s0 = lin // (section * tiles) * section
        inn = min(section, heads - s0)
        i = lin - s0 * tiles
        n = i // inn
        order.append((s0 + i % inn, tiles - 1 - n if last_first else n))
    return order


def walk(t, tiles, nqt, group, desc, ratio):
    """Key tile t's steps: (query head, query tile, rank)."""
    first = t * ratio  # its first query tile (causal top-left)
    nq = nqt - first
    steps = []
    for i in range(nq * group):
        if desc:
            wa, wc = divmod(i, group)
            steps.append((wc, nqt - 1 - wa, t))  # every earlier tile walks it
        else:
            wa, wc = divmod(i, nq)
            qt = first + wc
            steps.append((wa, qt, min(tiles - 1, qt // ratio) - t))
    return steps


def makespan(batch, hq, hkv, seq, desc, sms, lat):
    tiles, nqt, ratio, group = seq // 128, seq // 64, 2, hq // hkv
    heads = batch * hkv
    section = max(1, min((4 * sms + tiles - 1) // tiles, heads)) if group > 1 else 1
    order = launch_order(heads, tiles, section, not desc)
    steps = {(h, t): walk(t, tiles, nqt, group, desc, ratio) for h in range(heads) for t in range(tiles)}
    turn, pending, slots, at = {}, [], [None] * sms, {}
    launched = done = rounds = 0
    while done < len(order):
        keep = []
        for when, key in pending:
            if when <= rounds:
                turn[key] = turn.get(key, 0) + 1
            else:
                keep.append((when, key))
        pending = keep
        for r in range(sms):
            if slots[r] is None and launched < len(order):
                slots[r] = order[launched]
                at[slots[r]] = 0
                launched += 1
            b = slots[r]
            if b is None:
                continue
            st = steps[b]
            if at[b] < len(st):
                h, qt, rank = st[at[b]]
                key = (b[0], h, qt)
                if turn.get(key, 0) >= rank:
                    pending.append((rounds + lat, key))
                    at[b] += 1
            if at[b] == len(st):
                slots[r] = None
                done += 1
        rounds += 1
    return rounds


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shapes", nargs="*", default=["1,32/8,8192", "4,32/8,2048", "2,16/4,8192"])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--lat", type=int, default=1, help="rounds before an add is seen")
    a = ap.parse_args()
    for s in a.shapes:
        b, h, seq = s.split(",")
        hq, hkv = (int(x) for x in h.split("/"))
        plain = makespan(int(b), hq, hkv, int(seq), False, a.sms, a.lat)
        desc = makespan(int(b), hq, hkv, int(seq), True, a.sms, a.lat)
        print(f"{s}: plain {plain} rounds, descending {desc} ({desc / plain:.2f}x)")


if __name__ == "__main__":
    main()
