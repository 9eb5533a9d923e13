#!/usr/bin/env python3
"""Pools `progbench compare --json` files (one per seed, each of one or more rounds) into one
excess ratio: program-router's mean JCT above each round's floor over vllm-router's.

Each file must have run `pr-program`, `vr-program` and the issue's floor `pr-hash-unbounded-kv`
(`--variants pr-program,pr-hash-unbounded-kv,vr-program`). A round counts where all three ran
cleanly and the peer sits at least MIN_EXCESS seconds above the floor (closer, nothing is left to
win and the ratio means nothing; such a file is listed, not pooled). Prints a markdown row
per file (its label is the file name): ours, the peer and the floor (mean over its rounds), the
ratio per round, the file's pooled ratio, the mean / p90 / p99 ratios ours ÷ the peer and both
token hits; then the ratio pooled over every file (Σ ours' excess ÷ Σ the peer's), the median
file's ratio and how many rounds were at or under GOAL.

`--ours VARIANT` pools another program-router variant of the same files in place of
`pr-program`, e.g. the clairvoyant bound (`--ours pr-clairvoyant`).

Usage: scripts/compare-pool.py [--ours VARIANT] FILE.json [FILE.json ...]
"""

import json
import os
import statistics
import sys

OURS, PEER, FLOOR = "PrProgram", "VrProgram", "PrHashUnboundedKv"
GOAL = 0.5
MIN_EXCESS = 5.0


def rounds(path):
    """(round, {variant: run}) for each round of `path` where all three ran cleanly."""
    try:
        with open(path) as f:
            runs = json.load(f)["runs"]
        by_round = {}
        for r in runs:
            if r.get("ok"):
                by_round.setdefault(r.get("round", 1), {})[r["variant"]] = r
        full = [(k, v) for k, v in sorted(by_round.items()) if all(x in v for x in (OURS, PEER, FLOOR))]
        for _, v in full:
            for run in v.values():
                for figure in ("mean_jct", "p90_jct", "p99_jct", "server_token_hit"):
                    float(run[figure])
        return full
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as e:
        sys.exit(f"{path}: not a `progbench compare --json` file ({type(e).__name__}: {e})")


def mean(xs):
    return sum(xs) / len(xs)


def tail(rs, figure):
    """Ours ÷ the peer in `figure`, the mean over rounds; a dash where the peer has none."""
    ratios = [v[OURS][figure] / v[PEER][figure] for _, v in rs if v[PEER][figure] > 0]
    return f"{mean(ratios):.2f}" if ratios else "—"


def main():
    global OURS
    files = sys.argv[1:]
    if files[:1] == ["--ours"]:
        if len(files) < 2 or not files[1].startswith("pr-"):
            sys.exit("--ours takes a program-router variant, e.g. --ours pr-clairvoyant")
        # As `progbench compare --json` names variants: pr-clairvoyant -> PrClairvoyant.
        OURS = "".join(w.capitalize() for w in files[1].split("-"))
        files = files[2:]
    if not files:
        sys.exit(__doc__)
    print("| file | ours / the peer / floor (s) | ratio per round | pooled | mean, p90, p99 ours ÷ peer | hit ours / peer |")
    print("|---|---|---|---|---|---|")
    total_ours = total_peer = 0.0
    per_file, per_round = [], []
    for path in files:
        full = rounds(path)
        rs = [(k, v) for k, v in full if v[PEER]["mean_jct"] - v[FLOOR]["mean_jct"] >= MIN_EXCESS]
        if not full:
            print(f"| {os.path.basename(path)} | no round with all three runs | | | | |")
            continue
        if not rs:
            gaps = ", ".join(f"{v[PEER]['mean_jct'] - v[FLOOR]['mean_jct']:+.1f} s" for _, v in full)
            print(f"| {os.path.basename(path)} | nothing to win: the peer {gaps} from the floor | | | | |")
            continue
        ours = sum(v[OURS]["mean_jct"] - v[FLOOR]["mean_jct"] for _, v in rs)
        peer = sum(v[PEER]["mean_jct"] - v[FLOOR]["mean_jct"] for _, v in rs)
        total_ours += ours
        total_peer += peer
        ratios = [
            (v[OURS]["mean_jct"] - v[FLOOR]["mean_jct"]) / (v[PEER]["mean_jct"] - v[FLOOR]["mean_jct"])
            for _, v in rs
        ]
        per_round += ratios
        per_file.append(ours / peer)
        m = {k: mean([v[var]["mean_jct"] for _, v in rs]) for k, var in (("o", OURS), ("p", PEER), ("f", FLOOR))}
        tails = ", ".join(tail(rs, f) for f in ("mean_jct", "p90_jct", "p99_jct"))
        hit = f"{100 * mean([v[OURS]['server_token_hit'] for _, v in rs]):.1f} / {100 * mean([v[PEER]['server_token_hit'] for _, v in rs]):.1f} %"
        print(
            f"| {os.path.basename(path)} | {m['o']:.1f} / {m['p']:.1f} / {m['f']:.1f} | "
            f"{', '.join(f'{r:.2f}×' for r in ratios)} | {ours / peer:.2f}× | {tails} | {hit} |"
        )
    if total_peer <= 0:
        sys.exit(f"no file has a round with all three runs and the peer ≥ {MIN_EXCESS} s above the floor")
    met = sum(r <= GOAL for r in per_round)
    print(
        f"\npooled over {len(per_file)} files, {len(per_round)} rounds: {total_ours / total_peer:.3f}× "
        f"(median file {statistics.median(per_file):.2f}×; {met} of {len(per_round)} rounds ≤ {GOAL}×)"
    )


if __name__ == "__main__":
    main()
