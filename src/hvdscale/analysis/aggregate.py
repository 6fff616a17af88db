"""Aggregate run records (results/runs/*/metrics.json) into the scaling tables.

Every metrics.json is validated against workflow/schemas/run.schema.json, then the
derived rows of all records are checked at once with a pandera schema. A malformed
record is reported by path and field (a warning on stderr and a row in status.csv)
and the other records still aggregate; partial results are normal.

Outputs
  runs.csv     one row per valid run record of the config's run table
  summary.csv  one row per configuration (partition, backend, batch_per_worker,
               lr_rule, workers): medians and min/max over repeats, speedup and
               efficiency against the 1-worker run of the same group, speedup per GPU
  status.csv   every run of the config's run table (plus any other run directory):
               completed, nan_loss, failed, missing or malformed
  epochs.csv   one row per epoch of every run in runs.csv (loss curves)

Definitions
  epoch time      median wall time of the non-warm-up epochs of a run (rank 0)
  throughput      median samples/s (all ranks) of the non-warm-up epochs
  phase shares    sum of each phase (data, compute, sync, update) over the non-warm-up
                  epochs divided by the sum of all four: shares of the training-step
                  time, adding up to 1 (as the run record's own summary); other_share is
                  the part of the epoch wall time outside the four phases (test
                  evaluation, launch overhead)
  time to target  training wall time (warm-up included) at the end of the first epoch
                  whose test loss is at or below the config's target test loss
  S(n) = T(1)/T(n) with T the median over completed repeats; E(n) = S(n)/n;
  speedup per GPU = slope of an ordinary least-squares line through (n, S(n)) of a
  group (n = 1 included). A group without a completed 1-worker run keeps its rows,
  with has_baseline false and NaN speedups.

Example
  hvdscale aggregate --runs-dir results/runs --config results/config/full.json \\
      --out-runs results/scaling/runs.csv --out-summary results/scaling/summary.csv \\
      --out-status results/scaling/status.csv
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import numpy as np
import pandas as pd

from hvdscale.config import RUN_SCHEMA, ConfigError, parse_run_id, run_table, validate_config
from hvdscale.errors import UserError
from hvdscale.io import atomic_path

GROUP_KEYS = ["partition", "backend", "batch_per_worker", "lr_rule"]
CONFIG_KEYS = GROUP_KEYS + ["workers"]
PHASES = ["data", "compute", "sync", "update"]

RUNS_COLUMNS = [
    "run_id", "partition", "backend", "nodes", "workers", "workers_per_node", "batch_per_worker",
    "global_batch", "lr_rule", "repeat", "learning_rate", "epochs", "warmup_epochs", "launcher", "controller",
    "compression", "model_bytes", "target_test_loss", "status", "exit_status", "error",
    "epochs_completed", "epochs_timed", "steps_per_epoch", "epoch_time_s", "throughput", "step_time_s",
    "data_step_s", "compute_step_s", "sync_step_s", "update_step_s", "other_step_s",
    "data_share", "compute_share", "sync_share", "update_share", "other_share",
    "utilisation", "utilisation_kind", "final_test_loss", "best_test_loss", "final_train_loss",
    "time_to_target_s", "reached_target", "train_time_s", "slurm_job_id", "hosts", "n_hosts", "devices",
    "cpu_model", "git_commit", "config_hash", "config_hash_match", "python", "tensorflow", "horovod",
    "mpi", "numpy", "started_utc", "resumed", "attempts", "timing_method", "record",
]
EPOCH_COLUMNS = ["run_id", "epoch", "warmup", "wall_s", "steps", "samples", "throughput", "time_data_s",
                 "time_compute_s", "time_sync_s", "time_update_s", "train_loss", "test_loss", "elapsed_s",
                 "utilisation_mean"]
STATUS_COLUMNS = ["run_id", "partition", "backend", "nodes", "workers", "batch_per_worker", "lr_rule",
                  "repeat", "status", "in_config", "exit_status", "detail", "path"]
SUMMARY_COLUMNS = [
    "partition", "backend", "batch_per_worker", "lr_rule", "workers", "nodes", "global_batch",
    "n_expected", "n_completed", "n_nan_loss", "n_failed", "n_missing", "n_malformed",
    "epoch_time_s", "epoch_time_min_s", "epoch_time_max_s", "throughput", "throughput_min", "throughput_max",
    "steps_per_epoch", "step_time_s", "data_step_s", "compute_step_s", "sync_step_s", "update_step_s",
    "other_step_s", "data_share", "compute_share", "sync_share", "update_share", "utilisation",
    "final_test_loss", "final_test_loss_min", "final_test_loss_max", "best_test_loss",
    "time_to_target_s", "time_to_target_min_s", "time_to_target_max_s", "n_reached_target",
    "has_baseline", "baseline_status", "baseline_epoch_time_s", "baseline_time_to_target_s",
    "speedup", "speedup_min", "speedup_max", "efficiency", "speedup_ttt", "efficiency_ttt",
    "speedup_per_gpu", "speedup_fit_intercept", "speedup_per_gpu_ttt", "fit_points",
]
CSV_FLOAT_FORMAT = "%.10g"


# ----------------------------------------------------------------------------- config


def load_config_json(path: str | Path) -> dict:
    """The validated config written by ``write-config`` (JSON), or a YAML config file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"config {path}: not found (write it with 'hvdscale write-config')") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        import yaml

        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise UserError(f"config {path}: neither JSON nor YAML: {exc}") from None
    try:
        return validate_config(raw)
    except ConfigError as exc:
        raise UserError(f"config {path}: {exc}") from None


