"""The learning-rate re-tuning sweep (scaling.tune): selection on validation, re-runs.

The command line, with what it reads and writes in full, is ``hvdscale select-tuned``
(hvdscale.analysis.aggregate.run_select_tuned).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from hvdscale.analysis.columns import FRAMEWORK_DEFAULT, ttt_runs, with_framework
from hvdscale.analysis.like import DEFAULT_SETTING, TUNE_KEYS, like_key, stream_tag
from hvdscale.analysis.stats import censor_note, censored_median, speedup_interval
from hvdscale.analysis.tables import _as_bool, _read_csv
from hvdscale.matrix.runid import run_candidate, run_id_parts, run_kind
from hvdscale.target import TOO_LOOSE

#: a tuning group: TUNE_KEYS (analysis/like.py: system, step setting, batch, workers)
CANDIDATE_KEYS = TUNE_KEYS + ["lr_rule", "candidate"]
TUNED_COLUMNS = [
    *TUNE_KEYS,
    "global_batch",
    "status",
    "n_candidates",
    "n_candidates_completed",
    "n_candidates_reached",
    "lr_rule",
    "candidate",
    "lr_multiplier",
    "warmup_epochs",
    "learning_rate",
    "n_repeats",
    "n_reached_target",
    "time_to_target_s",
    "final_test_loss",
    "epoch_time_s",
    "target_test_loss",
    "target_too_loose",
    "speedup",
    "speedup_ttt",
    "speedup_ttt_lo",
    "speedup_ttt_hi",
    "ci_note",
    # issue 16: re-runs, censoring, validation
    "n_ttt_total",
    "ttt_note",
    "epochs_to_target",
    "best_val_loss",
    "selection_time_to_target_s",
    "selection_best_val_loss",
    "selection_n_repeats",
]
_STATS = [
    "n_repeats",
    "n_reached_target",
    "n_ttt_total",
    "time_to_target_s",
    "epochs_to_target",
    "final_test_loss",
    "best_val_loss",
    "epoch_time_s",
    "target_test_loss",
    "target_too_loose",
    "ttt_note",
]


def _tagged(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with candidate and kind filled from the run id where a column lacks them."""
    if runs.empty:
        return runs.assign(kind=pd.Series(dtype=str), candidate=pd.Series(dtype=str))
    out = runs.copy()
    cand = out["candidate"].fillna("").astype(str) if "candidate" in out else ""
    out["candidate"] = np.where(cand != "", cand, out["run_id"].map(run_candidate))
    kind = out["kind"].fillna("").astype(str) if "kind" in out else ""
    out["kind"] = np.where(kind != "", kind, out["run_id"].map(run_kind))
    return out


def candidate_runs(runs: pd.DataFrame, kind: str = "") -> pd.DataFrame:
    """Completed or not, the tuning runs of ``kind`` ('' = selection, 'rerun')."""
    if runs.empty or "run_id" not in runs:
        return with_framework(runs.iloc[0:0])
    t = _tagged(with_framework(runs))
    return t[(t["candidate"] != "") & (t["kind"] == kind)]


def _group_stats(c: pd.DataFrame) -> pd.DataFrame:
    """Medians over the repeats of each candidate that ended for a reason of training
    (analysis.columns.ttt_runs: censored and diverged TTT = +inf)."""
    if c.empty:
        return pd.DataFrame(columns=CANDIDATE_KEYS + _STATS)

    def med(x):
        return censored_median(x.tolist())[0]

    def note(x):
        n = censor_note(int(np.isfinite(x).sum()), int(x.notna().sum()))
        return f"time to target: {n}" if n else ""

    out = (
        c.groupby(CANDIDATE_KEYS)
        .agg(
            lr_multiplier=("lr_multiplier", "first"),
            warmup_epochs=("warmup_epochs", "first"),
            learning_rate=("learning_rate", "first"),
            global_batch=("global_batch", "first"),
            n_repeats=("status", lambda s: int((s == "completed").sum())),
            n_reached_target=("reached_target", "sum"),
            n_ttt_total=("time_to_target_s", "count"),
            time_to_target_s=("time_to_target_s", med),
            epochs_to_target=("epochs_to_target", med),
            final_test_loss=("final_test_loss", "median"),
            best_val_loss=("best_val_loss", "median"),
            epoch_time_s=("epoch_time_s", "median"),
            target_test_loss=("target_val_loss", "median"),
            target_too_loose=("target_in_warmup", "any"),
            ttt_note=("time_to_target_s", note),
            # the median best value of a target on another metric (runs.csv has it then)
            **{m: (m, "median") for m in ["best_target_value"] if m in c},
        )
        .reset_index()
    )
    out["n_reached_target"] = out["n_reached_target"].astype("int64")
    return out


