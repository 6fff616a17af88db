"""The one home of the study's target validation loss: calibrate it, read and validate
target.json, put it into words, and find when a run reached it.

The target is fixed before any scaling run or tuning candidate trains (issue 16): rule
``calibrate_target`` writes ``results/scaling/target.json``; every run reads it
(``hvdscale train --target FILE``) and trains until its validation loss reaches it or a
budget runs out. The test loss is never used to choose anything: it is reported only.

absolute   the loss training.target.value; no runs needed.
calibrated target = (1 + x/100) * median over the calibration runs (run ids ending
           ``_cal_r{k}``: training.target.calibration, 1 worker, no stop at a target;
           each trains until it has flattened (``has_flattened``, after ``min_epochs``)
           or its ``max_epochs`` run out) of each run's best validation loss;
           x = training.target.value.
           A run's best validation loss is its record's ``target.best_val_loss``, else
           the smallest finite ``val_loss`` of its epochs. A calibration run without a
           record, failed, or without any validation loss is an error naming the run.

target.json (the contract of issue 16):
  {"mode": "absolute"|"calibrated", "value": float, "percent": x|null,
   "calibration_runs": [run_id...], "best_val_losses": [...],
   "median_best_val_loss": float|null}, and since issue 30 "last_quarter_gains" and
  "calibration_epochs" (per calibration run: how flat it ended, how long it trained)

Time to target is the training wall time (``elapsed_s``: warm-up epochs and validation
included, start-up excluded) at the end of the first epoch whose validation loss is at
or below the target (``time_to``). A run that meets it in its first epoch or in an epoch
marked warm-up has met it "in the warm-up": there the target is too loose and the time
to target says nothing about convergence (``TOO_LOOSE``). Pure Python (both
environments import it). The command line is ``hvdscale calibrate-target``
(``add_arguments``/``run`` at the end of this module).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path

from hvdscale.cliargs import add_options
from hvdscale.config.load import load_config
from hvdscale.errors import ConfigError, UserError
from hvdscale.io import read_json_object, write_json_atomic
from hvdscale.matrix.runtable import calibration_runs
from hvdscale.workload.base import METRICS, VAL_LOSS, Metric, workload_for

TARGET_JSON = Path("results/scaling/target.json")
TOO_LOOSE = "target too loose: time to target not informative"

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
    metric = workload_for(cfg).metric
    if metric is not VAL_LOSS:
        return _calibrate_metric(cfg, records, metric)
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
    losses, gains, epochs = [], [], []
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
        gains.append(last_quarter_gain(rec))
        epochs.append(len(rec.get("epochs") or []))
    median = float(statistics.median(losses))
    percent = float(tgt["value"])
    return {
        "mode": "calibrated",
        "value": (1.0 + percent / 100.0) * median,
        "percent": percent,
        "calibration_runs": run_ids,
        "best_val_losses": losses,
        "median_best_val_loss": median,
        "last_quarter_gains": gains,
        "calibration_epochs": epochs,
    }


def _calibrate_metric(cfg: dict, records: dict[str, dict], metric: Metric) -> dict:
    """``calibrate_target`` of a workload whose target is on another metric (a validation
    accuracy): absolute, or (1 - x/100) x the median best value of the calibration runs.
    target.json names the metric and the workload."""
    tgt = cfg["training"]["target"]
    spec = {
        "mode": tgt["mode"],
        "metric": metric.key,
        "workload": workload_for(cfg).name,
        "calibration_runs": [],
        "best_val_losses": [],
        "median_best_val_loss": None,
    }
    if tgt["mode"] == "absolute":
        return {**spec, "value": float(tgt["value"]), "percent": None}
    run_ids = [r.run_id for r in calibration_runs(cfg)]
    bests = []
    for rid in run_ids:
        rec = records.get(rid)
        if rec is None or rec.get("status") != "completed":
            raise UserError(f"calibration run {rid}: no completed record; run it again")
        best = metric.best(e.get(metric.key) for e in rec.get("epochs") or [])
        if best is None:
            raise UserError(f"calibration run {rid}: no finite {metric.name} in its epochs")
        bests.append(best)
    median = float(statistics.median(bests))
    percent = float(tgt["value"])
    return {
        **spec,
        "value": (1.0 - percent / 100.0) * median,
        "percent": percent,
        "calibration_runs": run_ids,
        "best_values": bests,
        "median_best_value": median,
        "calibration_epochs": [len(records[r].get("epochs") or []) for r in run_ids],
    }


#: a calibration run has flattened when the last quarter of its epochs improved its best
#: validation loss by less than this fraction (issue 30: the target means something)
FLAT_GAIN = 0.02


def last_quarter_gain(record: dict) -> float | None:
    """How much the last quarter of a run's epochs improved its best validation loss, as
    a fraction of the final best (0: flat); None with fewer than 4 epochs with a loss."""
    return quarter_gain(
        e.get("val_loss") for e in record.get("epochs") or [] if isinstance(e, dict)
    )


def quarter_gain(val_losses) -> float | None:
    """``last_quarter_gain`` of a sequence of per-epoch validation losses (non-finite ones
    left out)."""
    vals = [float(v) for v in val_losses if _finite(v)]
    if len(vals) < 4:
        return None
    cut = len(vals) - len(vals) // 4
    before, best = min(vals[:cut]), min(vals)
    return (before - best) / best if best > 0 else None


def has_flattened(val_losses, min_epochs: int) -> bool:
    """Whether a calibration run may stop (training.target.calibration.until_flat): at
    least ``min_epochs`` epochs and the last quarter of them improved the best validation
    loss by less than FLAT_GAIN. The same rule as the report's "had flattened", so a run
    that stops here is reported flat; one that runs into max_epochs is judged by it too."""
    vals = list(val_losses)
    if len(vals) < max(min_epochs, 4):
        return False
    gain = quarter_gain(vals)
    return gain is not None and gain < FLAT_GAIN


def flattened_text(spec: dict) -> str:
    """Whether the calibration runs had flattened, in words ('' without the figures)."""
    gains = [g for g in spec.get("last_quarter_gains") or [] if _finite(g)]
    if not gains:
        return ""
    worst = max(gains)
    if worst < FLAT_GAIN:
        return (
            f"the calibration runs had flattened: the last quarter of their epochs improved "
            f"the best validation loss by at most {100 * worst:.1f} %"
        )
    return (
        f"the calibration runs had NOT flattened: the last quarter of their epochs still "
        f"improved the best validation loss by up to {100 * worst:.1f} % (>= "
        f"{100 * FLAT_GAIN:.0f} %), so a longer calibration budget "
        "(training.target.calibration.max_epochs) would give a lower, tighter target"
    )


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
    """target.json as written by calibrate-target: the one reader and validator. A
    UserError names the file and the key that is missing or malformed."""
    path = Path(path)
    what = f"target file {path}"
    try:
        spec = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{what}: not found (written by rule calibrate_target)") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{what}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except OSError as exc:
        raise UserError(f"{what}: not readable ({exc})") from None
    if not isinstance(spec, dict):
        raise UserError(f"{what}: expected a JSON object with keys {', '.join(TARGET_KEYS)}")
    missing = [k for k in TARGET_KEYS if k not in spec]
    if missing:
        raise UserError(f"{what}: missing key(s) {', '.join(missing)}")
    if spec["mode"] not in ("absolute", "calibrated"):
        raise UserError(f"{what}: mode must be 'absolute' or 'calibrated', got {spec['mode']!r}")
    if not _finite(spec["value"]) or spec["value"] <= 0:
        raise UserError(
            f"{what}: value must be a positive number (a validation loss), got {spec['value']!r}"
        )
    if spec.get("metric", "val_loss") not in METRICS:
        raise UserError(
            f"{what}: metric must be one of {', '.join(METRICS)}, got {spec['metric']!r}"
        )
    if spec["mode"] == "calibrated" and not (
        _finite(spec["percent"])
        and _finite(
            spec["median_best_val_loss"] if "metric" not in spec else spec.get("median_best_value")
        )
    ):
        raise UserError(
            f"{what}: a calibrated target needs numbers percent and median_best_val_loss"
        )
    if not isinstance(spec["calibration_runs"], list):
        raise UserError(f"{what}: calibration_runs must be a list of run ids")
    return spec


def target_spec(cfg: dict | None, path: str | Path | None = None) -> dict:
    """The target: target.json where it exists, else the config's ``training.target``
    (before calibration: mode and value as configured)."""
    if path is not None and Path(path).exists():
        return read_target(path)
    if cfg is None:
        return {"mode": "absolute", "value": math.nan}
    spec = dict(cfg["training"].get("target") or {"mode": "absolute", "value": math.nan})
    metric = workload_for(cfg).metric
    if metric is not VAL_LOSS:  # another workload's metric, in its units
        spec.update(metric=metric.key, workload=workload_for(cfg).name)
    return spec


def _loss(x) -> str:
    return f"{float(x):.4g}"


def describe(spec: dict) -> str:
    """The target in words (the report's one wording): target.json, or the config's
    target before calibration."""
    metric = target_metric(spec)
    if metric is not VAL_LOSS:
        return _describe_metric(spec, metric)
    value = spec.get("value")
    if not _finite(value):
        return "validation loss target not set"
    runs = spec.get("calibration_runs")
    if spec.get("mode") == "calibrated":
        if runs is None or not _finite(spec.get("median_best_val_loss")):
            return (
                f"validation loss within {value:g} % of the median best validation loss of "
                "the 1-worker calibration runs"
            )
        return (
            f"validation loss {_loss(value)} = (1 + {spec['percent']:g} %) x "
            f"{_loss(spec['median_best_val_loss'])}, the median best validation loss of "
            f"{len(runs)} calibration run{'s' if len(runs) != 1 else ''} (1 worker, "
            f"{_trained(spec)}, target not applied{': ' + ', '.join(runs) if runs else ''})"
            + (f"; {flat}" if (flat := flattened_text(spec)) else "")
        )
    return f"validation loss {_loss(value)} (absolute, set in the config)"


def _describe_metric(spec: dict, metric: Metric) -> str:
    """A target on another metric than the validation loss, in its units."""
    value = spec.get("value")
    if not _finite(value):
        return f"{metric.name} target not set"
    text = (
        f"{metric.name} {_loss(value)} or better ({metric.units}; {spec.get('workload')} workload)"
    )
    runs = spec.get("calibration_runs")
    if spec.get("mode") == "calibrated" and runs and _finite(spec.get("median_best_value")):
        return (
            f"{text} = (1 - {spec['percent']:g} %) x {_loss(spec['median_best_value'])}, the "
            f"median best {metric.name} of {len(runs)} calibration run"
            f"{'s' if len(runs) != 1 else ''} (1 worker, {_trained(spec)}, target not applied)"
        )
    return f"{text}, absolute, set in the config"


def target_metric(spec: dict | None) -> Metric:
    """The metric of a target (target.json or ``target_spec``): its ``metric`` key, the
    validation loss where it has none (the default workload's files)."""
    return METRICS.get((spec or {}).get("metric") or "val_loss", VAL_LOSS)


def target_words(spec: dict | None) -> str:
    """The target as the report's sentences name it, in its metric's units: "the target
    validation loss" for a validation loss; for another metric with its value, e.g. "the
    target (validation accuracy >= 0.95)"."""
    metric = target_metric(spec)
    if metric is VAL_LOSS:
        return "the target validation loss"
    value = (spec or {}).get("value")
    if not _finite(value):
        return f"the target {metric.name}"
    return f"the target ({metric.name} {'<=' if metric.goal == 'min' else '>='} {_loss(value)})"


def at_target_words(spec: dict | None) -> str:
    """The rule that a run reached the target: "validation loss is at or below the target"
    ("validation accuracy is at or above the target" for an accuracy)."""
    metric = target_metric(spec)
    return f"{metric.name} is at or {'below' if metric.goal == 'min' else 'above'} the target"


def _trained(spec: dict) -> str:
    """How long the calibration runs trained, in words (target.json's calibration_epochs,
    absent from files written before it)."""
    eps = [int(e) for e in spec.get("calibration_epochs") or [] if _finite(e)]
    return f"trained {', '.join(map(str, eps))} epochs" if eps else "long budget"


def first_epoch_at(
    epochs: list[dict], target: float | None, metric: Metric = VAL_LOSS
) -> tuple[int, dict] | None:
    """(index, epoch) of the first epoch whose validation loss is <= target (a
    classifier's ``metric``: whose validation accuracy is >= target); None where none is
    (or there is no target)."""
    if target is None or not _finite(target):
        return None
    for i, ep in enumerate(epochs):
        if metric.reached(ep.get(metric.key), target):
            return i, ep
    return None


def time_to(
    epochs: list[dict], target: float | None, metric: Metric = VAL_LOSS
) -> tuple[float | None, int | None, bool]:
    """(time to target, its epoch, met in the warm-up) of one run's epochs (in order):
    the epoch's ``elapsed_s``; (None, None, False) where the run never reaches it."""
    hit = first_epoch_at(epochs, target, metric)
    if hit is None:
        return None, None, False
    i, ep = hit
    warm = i == 0 or str(ep.get("warmup")).lower() in ("true", "1")
    return float(ep["elapsed_s"]), int(ep["epoch"]), warm


# -------------------------------------------------- the command: hvdscale calibrate-target


def add_arguments(p):
    add_options(
        p,
        (
            "--config",
            {
                "required": True,
                "help": "config (results/config/target.json: the target settings of the study)",
            },
        ),
        (
            "--records",
            {
                "nargs": "*",
                "default": [],
                "help": "metrics.json of every calibration run (none in absolute mode)",
            },
        ),
        ("--out", {"required": True, "help": "output, e.g. results/scaling/target.json"}),
    )


def run(args) -> int:
    """The study-wide target validation loss (rule calibrate_target -> results/scaling/target.json).

    Fixed before any scaling run or tuning candidate trains; every such run reads it
    (``hvdscale train --target FILE``) and stops when its validation loss reaches it.

    absolute (training.target.value is the loss) or calibrated ((1 + x/100) x the median
    best validation loss of the calibration runs, x = training.target.value); the modes,
    the keys of target.json and how the calibration runs are read: hvdscale.target.

    Example
      hvdscale calibrate-target --config results/config/target.json \
      --records results/runs/local_mpi_n1_w1_b75_lrlinear_cal_r*/metrics.json \
      --out results/scaling/target.json
    """
    cfg = load_config(args.config)
    tgt = calibrate_target(cfg, read_records(args.records))
    write_json_atomic(args.out, tgt)
    if tgt.get("metric"):
        msg = describe(tgt)
    elif tgt["mode"] == "absolute":
        msg = f"absolute target validation loss {tgt['value']:.6g}"
    else:
        msg = (
            f"target validation loss {tgt['value']:.6g} = (1 + {tgt['percent']:g} %) x median "
            f"{tgt['median_best_val_loss']:.6g} of {len(tgt['best_val_losses'])} calibration runs"
        )
    print(f"calibrate-target: {msg}; wrote {args.out}", file=sys.stderr)
    return 0
