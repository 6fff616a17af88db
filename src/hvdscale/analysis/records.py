"""One run directory at a time: read and validate metrics.json (run.schema.json) or
failure.json, and turn a valid record into its runs.csv row and epochs.csv rows; then
the pandera check of all rows at once and the status table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import median

import numpy as np
import pandas as pd

from hvdscale.analysis.columns import (
    ENV_VERSIONS,
    EPOCH_COLUMNS,
    FRAMEWORK_DEFAULT,
    LOSS_SCALE_FIELDS,
    METRIC_EPOCH_COLUMNS,
    PHASES,
    RECORD_CONFIG_FIELDS,
    STATUS_COLUMNS,
    STATUS_CONFIG_FIELDS,
    SYNC_FIELDS,
)
from hvdscale.analysis.schemas import RUNS_SCHEMA, describe_failures, parse_any_run_id
from hvdscale.config.load import RUN_SCHEMA
from hvdscale.errors import ConfigError

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
        errors = sorted(
            self._ref.iter_errors(rec),
            key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path]),
        )
        if not errors:
            return None
        err = errors[0]
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        msg = err.message if len(err.message) <= 160 else err.message[:157] + "..."
        more = (
            f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
            if len(errors) > 1
            else ""
        )
        return f"field {where}: {msg}{more}"


# ----------------------------------------------------------------------------- one record


def _finite(x) -> bool:
    return x is not None and isinstance(x, (int, float)) and math.isfinite(x)


def _med(values) -> float:
    values = [v for v in values if _finite(v)]
    return float(median(values)) if values else math.nan


def _timing_fields(timed: list[dict]) -> dict:
    """Medians over the timed epochs; phase times per step and phase shares."""
    nan = math.nan
    wall_sum = sum(e["wall_s"] for e in timed)
    phase_sums = {ph: sum(e[f"time_{ph}_s"] for e in timed) for ph in PHASES}
    split_sum = sum(phase_sums.values())
    row = {
        "steps_per_epoch": _med([e["steps"] for e in timed]),
        "epoch_time_s": _med([e["wall_s"] for e in timed]),
        "throughput": _med([e["throughput"] for e in timed]),
        "step_time_s": _med([e["wall_s"] / e["steps"] for e in timed]),
    }
    for ph in PHASES:
        row[f"{ph}_step_s"] = _med([e[f"time_{ph}_s"] / e["steps"] for e in timed])
        row[f"{ph}_share"] = phase_sums[ph] / split_sum if split_sum > 0 else nan
    row["other_step_s"] = _med(
        [(e["wall_s"] - sum(e[f"time_{ph}_s"] for ph in PHASES)) / e["steps"] for e in timed]
    )
    row["other_share"] = (wall_sum - split_sum) / wall_sum if wall_sum > 0 else nan
    return row


def _loss_fields(rec: dict) -> dict:
    """Losses and the time to target from the record's ``target`` block (the target is
    fixed before training: results/scaling/target.json). A censored run (target not
    reached within its budget) has time and epochs to target +inf; a record without a
    target block NaN. The test loss is only reported, never used to choose anything."""
    nan, inf = math.nan, math.inf
    eps = rec["epochs"]
    tests = [e.get("test_loss") for e in eps]
    finite_tests = [t for t in tests if _finite(t)]
    vals = [e.get("val_loss") for e in eps]
    finite_vals = [v for v in vals if _finite(v)]
    tgt = rec.get("target") or {}
    reached = bool(tgt.get("reached"))
    if not tgt:
        ttt = ep = nan
    elif reached and _finite(tgt.get("time_to_target_s")):
        ttt, ep = float(tgt["time_to_target_s"]), tgt.get("epoch")
    else:
        ttt, ep = inf, None
    warmup = int(rec["config"].get("warmup_epochs") or 0)
    return {
        "final_test_loss": finite_tests[-1] if finite_tests else nan,
        "best_test_loss": min(finite_tests) if finite_tests else nan,
        "final_val_loss": vals[-1] if vals and _finite(vals[-1]) else nan,
        "best_val_loss": tgt.get("best_val_loss")
        if _finite(tgt.get("best_val_loss"))
        else (min(finite_vals) if finite_vals else nan),
        "final_train_loss": eps[-1]["train_loss"]
        if eps and _finite(eps[-1]["train_loss"])
        else nan,
        "time_to_target_s": ttt,
        "reached_target": reached,
        "target_epoch": float(ep) if ep is not None else nan,
        "epochs_to_target": float(ep) + 1 if ep is not None else (inf if tgt else nan),
        "target_in_warmup": bool(reached and ep is not None and (ep == 0 or ep < warmup)),
        "target_censored": bool(tgt.get("censored", bool(tgt) and not reached)),
        "stop_reason": str(tgt.get("stop_reason") or ""),
        "target_val_loss": tgt.get("value") if _finite(tgt.get("value")) else nan,
        "target_mode": str(tgt.get("mode") or ""),
        "train_time_s": eps[-1]["elapsed_s"] if eps else nan,
    }


def _startup_fields(rec: dict, time_to_target: float) -> dict:
    """Issue 30 item 7: the start-up (timing.startup_s: the launcher's start to the epoch
    loop, summed over attempts) and the launch-to-target time (target.launch_to_target_s:
    start-up + time to target). Without a start-up figure (older records, ranks started
    without the launcher's stamp) both are NaN; with one, a run that did not reach the
    target has launch to target +inf, like its time to target."""
    nan = math.nan
    s = (rec.get("timing") or {}).get("startup_s")
    startup = float(s) if _finite(s) else nan
    if math.isnan(startup) or math.isnan(time_to_target):
        return {"startup_s": startup, "launch_to_target_s": nan}
    if math.isinf(time_to_target):
        return {"startup_s": startup, "launch_to_target_s": math.inf}
    l2t = (rec.get("target") or {}).get("launch_to_target_s")
    return {"startup_s": startup, "launch_to_target_s": float(l2t) if _finite(l2t) else nan}


def _study_fields(rec: dict) -> dict:
    """Kind, seed and label proof of one record."""
    c = rec["config"]
    proof = rec.get("label_proof")
    ok = None if not isinstance(proof, dict) else bool(proof.get("ok", True))
    return {
        "kind": str(c.get("kind") or ""),
        "seed": c.get("seed"),
        "label_ok": pd.NA if ok is None else ok,
        "label_problems": "; ".join(map(str, (proof or {}).get("problems") or [])),
    }


def label_failure(rec: dict) -> str | None:
    """The label proof's reasons when it failed (the run is mislabelled), else None."""
    proof = rec.get("label_proof")
    if isinstance(proof, dict) and proof.get("ok") is False:
        return "label proof failed: " + (
            "; ".join(map(str, proof.get("problems") or [])) or "no reason given"
        )
    return None


def _environment_fields(rec: dict) -> dict:
    env = rec["environment"]
    hosts = list(dict.fromkeys(env["hostnames"]))
    versions = ("git_commit", "config_hash", *ENV_VERSIONS)
    return {
        "slurm_job_id": env["slurm_job_id"],
        "hosts": ",".join(hosts),
        "n_hosts": len(hosts),
        "devices": ";".join(dict.fromkeys(env["devices"])),
        "cpu_model": env.get("cpu_model"),
        **{k: env[k] for k in versions},
        "config_hash_match": pd.NA,
        "started_utc": env["started_utc"],
        "resumed": rec["resume"]["resumed"],
        "attempts": len(rec["resume"]["attempts"]),
        "timing_method": rec["timing_method"],
    }


def framework_of(rec: dict) -> str:
    """The record's framework: config.framework, absent before issue 19 = horovod-tf."""
    return str(rec["config"].get("framework") or FRAMEWORK_DEFAULT)


def _sync_fields(rec: dict) -> dict:
    """timing.sync (issue 19: separate allreduce, DDP comm hook, exposed sync, step
    without communication; per-step seconds); NaN where absent or null."""
    sync = (rec.get("timing") or {}).get("sync") or {}
    return {
        col: float(sync[key]) if _finite(sync.get(key)) else math.nan
        for col, key in SYNC_FIELDS.items()
    }


def _loss_scale_fields(rec: dict) -> dict:
    """loss_scale (issue 32: fp16's final loss scale and skipped updates); NaN where
    the record has none (other precisions, records before it)."""
    ls = rec.get("loss_scale") or {}
    return {
        col: float(ls[key]) if _finite(ls.get(key)) else math.nan
        for col, key in LOSS_SCALE_FIELDS.items()
    }


def record_row(rec: dict, path: str) -> tuple[dict, list[dict]]:
    """The runs.csv row and the epochs.csv rows of one schema-valid record."""
    c, eps = rec["config"], rec["epochs"]
    timed = [e for e in eps if not e["warmup"]]
    row = {k: c.get(k) for k in RECORD_CONFIG_FIELDS}
    row["framework"] = framework_of(rec)
    try:
        rid = parse_any_run_id(rec["run_id"])
    except ConfigError:  # the pandera check reports the malformed id
        rid = {"candidate": "", "lr_mult": None}
    row["candidate"] = rid["candidate"]
    row["lr_multiplier"] = rid["lr_mult"] if rid["lr_mult"] is not None else math.nan
    row.update(
        run_id=rec["run_id"],
        status=rec["status"],
        exit_status=rec["exit_status"],
        error=rec["error"],
        epochs_completed=len(eps),
        epochs_timed=len(timed),
    )
    row.update(_timing_fields(timed))
    util = [e["utilisation_mean"] for e in timed if _finite(e.get("utilisation_mean"))]
    if not util:
        util = [s[1] for s in rec["utilisation"]["samples"]]
    row["utilisation"] = float(np.mean(util)) if util else math.nan
    row["utilisation_kind"] = rec["utilisation"]["kind"]
    row.update(_loss_fields(rec))
    row.update(_startup_fields(rec, row["time_to_target_s"]))
    row["target_test_loss"] = row["target_val_loss"]  # the old name: now a validation loss
    row["precision"] = c.get("precision") or "fp32"  # issue 32 (older records: fp32, off)
    row["compile"] = c.get("compile") or "off"
    warm = (rec.get("timing") or {}).get("warm_up_s")
    row["warm_up_s"] = float(warm) if _finite(warm) else math.nan
    row.update(_loss_scale_fields(rec))
    row.update(_study_fields(rec))
    if label_failure(rec):
        row["status"] = "mislabelled"
    row.update(_environment_fields(rec))
    row["record"] = path
    row.update(_sync_fields(rec))
    row.update(_metric_fields(rec))
    fw = row["framework"]
    epoch_rows = [
        {
            "run_id": rec["run_id"],
            "framework": fw,
            **{k: e.get(k) for k in EPOCH_COLUMNS[2:]},
            **{k: e[k] for k in METRIC_EPOCH_COLUMNS if k in e},
        }
        for e in eps
    ]
    return row, epoch_rows


def _metric_fields(rec: dict) -> dict:
    """The target's metric and the run's best value of it (the record's target.metric and
    best_value) where the target is on another metric than the validation loss (a
    classifier's accuracy); nothing for a validation-loss target."""
    tgt = rec.get("target") or {}
    metric = tgt.get("metric")
    if not metric or metric == "val_loss":
        return {}
    best = tgt.get("best_value")
    return {"target_metric": str(metric), "best_target_value": best if _finite(best) else math.nan}


def read_json(path: Path):
    """(data, None) or (None, 'why it cannot be read')."""
    try:
        return json.loads(path.read_text()), None
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror})"


