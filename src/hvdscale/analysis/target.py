"""The study-wide target validation loss and time to target, as the run records state them.

The target is fixed before the scaling runs (issue 16): rule ``calibrate_target`` writes
``results/scaling/target.json`` (``mode`` absolute: a validation loss; calibrated:
(1 + x/100) x the median best validation loss of long 1-worker calibration runs), and
every run trains until its validation loss reaches it or its budget runs out. Each
record's ``target`` block (value, reached, epoch, time_to_target_s, censored,
stop_reason) is what aggregation reads (analysis/records.py); nothing here resolves a
target after the fact, and the test loss is never used to choose anything: it is
reported only.

Time to target is the training wall time (``elapsed_s``: warm-up epochs and validation
included, start-up excluded) at the end of the first epoch whose validation loss is at
or below the target. A censored run (budget reached first) counts as +inf in medians
(analysis/stats.py). A run that meets the target in its first epoch or in an epoch
marked warm-up is flagged ``target_in_warmup``: there the target is too loose and time
to target says nothing about convergence.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from hvdscale.errors import UserError

TOO_LOOSE = "target too loose: time to target not informative"
TARGET_JSON = Path("results/scaling/target.json")
TARGET_COLUMNS = [
    "target_val_loss",
    "target_mode",
    "time_to_target_s",
    "reached_target",
    "target_epoch",
    "target_in_warmup",
    "target_censored",
    "epochs_to_target",
]


def read_target(path: str | Path = TARGET_JSON) -> dict:
    """results/scaling/target.json (contract of issue 16) as a dict."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: not found (rule calibrate_target writes it)") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a readable target file ({exc})") from None
    if not isinstance(data, dict) or "mode" not in data or "value" not in data:
        raise UserError(f"{path}: expected an object with 'mode' and 'value'")
    return data


def target_spec(cfg: dict | None, path: str | Path | None = None) -> dict:
    """The target: target.json where it exists, else the config's ``training.target``."""
    if path is not None and Path(path).exists():
        return read_target(path)
    if cfg is None:
        return {"mode": "absolute", "value": math.nan}
    return dict(cfg["training"].get("target") or {"mode": "absolute", "value": math.nan})


def describe(spec: dict) -> str:
    """The target in words, for the report."""
    value = spec.get("value")
    if spec.get("mode") == "calibrated":
        pct = spec.get("percent")
        med = spec.get("median_best_val_loss")
        runs = len(spec.get("calibration_runs") or [])
        if med is not None and pct is not None:
            return (
                f"validation loss {value:.4g}: within {pct:g} % of the median best validation "
                f"loss ({med:.4g}) of {runs} long 1-worker calibration run(s)"
            )
        return f"validation loss within {value:g} % of the calibration runs' median best"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "validation loss target not set"
    return f"validation loss {value:g} (absolute)"


def time_to(epochs: pd.DataFrame, target: float) -> tuple[float, float, bool]:
    """(time to target, epoch index, met in the warm-up) of one run's epoch rows (sorted
    by epoch), from the validation loss; NaN, NaN, False where it never reaches
    ``target``."""
    if not math.isfinite(target) or epochs.empty or "val_loss" not in epochs:
        return math.nan, math.nan, False
    loss = pd.to_numeric(epochs["val_loss"], errors="coerce").to_numpy(dtype=float)
    hit = np.flatnonzero(np.isfinite(loss) & (loss <= target))
    if hit.size == 0:
        return math.nan, math.nan, False
    i = int(hit[0])
    row = epochs.iloc[i]
    warm = bool(i == 0 or str(row["warmup"]).lower() in ("true", "1"))
    return float(row["elapsed_s"]), float(row["epoch"]), warm
