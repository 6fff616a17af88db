"""Which part of a study a figure or a report table shows, written once for both.

- the main per-worker batch size: the one with the most worker counts (ties: smallest);
- the preferred learning-rate rule: 'none' where measured, else the first by name;
- the preferred backend of a partition: the one with the most completed runs
  (ties: the registry's order, hvdscale.matrix.backends: nccl, mpi, gloo);
- the preferred configuration group of a partition (the report's comparison with the
  reference study): nccl first, then the main batch (else the closest), then LR none;
- the cost-model predictions shown: the main batch of the measured speedups where
  predicted (else the most common predicted batch) and its preferred LR rule;
- the target's metric: runs.csv's target_metric (a validation accuracy), else the
  validation loss.
"""

from __future__ import annotations

from collections import Counter

import pandas as pd

from hvdscale.analysis.columns import FRAMEWORK_DEFAULT, framework_label, names_framework
from hvdscale.matrix import backends
from hvdscale.workload.base import METRICS, VAL_LOSS, Metric

LR_ORDER = {"none": 0, "linear": 1, "sqrt": 2}


def runs_metric(runs: pd.DataFrame | None) -> Metric:
    """The metric of the study's target as runs.csv names it: its ``target_metric``
    column (written only for another metric than the validation loss), else the
    validation loss."""
    if runs is None or "target_metric" not in runs:
        return VAL_LOSS
    keys = runs["target_metric"].dropna().astype(str).unique()
    return METRICS.get(keys[0], VAL_LOSS) if len(keys) == 1 else VAL_LOSS


#: where framework_panels keeps a frame's own partition names
PARTITION_NAME = "partition_name"


def framework_panels(df: pd.DataFrame | None) -> pd.DataFrame | None:
    """The framework as a figure dimension (issue 19): where ``df`` holds runs of more
    than one framework (or of one other than Horovod-TF), its partition becomes 'local,
    PyTorch DDP' ('local, Horovod-TF'), so every figure that gives each partition a panel
    or a colour does so per framework; the partition's own name goes to
    ``partition_name``. Horovod-TF alone: ``df`` as it is, the figures as before."""
    if df is None or "framework" not in df or PARTITION_NAME in df:
        return df
    fws = df["framework"].fillna(FRAMEWORK_DEFAULT)
    if not names_framework(fws):
        return df
    labels = [f"{p}, {framework_label(f)}" for p, f in zip(df["partition"], fws)]
    return df.assign(**{PARTITION_NAME: df["partition"], "partition": labels})


def own_partitions(df: pd.DataFrame | None) -> pd.DataFrame | None:
    """``df`` with its own partition names back (undoes framework_panels)."""
    if df is None or PARTITION_NAME not in df:
        return df
    return df.assign(partition=df[PARTITION_NAME]).drop(columns=PARTITION_NAME)


class NoData(Exception):
    """The figure or table cannot be drawn from the data at hand; the message says why."""


def main_batch(df: pd.DataFrame) -> int:
    """The per-worker batch size with the most worker counts (ties: the smallest)."""
    counts = df.groupby("batch_per_worker")["workers"].nunique()
    return int(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0][0])


def summary_batch(summary: pd.DataFrame | None) -> int | None:
    """The main batch of a summary table's measured configurations (None if empty)."""
    if summary is None or summary.empty:
        return None
    s = summary[summary["epoch_time_s"].notna()]
    return main_batch(s if not s.empty else summary)


def pref_lr(values) -> str:
    values = sorted(set(values))
    return "none" if "none" in values else values[0]


def pref_backend(df: pd.DataFrame) -> str:
    n = (
        df.groupby("backend")["n_completed"].sum()
        if "n_completed" in df
        else df["backend"].value_counts()
    )
    return sorted(n.items(), key=lambda kv: (-kv[1], backends.order(kv[0])))[0][0]


def panel_backend(df: pd.DataFrame, part: str) -> str:
    """The preferred backend of panel ``part``; where framework_panels split a partition
    into one panel per framework, among the backends all of its panels have (so the
    frameworks are compared on the same backend), where they share one."""
    rows = df[df["partition"] == part]
    if PARTITION_NAME in df:
        own = rows[PARTITION_NAME].iloc[0]
        sib = df[df[PARTITION_NAME] == own]
        common = set.intersection(*(set(g["backend"]) for _, g in sib.groupby("partition")))
        if common:
            rows = rows[rows["backend"].isin(common)]
    return pref_backend(rows)


def config_order(backend: str, lr_rule: str) -> tuple[int, int]:
    """Sort key of a (backend, LR rule) pair: nccl, mpi, gloo; none, linear, sqrt."""
    return backends.order(backend), LR_ORDER.get(lr_rule, 9)


def main_rows(summary: pd.DataFrame | None, column: str, why: str, *, one_lr: bool = True):
    """The summary rows with a value in ``column`` at the main batch (and the preferred LR
    rule): (rows, batch, lr or None). Raises NoData(why) where there are none."""
    if summary is None or summary.empty:
        raise NoData("no summary rows")
    s = summary[summary[column].notna()]
    if s.empty:
        raise NoData(why)
    b = main_batch(s)
    s = s[s["batch_per_worker"] == b]
    lr = pref_lr(s["lr_rule"]) if one_lr else None
    return (s[s["lr_rule"] == lr] if one_lr else s), b, lr


def preferred_group(g: pd.DataFrame, batch=None) -> pd.Series | None:
    """Preferred group of a partition: Horovod-TF (the reference study's framework),
    nccl, batch 75 (or the main batch), LR none."""
    if g.empty:
        return None
    batch = batch or 75
    fws = g["framework"] if "framework" in g else [FRAMEWORK_DEFAULT] * len(g)
    g = g.assign(
        _k=[
            (f != FRAMEWORK_DEFAULT, backends.order(b), bs != batch, abs(bs - batch))
            + (LR_ORDER.get(lr, 9),)
            for f, b, bs, lr in zip(fws, g["backend"], g["batch_per_worker"], g["lr_rule"])
        ]
    )
    return g.sort_values("_k", kind="stable").iloc[0]


def prediction_choice(preds: list[dict], summary: pd.DataFrame | None) -> tuple[int, str]:
    """(batch, LR rule) of the cost-model predictions to show (``preds`` not empty)."""
    batches = Counter(p["batch_per_worker"] for p in preds)
    b = batches.most_common(1)[0][0]
    if summary is not None and not summary.empty and summary["speedup"].notna().any():
        b_main = main_batch(summary[summary["speedup"].notna()])
        b = b_main if b_main in batches else b
    return b, pref_lr(p["lr_rule"] for p in preds if p["batch_per_worker"] == b)