def failure_detail(path: Path) -> tuple[int | None, str]:
    """Exit status and a one-line reason from failure.json ({run_id, status, exit_status,
    error | message | error_tail, time | time_utc, ...})."""
    data, err = read_json(path)
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
    return (es if isinstance(es, int) and not isinstance(es, bool) else None), reason + (
        f" ({when})" if when else ""
    )


def read_run_dir(d: Path, validator: RecordValidator) -> tuple[dict, dict | None, str | None]:
    """(status fields, valid record or None, problem or None) of one run directory
    that holds a metrics.json or a failure.json."""
    rid = d.name
    metrics, failure = d / "metrics.json", d / "failure.json"
    st = {"run_id": rid, "exit_status": pd.NA, "detail": "", "path": ""}
    if not metrics.exists():
        es, ferr = failure_detail(failure)
        es = es if es is not None else pd.NA
        st.update(status="failed", exit_status=es, detail=ferr, path=str(failure))
        return st, None, None
    st["path"] = str(metrics)
    rec, err = read_json(metrics)
    if err is None:
        err = validator.problem(rec)
    if err is None and rec["run_id"] != rid:
        err = f"field run_id: {rec['run_id']!r} does not match the run directory {rid!r}"
    if err is not None:
        if failure.exists():
            err += f"; failure.json: {failure_detail(failure)[1]}"
        st.update(status="malformed", detail=err)
        return st, None, err
    st.update(status=rec["status"], exit_status=rec["exit_status"], detail=rec["error"] or "")
    if label_failure(rec):
        st.update(status="mislabelled", detail=label_failure(rec))
    return st, rec, None


