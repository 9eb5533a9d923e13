"""scripts/matrix-vs.py: the cell-by-cell comparison of two `progbench matrix --json` runs."""

import json
import subprocess
import sys

from conftest import ROOT

SCRIPT = ROOT / "scripts" / "matrix-vs.py"


def run_stats(mean, p90, p99):
    return {"mean_jct": mean, "p90_jct": p90, "p99_jct": p99}


def matrix(program_means, floor=100.0):
    """A matrix file with one family: pressure -> [mean JCT per seed] for Program scheduling."""
    runs = []
    for pressure, means in program_means.items():
        for seed, mean in enumerate(means, start=1):
            runs.append(
                {
                    "family": "coding",
                    "pressure": pressure,
                    "seed": seed,
                    "floor": run_stats(floor, floor, floor),
                    "program": run_stats(mean, mean * 1.5, mean * 2.0),
                }
            )
    return {"cells": [], "runs": runs}


def compare(tmp_path, a, b):
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps(b))
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(pa), str(pb)], capture_output=True, text=True
    )


def test_ratios_spread_and_worst_seed_per_pressured_cell(tmp_path):
    a = matrix({"none": [99.0, 99.0], "heavy": [120.0, 140.0], "overload": [103.0, 103.0]})
    b = matrix({"none": [100.0, 100.0], "heavy": [140.0, 200.0], "overload": [102.0, 104.0]})
    out = compare(tmp_path, a, b)
    assert out.returncode == 0, out.stderr
    rows = [line for line in out.stdout.splitlines() if line.startswith("| coding")]
    # No row for the cell without pressure; one per pressured cell.
    assert len(rows) == 2, out.stdout
    heavy, overload = rows
    # Excess 20 and 40 against 40 and 100: means 30 and 70, ratio 0.43; per seed 0.50 and 0.40.
    assert "| 30.0 s | 70.0 s | 0.43× | 0.40–0.50 |" in heavy, heavy
    # Worst seed: 120 / 140 on the mean (and the same on p90 and p99 here).
    assert heavy.endswith("| 0.86 / 0.86 / 0.86 |"), heavy
    # B's excess is 3 s: nothing left to win, no ratio.
    assert "nothing to win" in overload, overload
    assert "≤ 0.5 in 1 cells, above it in 0, nothing to win in 1" in out.stdout


def test_runs_of_different_matrices_are_refused(tmp_path):
    a = matrix({"heavy": [120.0]})
    b = matrix({"heavy": [140.0]}, floor=90.0)
    out = compare(tmp_path, a, b)
    assert out.returncode != 0
    assert "floors differ" in out.stderr
    c = matrix({"heavy": [120.0, 130.0]})
    out = compare(tmp_path, a, c)
    assert out.returncode != 0
    assert "different cells" in out.stderr


def test_a_cell_with_dropped_programs_gets_no_ratio(tmp_path):
    a = matrix({"heavy": [110.0, 110.0], "overload": [150.0, 150.0]})
    b = matrix({"heavy": [140.0, 140.0], "overload": [200.0, 200.0]})
    # A's overload looks faster only because 3 Programs timed out in the queue on seed 2.
    a["runs"][3]["program"]["queue_timeouts"] = 3
    out = compare(tmp_path, a, b)
    assert out.returncode == 0, out.stderr
    heavy, overload = [line for line in out.stdout.splitlines() if line.startswith("| coding")]
    assert "0.25×" in heavy, heavy
    assert "| — (dropped Programs: A 3, B 0) | — |" in overload, overload
    assert "≤ 0.5 in 1 cells, above it in 0, nothing to win in 0" in out.stdout
    assert "Not compared: 1 cells where Programs timed out in the queue." in out.stdout
