"""Writing and reading the aggregation tables (CSV), with clear errors for a missing,
unreadable or foreign file."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from hvdscale.analysis.columns import (
    CSV_FLOAT_FORMAT,
    EPOCH_COLUMNS,
    FRAMEWORK_DEFAULT,
    HEADLINE_COLUMNS,
    HEADLINE_LATER,
    NOISE_EPOCH_COLUMNS,
    RUNS_COLUMNS,
    STARTUP_COLUMNS,
    STATUS_COLUMNS,
    STEP_SETTING_DEFAULTS,
    STRING_COLUMNS,
    SUMMARY_COLUMNS,
    SYNC_COLUMNS,
)
from hvdscale.errors import UserError
from hvdscale.io import atomic_path


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    with atomic_path(path, ".csv") as tmp:
        df.to_csv(tmp, index=False, float_format=CSV_FLOAT_FORMAT)


def _read_csv(path: str | Path, what: str, required: list[str]) -> pd.DataFrame:
    path = Path(path)
    try:
        header = pd.read_csv(path, nrows=0).columns
        df = pd.read_csv(
            path, keep_default_na=True, dtype={c: "str" for c in STRING_COLUMNS if c in header}
        )
    except FileNotFoundError:
        raise UserError(f"{what} {path}: not found (run 'hvdscale aggregate' first)") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise UserError(f"{what} {path}: not a readable CSV file ({exc})") from None
    df = _issue19_columns(df, required)
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise UserError(
            f"{what} {path}: missing column(s) {', '.join(missing)}; "
            "was it written by 'hvdscale aggregate'?"
        )
    return df


def _issue19_columns(df: pd.DataFrame, required: list[str]) -> pd.DataFrame:
    """A table written before issue 19: every run was Horovod-TF (framework after the
    partition, or after run_id) and no run measured timing.sync (NaN)."""
    if "framework" in required and "framework" not in df:
        cols = list(df.columns)
        at = cols.index("partition") + 1 if "partition" in cols else int("run_id" in cols)
        df.insert(at, "framework", FRAMEWORK_DEFAULT)
    for c in SYNC_COLUMNS:
        if c in required and c not in df:
            df[c] = float("nan")
    for c in STARTUP_COLUMNS:  # written before issue 30 item 7: no start-up figure
        if c in required and c not in df:
            df[c] = float("nan")
    for c, value in STEP_SETTING_DEFAULTS.items():  # before issue 32: fp32, eager
        if c in required and c not in df:
            df[c] = value
    return df


def _as_bool(values: pd.Series) -> pd.Series:
    return values.astype(str).str.lower().eq("true")


def read_runs(path) -> pd.DataFrame:
    df = _read_csv(path, "runs table", RUNS_COLUMNS)
    df["candidate"] = df["candidate"].fillna("")
    for col in ("reached_target", "target_in_warmup"):
        df[col] = _as_bool(df[col])
    return df


def read_summary(path) -> pd.DataFrame:
    df = _read_csv(path, "summary table", SUMMARY_COLUMNS)
    df["has_baseline"] = _as_bool(df["has_baseline"])
    df["target_too_loose"] = _as_bool(df["target_too_loose"])
    df["ci_note"] = df["ci_note"].fillna("")
    return df


def read_status(path) -> pd.DataFrame:
    df = _read_csv(path, "status table", STATUS_COLUMNS)
    df["in_config"] = _as_bool(df["in_config"])
    df["detail"] = df["detail"].fillna("")
    return df


def read_epochs(path) -> pd.DataFrame:
    """epochs.csv; one written before the noise-scale columns (issue 30) reads with them
    NaN (no noise scale near the target from it)."""
    required = [c for c in EPOCH_COLUMNS if c not in NOISE_EPOCH_COLUMNS]
    df = _read_csv(path, "epochs table", required)
    for c in NOISE_EPOCH_COLUMNS:
        if c not in df:
            df[c] = float("nan")
    return df


def default_epochs_path(runs_csv: str | Path) -> Path:
    return Path(runs_csv).with_name("epochs.csv")


_TEXT = [
    "partition",
    "framework",
    "backend",
    "precision",
    "compile",
    "note",
    "ci_method",
    "tuned",
    "best1_baseline",
]


_COUNTS = [
    "batch_per_worker",
    "workers",
    "reached",
    "total",
    "diverged",
    "base_reached",
    "base_total",
    "base_diverged",
]


def read_headline(path) -> pd.DataFrame:
    """headline.csv as a frame (``tuned`` bool, counts int, the rest float); a
    UserError naming the file, column and row where it is missing or malformed."""
    path = Path(path)
    what = f"headline table {path}"
    try:
        df = pd.read_csv(path, dtype={c: "str" for c in _TEXT})
    except FileNotFoundError:
        raise UserError(f"{what}: not found (written by 'hvdscale aggregate')") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise UserError(f"{what}: not a readable CSV file ({exc})") from None
    if "framework" not in df and "partition" in df:  # written before issue 19: Horovod
        df.insert(list(df.columns).index("partition") + 1, "framework", FRAMEWORK_DEFAULT)
    for c, empty in HEADLINE_LATER.items():  # written before the column existed
        if c not in df.columns:
            df[c] = empty
    missing = [c for c in HEADLINE_COLUMNS if c not in df.columns]
    if missing:
        raise UserError(f"{what}: missing column(s) {', '.join(missing)}")
    tuned = df["tuned"].fillna("").str.strip().str.lower()
    bad = ~tuned.isin(["true", "false"])
    if bad.any():
        row = int(bad.idxmax()) + 2
        raise UserError(f"{what}, line {row}: column tuned must be True or False")
    df["tuned"] = tuned.eq("true")
    for c in HEADLINE_COLUMNS:
        if c in _TEXT:
            continue
        num = pd.to_numeric(df[c], errors="coerce")
        bad = num.isna() & df[c].notna()
        if c in _COUNTS:
            bad |= num.isna() | (num < 0) | (num != num.round())
        if bad.any():
            row = int(bad.idxmax()) + 2
            kind = "a count (integer >= 0)" if c in _COUNTS else "a number or empty"
            raise UserError(
                f"{what}, line {row}: column {c} must be {kind}, got {df[c][bad].iloc[0]!r}"
            )
        df[c] = num.astype(int) if c in _COUNTS else num.astype(float)
    for c in ("note", "ci_method", "best1_baseline"):
        df[c] = df[c].fillna("")
    df["framework"] = df["framework"].fillna(FRAMEWORK_DEFAULT)
    for c in ("precision", "compile"):  # empty: the default step setting (fp32, off)
        df[c] = df[c].fillna(STEP_SETTING_DEFAULTS[c])
    return df