def candidates(runs: pd.DataFrame, kind: str = "") -> pd.DataFrame:
    """One row per candidate of every tuning group: medians over its completed repeats
    (the selection runs; ``kind='rerun'``: the re-runs)."""
    return _group_stats(ttt_runs(candidate_runs(runs, kind)))


def _rank(g: pd.DataFrame) -> pd.DataFrame:
    """Candidates in selection order: validation time to target (no median last), then
    median best validation loss."""
    return g.assign(_miss=g["time_to_target_s"].isna()).sort_values(
        ["_miss", "time_to_target_s", "best_val_loss", "candidate"],
        kind="stable",
        na_position="last",
    )


def _expected(status: pd.DataFrame | None, runs: pd.DataFrame) -> pd.DataFrame:
    """Every candidate of every tuning group: from status.csv (missing and failed runs
    too), else from the records."""
    rows = []
    if status is not None and not status.empty:
        st = status[status["in_config"]] if "in_config" in status else status
        st = with_framework(st)  # framework, precision, compile of older tables filled
        for x in st.itertuples(index=False):
            parts = run_id_parts(x.run_id)
            if parts.get("candidate") and not parts["kind"] and pd.notna(x.workers):
                b, w = int(x.batch_per_worker), int(x.workers)
                rows.append((*like_key(x), b, w, parts["candidate"]))
    c = candidate_runs(runs)
    rows += list(zip(*(c[k] for k in TUNE_KEYS), c["candidate"]))
    df = pd.DataFrame(rows, columns=TUNE_KEYS + ["candidate"]).drop_duplicates()
    for k in ("batch_per_worker", "workers"):
        df[k] = df[k].astype("int64")
    return df


def _match(df: pd.DataFrame, row: dict, keys: list[str]) -> pd.DataFrame:
    if df.empty:
        return df
    return df[(df[keys] == pd.Series([row[k] for k in keys], index=keys)).all(axis=1)]


def reruns_of(reruns: pd.DataFrame, group) -> pd.DataFrame:
    """The rows of ``reruns`` of one tuning group's selected candidate (``group``: a row
    of tuned.csv, as itertuples gives it)."""
    return _match(reruns, group._asdict(), CANDIDATE_KEYS)


def _row(key, exp, cands, reruns) -> dict:
    """The tuned.csv row of one tuning group."""
    g = _match(cands, dict(zip(TUNE_KEYS, key)), TUNE_KEYS)
    row = dict(zip(TUNE_KEYS, key))
    row["global_batch"] = int(row["batch_per_worker"] * row["workers"])
    row["n_candidates"] = int(exp["candidate"].nunique())
    row["n_candidates_completed"] = len(g)
    row["n_candidates_reached"] = int((g["n_reached_target"] > 0).sum())
    if g.empty:
        row["status"] = "all_failed"
        return row
    best = _rank(g).iloc[0]
    for c in ("lr_rule", "candidate", "lr_multiplier", "warmup_epochs", "learning_rate"):
        row[c] = best[c]
    row["selection_time_to_target_s"] = best["time_to_target_s"]
    row["selection_best_val_loss"] = best["best_val_loss"]
    row["selection_n_repeats"] = best["n_repeats"]
    if best["n_reached_target"] == 0:
        row["status"] = "none_reached"
        return row
    re_ = _match(reruns, row, CANDIDATE_KEYS)
    row["status"] = "selected" if len(re_) else "awaiting_reruns"
    if len(re_):
        for c in _STATS:
            row[c] = re_.iloc[0][c]
    return row


def select_tuned(runs: pd.DataFrame, status: pd.DataFrame | None = None) -> pd.DataFrame:
    """tuned.csv: the selected candidate of every tuning group with its re-runs' figures
    (the definitions: hvdscale select-tuned --help)."""
    runs = with_framework(runs)
    cands, reruns = candidates(runs), candidates(runs, "rerun")
    expected = _expected(status, runs)
    rows = [_row(key, exp, cands, reruns) for key, exp in expected.groupby(TUNE_KEYS, sort=True)]
    out = pd.DataFrame(rows, columns=TUNED_COLUMNS)
    out["ci_note"] = ""
    return _tuned_speedups(out, runs)