# ----------------------------------------------------------------------------- validation


class RecordValidator:
    """Validates run records against run.schema.json.

    fastjsonschema (in the workflow env as a Snakemake dependency) is used as a fast
    first pass when available; jsonschema is the reference and names the failing field.
    """

    def __init__(self, schema_path: Path = RUN_SCHEMA):
        from jsonschema import Draft202012Validator

        self.schema = json.loads(Path(schema_path).read_text())
        self._ref = Draft202012Validator(self.schema)
        try:
            import fastjsonschema

            self._fast = fastjsonschema.compile(self.schema)
        except Exception:  # not installed, or cannot compile: jsonschema alone
            self._fast = None

    def problem(self, rec) -> str | None:
        """None if valid, else 'field X: message' for the first problem (and a count)."""
        if self._fast is not None:
            try:
                self._fast(rec)
                return None
            except Exception:
                pass
        errors = sorted(self._ref.iter_errors(rec),
                        key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path]))
        if not errors:
            return None
        err = errors[0]
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        msg = err.message if len(err.message) <= 160 else err.message[:157] + "..."
        more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
        return f"field {where}: {msg}{more}"


# ----------------------------------------------------------------------------- one record


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def record_row(rec: dict, path: str) -> tuple[dict, list[dict]]:
    """The runs.csv row and the epochs.csv rows of one schema-valid record."""
    c, env, eps = rec["config"], rec["environment"], rec["epochs"]
    timed = [e for e in eps if not e["warmup"]]
    nan = float("nan")

    def med(values):
        values = [v for v in values if _finite(v)]
        return float(median(values)) if values else nan

    wall_sum = sum(e["wall_s"] for e in timed)
    split_sum = sum(e[f"time_{ph}_s"] for e in timed for ph in PHASES)
    row = {k: c[k] for k in ("partition", "backend", "nodes", "workers", "workers_per_node", "batch_per_worker",
                             "global_batch", "lr_rule", "repeat", "learning_rate", "epochs", "warmup_epochs",
                             "launcher", "controller", "compression", "model_bytes", "target_test_loss")}
    row.update(run_id=rec["run_id"], status=rec["status"], exit_status=rec["exit_status"], error=rec["error"],
               epochs_completed=len(eps), epochs_timed=len(timed),
               steps_per_epoch=med([e["steps"] for e in timed]),
               epoch_time_s=med([e["wall_s"] for e in timed]),
               throughput=med([e["throughput"] for e in timed]),
               step_time_s=med([e["wall_s"] / e["steps"] for e in timed]))
    phase_sum = 0.0
    for ph in PHASES:
        row[f"{ph}_step_s"] = med([e[f"time_{ph}_s"] / e["steps"] for e in timed])
        tot = sum(e[f"time_{ph}_s"] for e in timed)
        phase_sum += tot
        row[f"{ph}_share"] = tot / split_sum if split_sum > 0 else nan
    row["other_step_s"] = med([(e["wall_s"] - sum(e[f"time_{ph}_s"] for ph in PHASES)) / e["steps"] for e in timed])
    row["other_share"] = (wall_sum - phase_sum) / wall_sum if wall_sum > 0 else nan
    util = [e["utilisation_mean"] for e in timed if _finite(e.get("utilisation_mean"))]
    if not util:
        util = [s[1] for s in rec["utilisation"]["samples"]]
    row["utilisation"] = float(np.mean(util)) if util else nan
    row["utilisation_kind"] = rec["utilisation"]["kind"]
    target = c["target_test_loss"]
    tests = [e["test_loss"] for e in eps]
    finite_tests = [t for t in tests if _finite(t)]
    row["final_test_loss"] = tests[-1] if tests and _finite(tests[-1]) else nan
    row["best_test_loss"] = min(finite_tests) if finite_tests else nan
    row["final_train_loss"] = eps[-1]["train_loss"] if eps and _finite(eps[-1]["train_loss"]) else nan
    ttt = next((e["elapsed_s"] for e in eps if _finite(e["test_loss"]) and e["test_loss"] <= target), None)
    row["time_to_target_s"] = ttt if ttt is not None else nan
    row["reached_target"] = ttt is not None
    row["train_time_s"] = eps[-1]["elapsed_s"] if eps else nan
    hosts = list(dict.fromkeys(env["hostnames"]))
    row.update(slurm_job_id=env["slurm_job_id"], hosts=",".join(hosts), n_hosts=len(hosts),
               devices=";".join(dict.fromkeys(env["devices"])), cpu_model=env.get("cpu_model"),
               git_commit=env["git_commit"], config_hash=env["config_hash"], config_hash_match=pd.NA,
               python=env["python"], tensorflow=env["tensorflow"], horovod=env["horovod"], mpi=env["mpi"],
               numpy=env["numpy"], started_utc=env["started_utc"], resumed=rec["resume"]["resumed"],
               attempts=len(rec["resume"]["attempts"]), timing_method=rec["timing_method"], record=path)
    epoch_rows = [{"run_id": rec["run_id"], **{k: e.get(k) for k in EPOCH_COLUMNS[1:]}} for e in eps]
    return row, epoch_rows


