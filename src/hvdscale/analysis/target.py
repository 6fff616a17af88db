"""The target test loss, resolved at aggregation time, and time to target.

``training.target`` is either absolute (a test loss) or relative (default): within
``value`` percent of the best test loss reached by the 1-worker runs of the same group
(partition, backend, per-worker batch, LR rule), i.e. the median over their completed
repeats of each run's best test loss, times (1 + value/100).

A tuning candidate (run_id component ``_m{mult}_wu{warmup}``) uses the target of the
untuned 1-worker runs of its partition, backend and per-worker batch (with one worker
every LR rule trains alike), so tuned and untuned runs are compared at the same
accuracy; without them (a study of tuning candidates only) the best of the group's
1-worker candidates (median over repeats) is the reference.

Time to target is the training wall time (``elapsed_s``: warm-up epochs and test
evaluation included, start-up and checkpoint writing excluded) at the end of the first
epoch whose test loss is at or below the target. A run that meets the target in its
first epoch or in an epoch marked warm-up is flagged ``target_in_warmup``: there the
target is too loose and time to target says nothing about convergence.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from hvdscale.common import GROUP_KEYS

DEFAULT_TARGET = {"mode": "relative", "value": 5.0}
TOO_LOOSE = "target too loose: time to target not informative"
TARGET_COLUMNS = [
    "target_test_loss",
    "target_mode",
    "time_to_target_s",
    "reached_target",
    "target_epoch",
    "target_in_warmup",
]


def target_spec(cfg: dict | None) -> dict:
    """The target of a validated config (the default relative 5 % without one)."""
    if cfg is None:
        return dict(DEFAULT_TARGET)
    return dict(cfg["training"].get("target") or DEFAULT_TARGET)


def describe(spec: dict) -> str:
    """The target in words, for the report."""
    if spec["mode"] == "absolute":
        return f"test loss {spec['value']:g} (absolute)"
    return (
        f"within {spec['value']:g} % of the best test loss of the 1-worker runs of the same "
        "group (partition, backend, per-worker batch, LR rule)"
    )


def _is_candidate(runs: pd.DataFrame) -> pd.Series:
    if "candidate" not in runs:
        return pd.Series(False, index=runs.index)
    return runs["candidate"].fillna("").astype(str) != ""


def reference_losses(runs: pd.DataFrame) -> dict[tuple, float]:
    """Group key -> the best 1-worker test loss (median over completed repeats)."""
    done = runs[(runs["status"] == "completed") & (runs["workers"] == 1)]
    done = done[done["best_test_loss"].notna()]
    plain = done[~_is_candidate(done)]
    ref = {
        tuple(k): float(v) for k, v in plain.groupby(GROUP_KEYS)["best_test_loss"].median().items()
    }
    same = ["partition", "backend", "batch_per_worker"]
    for k, v in plain.groupby(same)["best_test_loss"].median().items():
        ref[("any",) + tuple(k)] = float(v)
    cand = done[_is_candidate(done)]
    if not cand.empty:
        per_cand = cand.groupby(GROUP_KEYS + ["candidate"])["best_test_loss"].median()
        for k, v in per_cand.groupby(level=list(range(len(GROUP_KEYS)))).min().items():
            ref.setdefault(("cand",) + tuple(k), float(v))
    return ref


def group_target(key: tuple, spec: dict, ref: dict, candidate: bool = False) -> float:
    """The target loss of group ``key`` (NaN where a relative target has no reference)."""
    if spec["mode"] == "absolute":
        return float(spec["value"])
    best = ref.get(("any",) + tuple(key[:3])) if candidate else ref.get(tuple(key))
    if best is None and candidate:
        best = ref.get(("cand",) + tuple(key))
    if best is None:
        return math.nan
    return best * (1.0 + spec["value"] / 100.0)


def time_to(epochs: pd.DataFrame, target: float) -> tuple[float, float, bool]:
    """(time to target, epoch index, met in the warm-up) of one run's epoch rows
    (sorted by epoch); NaN, NaN, False where the run never reaches ``target``."""
    if not math.isfinite(target) or epochs.empty:
        return math.nan, math.nan, False
    loss = pd.to_numeric(epochs["test_loss"], errors="coerce").to_numpy(dtype=float)
    hit = np.flatnonzero(np.isfinite(loss) & (loss <= target))
    if hit.size == 0:
        return math.nan, math.nan, False
    i = int(hit[0])
    row = epochs.iloc[i]
    warm = bool(i == 0 or str(row["warmup"]).lower() in ("true", "1"))
    return float(row["elapsed_s"]), float(row["epoch"]), warm


def resolve_targets(runs: pd.DataFrame, epochs: pd.DataFrame, spec: dict) -> pd.DataFrame:
    """``runs`` with the resolved target and time to target of every run (TARGET_COLUMNS)."""
    runs = runs.copy()
    ref = reference_losses(runs)
    by_run = {rid: g.sort_values("epoch") for rid, g in epochs.groupby("run_id", sort=False)}
    cand = _is_candidate(runs)
    values = {c: [] for c in TARGET_COLUMNS}
    for i, row in runs.iterrows():
        key = tuple(row[k] for k in GROUP_KEYS)
        tgt = group_target(key, spec, ref, candidate=bool(cand.loc[i]))
        ttt, ep, warm = time_to(by_run.get(row["run_id"], epochs.iloc[0:0]), tgt)
        values["target_test_loss"].append(tgt)
        values["target_mode"].append(spec["mode"])
        values["time_to_target_s"].append(ttt)
        values["reached_target"].append(bool(math.isfinite(ttt)))
        values["target_epoch"].append(ep)
        values["target_in_warmup"].append(warm)
    for c, v in values.items():
        runs[c] = pd.Series(v, index=runs.index, dtype=object if c == "target_mode" else None)
    runs["reached_target"] = runs["reached_target"].astype(bool)
    runs["target_in_warmup"] = runs["target_in_warmup"].astype(bool)
    return runs