# ----------------------------------------------------------------------------- tables


def validate_runs(runs: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, str]]:
    """Validate all rows at once; return the valid rows and {run_id: 'field ...'} of the others."""
    import pandera.pandas as pa

    if runs.empty:
        return runs, {}
    try:
        return RUNS_SCHEMA.validate(runs, lazy=True), {}
    except pa.errors.SchemaErrors as err:
        fails = describe_failures(err)
        if None in fails:  # a column-level problem: a bug here, not in a record
            raise RuntimeError(
                "runs table does not match its schema: " + "; ".join(fails[None])
            ) from err
        bad = {runs.at[i, "run_id"]: "row " + "; ".join(msgs) for i, msgs in fails.items()}
        good = runs[~runs["run_id"].isin(list(bad))]
        return RUNS_SCHEMA.validate(good), bad


def _run_config_fields(rid: str, table: dict | None) -> dict:
    """The status.csv configuration of a run: from the run table, else from its id."""
    if table is not None and rid in table:
        r = table[rid]
        fw = getattr(r, "framework", None) or FRAMEWORK_DEFAULT
        values = [r.partition, fw, r.backend, r.precision, r.compile]
        values += [r.nodes, r.workers, r.batch, r.lr_rule, r.repeat]
    else:
        try:
            p = parse_any_run_id(rid)
            keys = ("partition", "framework", "backend", "precision", "compile", "nodes")
            values = [p[k] for k in keys] + [p["workers"], p["batch"], p["lr_rule"], p["repeat"]]
        except ConfigError:
            values = [None, None, None, None, None, pd.NA, pd.NA, pd.NA, None, pd.NA]
    return dict(zip(STATUS_CONFIG_FIELDS, values))


def status_frame(status: dict[str, dict], table: dict | None) -> pd.DataFrame:
    """status.csv: every run of the run table (missing ones too), then any other run found."""
    rows = []
    ids = list(table) if table is not None else []
    ids += sorted(set(status) - set(ids))
    for rid in ids:
        st = status.get(rid) or {
            "run_id": rid,
            "in_config": True,
            "status": "missing",
            "exit_status": pd.NA,
            "detail": "no metrics.json or failure.json",
            "path": "",
        }
        rows.append({**st, **_run_config_fields(rid, table)})
    df = pd.DataFrame(rows, columns=STATUS_COLUMNS)
    for col in ("nodes", "workers", "batch_per_worker", "repeat", "exit_status"):
        df[col] = df[col].astype("Int64")
    df["in_config"] = df["in_config"].astype(bool)
    return df