# ----------------------------------------------------------------------------- aggregation


@dataclass
class Aggregation:
    runs: pd.DataFrame
    summary: pd.DataFrame
    status: pd.DataFrame
    epochs: pd.DataFrame
    problems: list[str] = field(default_factory=list)  # 'path: field ...' lines


def _read_json(path: Path):
    try:
        return json.loads(path.read_text()), None
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror})"


def _failure_detail(path: Path) -> tuple[int | None, str]:
    """Exit status and a one-line reason from failure.json ({run_id, status, exit_status,
    error | message | error_tail, time | time_utc, ...})."""
    data, err = _read_json(path)
    if err or not isinstance(data, dict):
        return None, f"failure.json {err or 'is not an object'}"
    es = data.get("exit_status")
    reason = data.get("error") or data.get("message")
    if not reason and data.get("error_tail"):
        lines = [ln.strip() for ln in str(data["error_tail"]).splitlines() if ln.strip()]
        reason = lines[-1] if lines else None
    reason = str(reason or "failed (no error message)")
    if len(reason) > 300:
        reason = reason[:297] + "..."
    when = data.get("time") or data.get("time_utc")
    return (es if isinstance(es, int) and not isinstance(es, bool) else None), \
        reason + (f" ({when})" if when else "")


def aggregate(runs_dir: str | Path, cfg: dict | None = None, warn=None) -> Aggregation:
    """Read, validate and aggregate every run under ``runs_dir`` (see the module doc)."""
    runs_dir = Path(runs_dir)
    warn = warn or (lambda msg: None)
    table = {r.run_id: r for r in run_table(cfg)} if cfg is not None else None
    chash = None
    if cfg is not None:
        from hvdscale.config import config_hash

        chash = config_hash(cfg)
    validator = RecordValidator()
    problems: list[str] = []

    def problem(path, msg):
        line = f"{path}: {msg}"
        problems.append(line)
        warn(line)

    status: dict[str, dict] = {}
    rows, epoch_rows = [], []
    dirs = sorted(d for d in runs_dir.iterdir() if d.is_dir() and not d.name.startswith(".")) \
        if runs_dir.is_dir() else []
    for d in dirs:
        rid = d.name
        in_config = table is None or rid in table
        metrics, failure = d / "metrics.json", d / "failure.json"
        st = {"run_id": rid, "in_config": in_config, "exit_status": pd.NA, "detail": "", "path": ""}
        if not metrics.exists() and not failure.exists():
            continue  # e.g. a run directory with only a checkpoint: treated as missing below
        if metrics.exists():
            st["path"] = str(metrics)
            rec, err = _read_json(metrics)
            if err is None:
                err = validator.problem(rec)
            if err is None and rec["run_id"] != rid:
                err = f"field run_id: {rec['run_id']!r} does not match the run directory {rid!r}"
            if err is not None:
                if failure.exists():
                    es, ferr = _failure_detail(failure)
                    err += f"; failure.json: {ferr}"
                st.update(status="malformed", detail=err)
                problem(metrics, err)
            else:
                st.update(status=rec["status"], exit_status=rec["exit_status"], detail=rec["error"] or "")
                if in_config:
                    row, eps = record_row(rec, str(metrics))
                    if chash is not None:
                        row["config_hash_match"] = row["config_hash"] == chash
                    rows.append(row)
                    epoch_rows.extend(eps)
        else:
            es, ferr = _failure_detail(failure)
            st.update(status="failed", exit_status=es if es is not None else pd.NA, detail=ferr, path=str(failure))
        if not in_config:
            warn(f"{d}: run {rid!r} is not in the config's run table; listed in status.csv, not aggregated")
        status[rid] = st

    runs = pd.DataFrame(rows, columns=RUNS_COLUMNS)
    runs, bad = _validate_runs(runs)
    for rid, msg in bad.items():
        status[rid].update(status="malformed", detail=msg)
        problem(status[rid]["path"], msg)
    epochs = pd.DataFrame(epoch_rows, columns=EPOCH_COLUMNS)
    if bad:
        epochs = epochs[~epochs["run_id"].isin(list(bad))]

    status_df = _status_frame(status, table)
    runs = runs.sort_values(["partition", "backend", "batch_per_worker", "lr_rule", "workers", "repeat"],
                            kind="stable").reset_index(drop=True)
    summary = summarise(runs, status_df)
    return Aggregation(runs=runs, summary=summary, status=status_df, epochs=epochs.reset_index(drop=True),
                       problems=problems)


