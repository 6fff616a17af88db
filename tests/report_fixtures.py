"""Synthetic inputs of the report's equal-accuracy pages, built against the contract of
issue 16 (headline.csv columns, target.json keys), independent of the analysis layer."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import hvdscale.analysis.stats as _stats
from hvdscale.analysis.columns import HEADLINE_COLUMNS

# The stats helper's branch defines CI_METHOD (issue 16); until it is merged the tests
# supply a placeholder (tests only: the report imports it without a fallback).
if not hasattr(_stats, "CI_METHOD"):
    _stats.CI_METHOD = "placeholder-bootstrap-method"
CI_METHOD = _stats.CI_METHOD


def headline_row(**over) -> dict:
    """One headline.csv row: 2 workers at batch 75 reaching the target in every repeat;
    speedup_ttt = epoch_speedup x epochs_ratio x fixed_factor (1.0 unless given),
    retained_fraction = ttt / epoch."""
    row = dict(
        partition="local",
        framework="horovod-tf",
        backend="mpi",
        precision="fp32",
        compile="off",
        batch_per_worker=75,
        workers=2,
        tuned=False,
        epoch_speedup=1.8,
        epoch_lo=1.7,
        epoch_hi=1.9,
        epochs_ratio=0.75,
        fixed_factor=1.0,
        speedup_ttt_lo=1.2,
        speedup_ttt_hi=1.7,
        reached=5,
        total=5,
        diverged=0,
        base_reached=5,
        base_total=5,
        base_diverged=0,
        b_simple=1200.0,
        b_simple_lo=500.0,  # holds the critical batch 600 an epochs ratio of 0.90 implies
        b_simple_hi=2500.0,
        critical_batch=1200.0,
        predicted_epochs_ratio=0.94,
        note="",
        ci_method=CI_METHOD,
    )
    row.update(over)
    row.setdefault("global_batch", row["batch_per_worker"] * row["workers"])
    if "speedup_ttt" not in row:
        row["speedup_ttt"] = row["epoch_speedup"] * row["epochs_ratio"] * row["fixed_factor"]
    if "retained_fraction" not in row:
        e, t = row["epoch_speedup"], row["speedup_ttt"]
        row["retained_fraction"] = t / e if math.isfinite(t) and math.isfinite(e) else math.nan
    return row


def censored_row(reached: int, total: int = 5, **over) -> dict:
    """A configuration whose median time to target does not exist (censored)."""
    return headline_row(
        reached=reached,
        total=total,
        speedup_ttt=math.nan,
        speedup_ttt_lo=math.nan,
        speedup_ttt_hi=math.nan,
        epochs_ratio=math.nan,
        fixed_factor=math.nan,
        note=f"{total - reached}/{total} censored: no median",
        **over,
    )


def write_headline(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=HEADLINE_COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow(
                {k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            )
    return path


def target_spec(mode: str = "calibrated") -> dict:
    if mode == "absolute":
        return {
            "mode": "absolute",
            "value": 0.02,
            "percent": None,
            "calibration_runs": [],
            "best_val_losses": [],
            "median_best_val_loss": None,
        }
    runs = [f"local_mpi_n1_w1_b75_lrnone_cal_r{k}" for k in range(3)]
    return {
        "mode": "calibrated",
        "value": 0.0105,
        "percent": 5,
        "calibration_runs": runs,
        "best_val_losses": [0.0099, 0.01, 0.0102],
        "median_best_val_loss": 0.01,
    }


def write_target(path: Path, spec: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec))
    return path


def story_text(flowables) -> str:
    """Text of a reportlab story: paragraphs, table cells (one line per row), groups."""
    out = []
    for f in flowables:
        if hasattr(f, "getPlainText"):
            out.append(f.getPlainText())
        elif hasattr(f, "_cellvalues"):
            for row in f._cellvalues:
                cells = [c.getPlainText() if hasattr(c, "getPlainText") else str(c) for c in row]
                out.append(" | ".join(cells))
        elif hasattr(f, "_content"):
            out.append(story_text(f._content))
    return "\n".join(out)