def _rerun_values(runs: pd.DataFrame, row, column: str) -> tuple[list, list]:
    """(values, repeat indices) of the completed re-runs of a selected candidate."""
    sel = reruns_of(ttt_runs(candidate_runs(runs, "rerun")), row)
    return sel[column].tolist(), sel["repeat"].tolist()


def _tuned_speedups(out: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Speedup of each selected candidate's re-runs against the selected 1-worker
    candidate's re-runs."""
    if out.empty:
        return out
    base = {
        (*like_key(r), r.batch_per_worker): r
        for r in out[out["workers"] == 1].itertuples(index=False)
    }
    cols = {c: [] for c in ("speedup", "speedup_ttt", "speedup_ttt_lo", "speedup_ttt_hi", "note")}
    for r in out.itertuples(index=False):
        b = base.get((*like_key(r), r.batch_per_worker))
        s = st = lo = hi = math.nan
        if b is None:
            note = "no interval: no 1-worker tuning group"
        elif b.status != "selected" or r.status != "selected":
            worst = r.status if r.status != "selected" else b.status
            note = f"no interval: {worst.replace('_', ' ')}" + (
                " (1-worker group)" if r.status == "selected" else ""
            )
        else:
            s = b.epoch_time_s / r.epoch_time_s
            bv, bi = _rerun_values(runs, b, "time_to_target_s")
            v, i = _rerun_values(runs, r, "time_to_target_s")
            name = "/".join(map(str, ["tuned", *stream_key(r)]))
            lo, hi, note = speedup_interval(bv, v, name, base_repeats=bi, repeats=i)
            if bool(r.target_too_loose) or bool(b.target_too_loose):
                lo, hi, note = math.nan, math.nan, TOO_LOOSE
            else:
                st = b.time_to_target_s / r.time_to_target_s
        for c, v in zip(cols, (s, st, lo, hi, note)):
            cols[c].append(v)
    out = out.copy()
    for c in ("speedup", "speedup_ttt", "speedup_ttt_lo", "speedup_ttt_hi"):
        out[c] = cols[c]
    out["ci_note"] = cols["note"]
    return out


def stream_key(r) -> list:
    """(partition[/framework][setting], backend, batch, workers) of a tuning group,
    naming its bootstrap stream (analysis/like.stream_tag: the framework and the step
    setting only where they are not the default, so older streams keep their names)."""
    fw = getattr(r, "framework", FRAMEWORK_DEFAULT)
    prec = getattr(r, "precision", DEFAULT_SETTING[0])
    comp = getattr(r, "compile", DEFAULT_SETTING[1])
    return [stream_tag(r.partition, fw, prec, comp), r.backend, r.batch_per_worker, r.workers]


#: the checkpoint's table (selection.csv): which candidate of each group won on the
#: selection runs and is re-run; no re-run figure (it is written before the re-runs)
SELECTION_COLUMNS = [
    *TUNED_COLUMNS[: TUNED_COLUMNS.index("learning_rate") + 1],
    *(c for c in TUNED_COLUMNS if c.startswith("selection_")),
]


def selection(runs: pd.DataFrame, status: pd.DataFrame | None = None) -> pd.DataFrame:
    """selection.csv (checkpoint select_tuned): ``select_tuned`` on the selection runs
    alone, whatever re-runs exist, so the table is the same before and after them (and
    in a rebuild); status selected, none_reached or all_failed."""
    if not runs.empty and "run_id" in runs:
        runs = runs[runs["run_id"].map(run_kind) != "rerun"]
    if status is not None and not status.empty:
        status = status[status["run_id"].map(run_kind) != "rerun"]
    out = select_tuned(runs, status)[SELECTION_COLUMNS].copy()
    out["status"] = out["status"].replace({"awaiting_reruns": "selected"})
    return out


def read_tuned(path) -> pd.DataFrame:
    df = _read_csv(path, "tuned table", TUNED_COLUMNS)
    df["target_too_loose"] = _as_bool(df["target_too_loose"])
    for c in ("ci_note", "candidate", "lr_rule"):
        df[c] = df[c].fillna("").astype(str)
    return df
