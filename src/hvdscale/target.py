"""The study-wide target validation loss (rule calibrate_target -> results/scaling/target.json).

Fixed before any scaling run or tuning candidate trains; every such run reads it
(``hvdscale train --target FILE``) and stops when its validation loss reaches it.

absolute   the loss training.target.value; no runs needed.
calibrated target = (1 + x/100) * median over the calibration runs (run ids ending
           ``_cal_r{k}``: training.target.calibration, 1 worker, a long budget, no stop
           at a target) of each run's best validation loss; x = training.target.value.
           A run's best validation loss is its record's ``target.best_val_loss``, else
           the smallest finite ``val_loss`` of its epochs. A calibration run without a
           record, failed, or without any validation loss is an error naming the run.

Output (the contract of issue 16):
  {"mode": "absolute"|"calibrated", "value": float, "percent": x|null,
   "calibration_runs": [run_id...], "best_val_losses": [...],
   "median_best_val_loss": float|null}
The command line is ``hvdscale calibrate-target`` (hvdscale.commands.calibrate_target).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from hvdscale.errors import ConfigError, UserError
from hvdscale.io import read_json_object
from hvdscale.matrix.runtable import calibration_runs

TARGET_KEYS = (
    "mode",
    "value",
    "percent",
    "calibration_runs",
    "best_val_losses",
    "median_best_val_loss",
)


def best_val_loss(record: dict) -> float | None:
    """A record's best validation loss: target.best_val_loss, else min over epochs of val_loss."""
    tgt = record.get("target")
    if isinstance(tgt, dict) and _finite(tgt.get("best_val_loss")):
        return float(tgt["best_val_loss"])
    losses = [
        float(e["val_loss"])
        for e in record.get("epochs") or []
        if isinstance(e, dict) and _finite(e.get("val_loss"))
    ]
    return min(losses) if losses else None


def _finite(x) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def calibrate_target(cfg: dict, records: dict[str, dict]) -> dict:
    """The target of a validated config from its calibration runs' records.

    ``records``: run_id -> record (metrics.json) of the calibration runs (ignored, and
    may be empty, in absolute mode). Raises UserError naming a calibration run that
    has no record, did not complete, or has no validation loss.
    """
    tgt = cfg["training"]["target"]
    if tgt["mode"] == "absolute":
        return {
            "mode": "absolute",
            "value": float(tgt["value"]),
            "percent": None,
            "calibration_runs": [],
            "best_val_losses": [],
            "median_best_val_loss": None,
        }
    if tgt["mode"] != "calibrated":
        raise ConfigError(
            f"config key training.target.mode: got {tgt['mode']!r}; "
            "expected 'calibrated' or 'absolute'"
        )
    run_ids = [r.run_id for r in calibration_runs(cfg)]
    losses = []
    for rid in run_ids:
        rec = records.get(rid)
        if rec is None:
            raise UserError(
                f"calibration run {rid}: no record (expected its metrics.json among --records)"
            )
        if rec.get("status") != "completed":
            raise UserError(
                f"calibration run {rid}: status {rec.get('status')!r} "
                f"({rec.get('error') or 'see its failure.json'}); the target needs every "
                "calibration run completed: fix the cause and run it again"
            )
        loss = best_val_loss(rec)
        if loss is None:
            raise UserError(
                f"calibration run {rid}: no finite validation loss in its record "
                "(target.best_val_loss or the epochs' val_loss)"
            )
        losses.append(loss)
    median = float(statistics.median(losses))
    percent = float(tgt["value"])
    return {
        "mode": "calibrated",
        "value": (1.0 + percent / 100.0) * median,
        "percent": percent,
        "calibration_runs": run_ids,
        "best_val_losses": losses,
        "median_best_val_loss": median,
    }


def read_records(paths) -> dict[str, dict]:
    """run_id -> record of every metrics.json (run_id from the record, else its directory)."""
    out = {}
    for p in map(Path, paths):
        rec = read_json_object(
            p, "record not found", "run record", "not a run record (expected a JSON object)"
        )
        out[str(rec.get("run_id") or p.parent.name)] = rec
    return out


def read_target(path: str | Path) -> dict:
    """A target.json written by calibrate-target (UserError naming the file if not one)."""
    path = Path(path)
    try:
        tgt = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(
            f"{path}: target file not found (rule calibrate_target writes it)"
        ) from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: not a readable target file: {exc}") from None
    missing = [k for k in TARGET_KEYS if not isinstance(tgt, dict) or k not in tgt]
    if missing or not _finite(tgt["value"]) or tgt["value"] <= 0:
        raise UserError(
            f"{path}: not a target file (keys {', '.join(TARGET_KEYS)}, value a positive "
            f"loss); missing or bad: {', '.join(missing) or 'value'}"
        )
    return tgt
