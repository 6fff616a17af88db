"""The learning-rate re-tuning sweep (scaling.tune): candidates and the selection.

Every candidate (LR rule x LR multiplier x warm-up epochs) of a tuning group (partition,
backend, per-worker batch, workers) is its own run (run_id component
``_m{mult}_wu{warmup}``), trained with the same sample budget (training.epochs epochs
over the train split). runs.csv holds their records with the resolved target
(analysis/target.py: the target of the untuned 1-worker runs of the same partition,
backend and batch).

Selection (rule select_tuned -> results/scaling/tuned.csv): per tuning group the
candidate with the smallest time to target (median over its repeats that reached it;
a candidate whose repeats did not all reach it ranks after those that did), ties by
final test loss. A group none of whose candidates reached the target is still listed
(status none_reached: the best final test loss is shown), and one whose candidates all
failed or are missing too (status all_failed); none is dropped.

The tuned time-to-target speedup of a group is TTT(selected 1-worker candidate) /
TTT(selected candidate), with a 95 % bootstrap interval over both candidates' repeats
(analysis/stats.py; none below 3 repeats).

Example
  hvdscale select-tuned --runs results/scaling/runs.csv --status results/scaling/status.csv \\
      --out results/scaling/tuned.csv
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from hvdscale.analysis.stats import speedup_interval
from hvdscale.analysis.target import TOO_LOOSE
from hvdscale.errors import UserError
from hvdscale.runtable import RERUN_ID

TUNE_KEYS = ["partition", "backend", "batch_per_worker", "workers"]
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
]
_CAND = re.compile(r"_lr(?P<lr>none|linear|sqrt)_(?P<cand>m[0-9p]+_wu[0-9]+)_r[0-9]+$")


def candidate_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """The candidates' runs (not their re-runs: those never enter the selection)."""
    if "candidate" not in runs or runs.empty:
        return runs.iloc[0:0]
    c = runs[runs["candidate"].fillna("").astype(str) != ""]
    return c[~c["run_id"].astype(str).str.contains(RERUN_ID, regex=True)]