def _validate_runs(runs: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """Validate all rows at once; return the valid rows and {run_id: 'field ...'} of the others."""
    import pandera.pandas as pa

    from hvdscale.analysis.schemas import RUNS_SCHEMA, describe_failures

    if runs.empty:
        return runs, {}
    try:
        return RUNS_SCHEMA.validate(runs, lazy=True), {}
    except pa.errors.SchemaErrors as err:
        fails = describe_failures(err)
        if None in fails:  # a column-level problem: a bug here, not in a record
            raise RuntimeError("runs table does not match its schema: " + "; ".join(fails[None])) from err
        bad = {runs.at[i, "run_id"]: "row " + "; ".join(msgs) for i, msgs in fails.items()}
        good = runs[~runs["run_id"].isin(list(bad))]
        return RUNS_SCHEMA.validate(good), bad


def _status_frame(status: dict[str, dict], table: dict | None) -> pd.DataFrame:
    rows = []
    ids = list(table) if table is not None else []
    ids += sorted(set(status) - set(ids))
    for rid in ids:
        st = status.get(rid) or {"run_id": rid, "in_config": True, "status": "missing", "exit_status": pd.NA,
                                 "detail": "no metrics.json or failure.json", "path": ""}
        if table is not None and rid in table:
            r = table[rid]
            cfgf = dict(partition=r.partition, backend=r.backend, nodes=r.nodes, workers=r.workers,
                        batch_per_worker=r.batch, lr_rule=r.lr_rule, repeat=r.repeat)
        else:
            try:
                p = parse_run_id(rid)
                cfgf = dict(partition=p["partition"], backend=p["backend"], nodes=p["nodes"], workers=p["workers"],
                            batch_per_worker=p["batch"], lr_rule=p["lr_rule"], repeat=p["repeat"])
            except ConfigError:
                cfgf = dict(partition=None, backend=None, nodes=pd.NA, workers=pd.NA, batch_per_worker=pd.NA,
                            lr_rule=None, repeat=pd.NA)
        rows.append({**st, **cfgf})
    df = pd.DataFrame(rows, columns=STATUS_COLUMNS)
    for col in ("nodes", "workers", "batch_per_worker", "repeat", "exit_status"):
        df[col] = df[col].astype("Int64")
    df["in_config"] = df["in_config"].astype(bool)
    return df


def _fit_slope(n: np.ndarray, s: np.ndarray) -> tuple[float, float, int]:
    ok = np.isfinite(s)
    n, s = n[ok].astype(float), s[ok]
    if len(np.unique(n)) < 2:
        return math.nan, math.nan, int(ok.sum())
    slope, intercept = np.polyfit(n, s, 1)
    return float(slope), float(intercept), len(n)


def summarise(runs: pd.DataFrame, status: pd.DataFrame) -> pd.DataFrame:
    """summary.csv from runs.csv and status.csv (see the module doc for the definitions)."""
    st = status[status["in_config"]].dropna(subset=["workers"])
    st = st[st["partition"].notna()]
    configs = (st.groupby(CONFIG_KEYS, dropna=False)
               .agg(nodes=("nodes", "max"), n_expected=("in_config", "sum"))
               .reset_index())
    counts = pd.crosstab([st[k] for k in CONFIG_KEYS], st["status"])
    for s in ("completed", "nan_loss", "failed", "missing", "malformed"):
        if s not in counts:
            counts[s] = 0
    counts = counts.rename(columns={s: f"n_{s}" for s in counts.columns}).reset_index()
    configs = configs.merge(counts, on=CONFIG_KEYS, how="left")
    # configurations that only exist as valid records (no config given)
    if not runs.empty:
        extra = runs[CONFIG_KEYS + ["nodes"]].drop_duplicates(CONFIG_KEYS)
        configs = pd.concat([configs, extra.merge(configs[CONFIG_KEYS], how="left", indicator=True)
                             .query("_merge == 'left_only'").drop(columns="_merge")], ignore_index=True)
    for k in ("batch_per_worker", "workers", "nodes"):
        configs[k] = configs[k].astype("int64")
    configs["global_batch"] = configs["workers"] * configs["batch_per_worker"]

    done = runs[runs["status"] == "completed"]
    stat_cols = ["steps_per_epoch", "step_time_s", "data_step_s", "compute_step_s", "sync_step_s",
                 "update_step_s", "other_step_s", "data_share", "compute_share", "sync_share", "update_share",
                 "utilisation", "best_test_loss"]
    agg = {c: (c, "median") for c in stat_cols}
    agg.update(epoch_time_s=("epoch_time_s", "median"), epoch_time_min_s=("epoch_time_s", "min"),
               epoch_time_max_s=("epoch_time_s", "max"), throughput=("throughput", "median"),
               throughput_min=("throughput", "min"), throughput_max=("throughput", "max"),
               final_test_loss=("final_test_loss", "median"), final_test_loss_min=("final_test_loss", "min"),
               final_test_loss_max=("final_test_loss", "max"), time_to_target_s=("time_to_target_s", "median"),
               time_to_target_min_s=("time_to_target_s", "min"), time_to_target_max_s=("time_to_target_s", "max"),
               n_reached_target=("reached_target", "sum"), n_completed_rec=("run_id", "count"))
    stats = done.groupby(CONFIG_KEYS).agg(**agg).reset_index() if not done.empty else \
        pd.DataFrame(columns=CONFIG_KEYS + list(agg))
    for k in ("batch_per_worker", "workers"):
        stats[k] = stats[k].astype("int64")
    out = configs.merge(stats, on=CONFIG_KEYS, how="left")
    for s in ("completed", "nan_loss", "failed", "missing", "malformed"):
        col = f"n_{s}"
        out[col] = out[col].fillna(0).astype("int64") if col in out else 0
    # records present without a config: count them as completed from the runs table
    out["n_completed"] = np.maximum(out["n_completed"], out["n_completed_rec"].fillna(0)).astype("int64")
    out["n_reached_target"] = out["n_reached_target"].fillna(0).astype("int64")
    out["n_expected"] = out["n_expected"].fillna(0).astype("int64")

    # baseline: the 1-worker configuration of the same group
    base = out[out["workers"] == 1][GROUP_KEYS + ["epoch_time_s", "time_to_target_s", "n_nan_loss", "n_failed",
                                                  "n_malformed"]]
    base = base.rename(columns={"epoch_time_s": "baseline_epoch_time_s",
                                "time_to_target_s": "baseline_time_to_target_s",
                                "n_nan_loss": "_b_nan", "n_failed": "_b_failed", "n_malformed": "_b_bad"})
    base["_b_exists"] = True
    out = out.merge(base, on=GROUP_KEYS, how="left")
    out["has_baseline"] = out["baseline_epoch_time_s"].notna()
    out["baseline_status"] = np.select(
        [out["has_baseline"], out["_b_exists"].isna(), (out["_b_nan"] + out["_b_failed"] + out["_b_bad"]) > 0],
        ["ok", "not_in_sweep", "failed"], default="missing")
    out["speedup"] = out["baseline_epoch_time_s"] / out["epoch_time_s"]
    out["speedup_min"] = out["baseline_epoch_time_s"] / out["epoch_time_max_s"]
    out["speedup_max"] = out["baseline_epoch_time_s"] / out["epoch_time_min_s"]
    out["efficiency"] = out["speedup"] / out["workers"]
    out["speedup_ttt"] = out["baseline_time_to_target_s"] / out["time_to_target_s"]
    out["efficiency_ttt"] = out["speedup_ttt"] / out["workers"]
    fits = []
    for key, g in out.groupby(GROUP_KEYS, sort=False):
        slope, icpt, npts = _fit_slope(g["workers"].to_numpy(), g["speedup"].to_numpy(dtype=float))
        slope_t, _, _ = _fit_slope(g["workers"].to_numpy(), g["speedup_ttt"].to_numpy(dtype=float))
        fits.append((*key, slope, icpt, slope_t, npts))
    fits = pd.DataFrame(fits, columns=GROUP_KEYS + ["speedup_per_gpu", "speedup_fit_intercept",
                                                    "speedup_per_gpu_ttt", "fit_points"])
    out = out.merge(fits, on=GROUP_KEYS, how="left")
    out = out.sort_values(CONFIG_KEYS, kind="stable").reset_index(drop=True)
    return out[SUMMARY_COLUMNS]


# ----------------------------------------------------------------------------- files


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    with atomic_path(path, ".csv") as tmp:
        df.to_csv(tmp, index=False, float_format=CSV_FLOAT_FORMAT)


STRING_COLUMNS = ["run_id", "partition", "backend", "lr_rule", "status", "error", "detail", "path", "launcher",
                  "controller", "compression", "slurm_job_id", "hosts", "devices", "cpu_model", "git_commit",
                  "config_hash", "python", "tensorflow", "horovod", "mpi", "numpy", "started_utc", "record",
                  "utilisation_kind", "baseline_status", "timing_method"]


def _read_csv(path: str | Path, what: str, required: list[str]) -> pd.DataFrame:
    path = Path(path)
    try:
        header = pd.read_csv(path, nrows=0).columns
        df = pd.read_csv(path, keep_default_na=True, dtype={c: "str" for c in STRING_COLUMNS if c in header})
    except FileNotFoundError:
        raise UserError(f"{what} {path}: not found (run 'hvdscale aggregate' first)") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise UserError(f"{what} {path}: not a readable CSV file ({exc})") from None
    missing = [c for c in required if c not in df.columns]
    if missing:
        raise UserError(f"{what} {path}: missing column(s) {', '.join(missing)}; "
                        "was it written by 'hvdscale aggregate'?")
    return df


def read_runs(path) -> pd.DataFrame:
    return _read_csv(path, "runs table", RUNS_COLUMNS)


def read_summary(path) -> pd.DataFrame:
    df = _read_csv(path, "summary table", SUMMARY_COLUMNS)
    for c in ("has_baseline",):
        df[c] = df[c].astype(str).str.lower().eq("true")
    return df


def read_status(path) -> pd.DataFrame:
    df = _read_csv(path, "status table", STATUS_COLUMNS)
    df["in_config"] = df["in_config"].astype(str).str.lower().eq("true")
    df["detail"] = df["detail"].fillna("")
    return df


def read_epochs(path) -> pd.DataFrame:
    return _read_csv(path, "epochs table", EPOCH_COLUMNS)


def default_epochs_path(runs_csv: str | Path) -> Path:
    return Path(runs_csv).with_name("epochs.csv")


# ----------------------------------------------------------------------------- CLI


def add_arguments(p):
    p.add_argument("--runs-dir", default="results/runs", help="directory of run directories (default: %(default)s)")
    p.add_argument("--config", help="validated config JSON (results/config/full.json); without it status.csv "
                   "lists only the runs found")
    p.add_argument("--out-runs", default="results/scaling/runs.csv", help="(default: %(default)s)")
    p.add_argument("--out-summary", default="results/scaling/summary.csv", help="(default: %(default)s)")
    p.add_argument("--out-status", default="results/scaling/status.csv", help="(default: %(default)s)")
    p.add_argument("--out-epochs", help="per-epoch table (default: epochs.csv next to --out-runs)")
    p.add_argument("--quiet", action="store_true", help="no summary line on stdout")


def run(args) -> int:
    cfg = load_config_json(args.config) if args.config else None
    runs_dir = Path(args.runs_dir)
    if not runs_dir.is_dir() and runs_dir.exists():
        raise UserError(f"--runs-dir {runs_dir}: not a directory")

    def warn(msg):
        print(f"hvdscale aggregate: warning: {msg}", file=sys.stderr)

    agg = aggregate(runs_dir, cfg, warn=warn)
    write_csv(agg.runs, args.out_runs)
    write_csv(agg.summary, args.out_summary)
    write_csv(agg.status, args.out_status)
    write_csv(agg.epochs, args.out_epochs or default_epochs_path(args.out_runs))
    if not args.quiet:
        counts = agg.status["status"].value_counts()
        parts = ", ".join(f"{counts.get(s, 0)} {s}" for s in ("completed", "nan_loss", "failed", "missing",
                                                              "malformed"))
        print(f"aggregate: {len(agg.status)} runs ({parts}); {len(agg.summary)} configurations; "
              f"wrote {args.out_runs}, {args.out_summary}, {args.out_status}")
    return 0
