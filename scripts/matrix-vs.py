#!/usr/bin/env python3
"""Compares Program scheduling in two `progbench matrix --json` files, cell by cell.

Both files must come from the same matrix (same families, pressures, seeds and KV sizes; only
`--program-config` differs), so each (family, pressure, seed) has the same floor in both. Prints a
markdown row per pressured cell: A's and B's excess above the floor (mean over the seeds), A ÷ B,
the per-seed range of that ratio, and the worst seed's mean / p90 / p99 ratio. A cell where B's
excess is under MIN_EXCESS seconds has nothing left to win and gets no ratio. A cell where either
side dropped Programs (queue timeouts) gets no ratio either: the dropped ones left its mean.

Usage: scripts/matrix-vs.py A.json B.json
"""

import json
import sys

MIN_EXCESS = 5.0


def runs(path):
    with open(path) as f:
        data = json.load(f)
    return {(r["family"], r["pressure"], r["seed"]): r for r in data["runs"]}


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = runs(sys.argv[1]), runs(sys.argv[2])
    if a.keys() != b.keys():
        sys.exit("the two files hold different cells or seeds")
    cells = {}
    for key in a:
        fa, fb = a[key]["floor"]["mean_jct"], b[key]["floor"]["mean_jct"]
        if abs(fa - fb) > 1e-6:
            sys.exit(f"{key}: the floors differ ({fa} against {fb}): not the same matrix")
        cells.setdefault(key[:2], []).append(key)
    print("| cell | A's excess | B's excess | A ÷ B | per seed | worst seed: mean / p90 / p99 |")
    print("|---|---|---|---|---|---|")
    met = short = nothing = dropped = 0
    for (family, pressure), keys in cells.items():
        if pressure == "none":
            continue
        ex_a, ex_b, per_seed, worst = [], [], [], [0.0, 0.0, 0.0]
        lost_a = lost_b = 0
        for k in keys:
            ra, rb, floor = a[k]["program"], b[k]["program"], a[k]["floor"]["mean_jct"]
            lost_a += ra.get("queue_timeouts", 0)
            lost_b += rb.get("queue_timeouts", 0)
            ex_a.append(ra["mean_jct"] - floor)
            ex_b.append(rb["mean_jct"] - floor)
            if ex_b[-1] >= MIN_EXCESS:
                per_seed.append(ex_a[-1] / ex_b[-1])
            for i, m in enumerate(("mean_jct", "p90_jct", "p99_jct")):
                worst[i] = max(worst[i], ra[m] / rb[m])
        mean_a, mean_b = sum(ex_a) / len(ex_a), sum(ex_b) / len(ex_b)
        dropped_here = bool(lost_a or lost_b)
        if dropped_here:
            ratio, dropped = f"— (dropped Programs: A {lost_a}, B {lost_b})", dropped + 1
        elif mean_b < MIN_EXCESS:
            ratio, nothing = "— (nothing to win)", nothing + 1
        else:
            r = mean_a / mean_b
            ratio = f"{r:.2f}×"
            met, short = met + (r <= 0.5), short + (r > 0.5)
        spread = f"{min(per_seed):.2f}–{max(per_seed):.2f}" if per_seed and not dropped_here else "—"
        print(
            f"| {family} {pressure} | {mean_a:.1f} s | {mean_b:.1f} s | {ratio} | {spread} | "
            f"{worst[0]:.2f} / {worst[1]:.2f} / {worst[2]:.2f} |"
        )
    print(f"\nA ÷ B ≤ 0.5 in {met} cells, above it in {short}, nothing to win in {nothing}.")
    if dropped:
        print(f"Not compared: {dropped} cells where Programs timed out in the queue.")


if __name__ == "__main__":
    main()