def candidates(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per candidate of every tuning group: medians over its completed repeats."""
    c = candidate_runs(runs)
    c = c[c["status"] == "completed"]
    if c.empty:
        return pd.DataFrame(
            columns=CANDIDATE_KEYS
            + ["lr_multiplier", "warmup_epochs", "learning_rate", "global_batch", "n_repeats"]
            + ["n_reached_target", "time_to_target_s", "final_test_loss", "epoch_time_s"]
            + ["target_test_loss", "target_too_loose"]
        )
    out = (
        c.groupby(CANDIDATE_KEYS)
        .agg(
            lr_multiplier=("lr_multiplier", "first"),
            warmup_epochs=("warmup_epochs", "first"),
            learning_rate=("learning_rate", "first"),
            global_batch=("global_batch", "first"),
            n_repeats=("run_id", "count"),
            n_reached_target=("reached_target", "sum"),
            time_to_target_s=("time_to_target_s", "median"),
            final_test_loss=("final_test_loss", "median"),
            epoch_time_s=("epoch_time_s", "median"),
            target_test_loss=("target_test_loss", "median"),
            target_too_loose=("target_in_warmup", "any"),
        )
        .reset_index()
    )
    out["n_reached_target"] = out["n_reached_target"].astype("int64")
    return out


def _rank(g: pd.DataFrame) -> pd.DataFrame:
    """Candidates in selection order: all repeats reached, time to target, final loss."""
    all_reached = (g["n_reached_target"] == g["n_repeats"]) & g["time_to_target_s"].notna()
    return g.assign(_miss=~all_reached).sort_values(
        ["_miss", "time_to_target_s", "final_test_loss", "candidate"],
        kind="stable",
        na_position="last",
    )


def _expected(status: pd.DataFrame | None, runs: pd.DataFrame) -> pd.DataFrame:
    """Every candidate of every tuning group: from status.csv (missing and failed runs
    too), else from the records."""
    rows = []
    if status is not None and not status.empty:
        st = status[status["in_config"]] if "in_config" in status else status
        for x in st.itertuples(index=False):
            m = _CAND.search(str(x.run_id))
            if m and pd.notna(x.workers):
                rows.append(
                    (x.partition, x.backend, int(x.batch_per_worker), int(x.workers), m["cand"])
                )
    c = candidate_runs(runs)
    rows += list(
        zip(c["partition"], c["backend"], c["batch_per_worker"], c["workers"], c["candidate"])
    )
    df = pd.DataFrame(rows, columns=TUNE_KEYS + ["candidate"]).drop_duplicates()
    for k in ("batch_per_worker", "workers"):
        df[k] = df[k].astype("int64")
    return df


def select_tuned(runs: pd.DataFrame, status: pd.DataFrame | None = None) -> pd.DataFrame:
    """tuned.csv: the best candidate of every tuning group (see the module doc)."""
    cands = candidates(runs)
    expected = _expected(status, runs)
    rows = []
    for key, exp in expected.groupby(TUNE_KEYS, sort=True):
        g = cands[(cands[TUNE_KEYS] == pd.Series(key, index=TUNE_KEYS)).all(axis=1)]
        row = dict(zip(TUNE_KEYS, key))
        row["global_batch"] = int(key[2] * key[3])
        row["n_candidates"] = int(exp["candidate"].nunique())
        row["n_candidates_completed"] = len(g)
        row["n_candidates_reached"] = int((g["n_reached_target"] > 0).sum())
        if g.empty:
            row["status"] = "all_failed"
        else:
            best = _rank(g).iloc[0]
            row["status"] = "selected" if best["n_reached_target"] > 0 else "none_reached"
            for c in TUNED_COLUMNS:
                if c not in row and c in best.index:
                    row[c] = best[c]
        rows.append(row)
    out = pd.DataFrame(rows, columns=TUNED_COLUMNS)
    return _tuned_speedups(out, runs)


def _values(runs: pd.DataFrame, row, column: str) -> list[float]:
    c = candidate_runs(runs)
    sel = c[
        (c["status"] == "completed")
        & (c["partition"] == row.partition)
        & (c["backend"] == row.backend)
        & (c["batch_per_worker"] == row.batch_per_worker)
        & (c["workers"] == row.workers)
        & (c["lr_rule"] == row.lr_rule)
        & (c["candidate"] == row.candidate)
    ]
    return sel[column].tolist()


def _tuned_speedups(out: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Speedup of each selected candidate against the selected 1-worker candidate."""
    if out.empty:
        return out
    base = {
        (r.partition, r.backend, r.batch_per_worker): r
        for r in out[out["workers"] == 1].itertuples(index=False)
    }
    cols = {c: [] for c in ("speedup", "speedup_ttt", "speedup_ttt_lo", "speedup_ttt_hi", "note")}
    for r in out.itertuples(index=False):
        b = base.get((r.partition, r.backend, r.batch_per_worker))
        s = st = lo = hi = math.nan
        if b is None or b.status == "all_failed" or r.status == "all_failed":
            note = "no interval: no completed 1-worker candidate" if b is None else ""
            note = note or "no interval: candidates failed or missing"
        elif bool(r.target_too_loose) or bool(b.target_too_loose):
            s = b.epoch_time_s / r.epoch_time_s
            note = TOO_LOOSE
        else:
            s = b.epoch_time_s / r.epoch_time_s
            st = b.time_to_target_s / r.time_to_target_s
            name = f"tuned/{r.partition}/{r.backend}/{r.batch_per_worker}/{r.workers}"
            lo, hi, note = speedup_interval(
                _values(runs, b, "time_to_target_s"),
                _values(runs, r, "time_to_target_s"),
                name,
                what="repeats that reached the target",
            )
            if not np.isfinite(st):
                note = "target not reached" + (" by the 1-worker candidate" if r is not b else "")
        for c, v in zip(cols, (s, st, lo, hi, note)):
            cols[c].append(v)
    out = out.copy()
    for c in ("speedup", "speedup_ttt", "speedup_ttt_lo", "speedup_ttt_hi"):
        out[c] = cols[c]
    out["ci_note"] = cols["note"]
    return out


def read_tuned(path) -> pd.DataFrame:
    from hvdscale.analysis.tables import _as_bool, _read_csv

    df = _read_csv(path, "tuned table", TUNED_COLUMNS)
    df["target_too_loose"] = _as_bool(df["target_too_loose"])
    for c in ("ci_note", "candidate", "lr_rule"):
        df[c] = df[c].fillna("").astype(str)
    return df


# ----------------------------------------------------------------------------- CLI


def add_arguments(p):
    p.add_argument("--runs", default="results/scaling/runs.csv", help="(default: %(default)s)")
    p.add_argument(
        "--runs-dir",
        help="aggregate the run records here instead of reading --runs/--status (checkpoint "
        "select_tuned: the re-runs it requests cannot wait for runs.csv); needs --config",
    )
    p.add_argument("--config", help="with --runs-dir: the validated config (full.json)")
    p.add_argument("--target", help="the study's target.json (rule calibrate_target)")
    p.add_argument(
        "--status",
        help="status.csv (lists missing and failed candidates; default: next to --runs)",
    )
    p.add_argument("--out", default="results/scaling/tuned.csv", help="(default: %(default)s)")


def run(args) -> int:
    from pathlib import Path

    from hvdscale.analysis.tables import read_runs, read_status, write_csv

    if args.runs_dir:
        from hvdscale.analysis.aggregate import aggregate
        from hvdscale.config import load_config

        if not args.config:
            raise UserError("select-tuned: --runs-dir needs --config")
        agg = aggregate(Path(args.runs_dir), load_config(args.config))
        runs, status = agg.runs, agg.status
    else:
        runs = read_runs(args.runs)
        status_path = Path(args.status) if args.status else Path(args.runs).with_name("status.csv")
        status = read_status(status_path) if status_path.exists() else None
    tuned = select_tuned(runs, status)
    write_csv(tuned, args.out)
    n = (tuned["status"] == "selected").sum() if not tuned.empty else 0
    print(f"select-tuned: {len(tuned)} tuning groups, {n} with a candidate that reached the target")
    return 0
