"""pandera schemas of the analysis tables (runs.csv, summary.csv)
and of the allreduce sweep input (results/allreduce/*.csv).

The run records are validated against ``workflow/schemas/run.schema.json`` first (one
record at a time); these schemas then check the derived rows of all records at once
(one ``validate`` call on the combined frame), so a record that is valid JSON-Schema-wise
but inconsistent (run_id against its config, global batch, shares) is still caught and
reported by path and field.
"""

from __future__ import annotations

import pandas as pd
import pandera.pandas as pa
from pandera.pandas import Check, Column

from hvdscale.errors import ConfigError
from hvdscale.matrix import backends
from hvdscale.matrix.runid import COMPILE_MODES, CONFIG_KEYS, PRECISIONS, parse_run_id

BACKENDS = backends.names()  # the registry's (hvdscale.matrix.backends) at import
LR_RULES = ["none", "linear", "sqrt"]
RECORD_STATUSES = ["completed", "nan_loss", "failed", "mislabelled"]
SHARE_TOL = 1e-6


def _num(check=None, nullable=True, **kw):
    checks = [check] if check is not None else []
    return Column(float, checks, nullable=nullable, coerce=True, **kw)


def _int(minimum=None, nullable=False):
    checks = [Check.ge(minimum)] if minimum is not None else []
    return Column("Int64" if nullable else int, checks, nullable=nullable, coerce=True)


def parse_any_run_id(run_id: str) -> dict:
    """``parse_run_id`` with the run's framework in ``framework``: the id carries it after
    the partition only when it is not the default (``{partition}_torch-ddp_gloo_n1...``,
    issue 19). Tolerates a run-id pattern that does not know the token yet (the token is
    then taken off and the rest parsed); raises ConfigError like parse_run_id."""
    try:
        p = dict(parse_run_id(run_id))
    except ConfigError:
        head, _, rest = run_id.partition("_")
        token, sep, tail = rest.partition("_")
        if not sep or token in backends.names() or token == backends.DEFAULT_FRAMEWORK:
            raise
        if not token[:1].isalpha() or not token.replace("-", "").isalnum():
            raise
        p = dict(parse_run_id(f"{head}_{tail}"))
        p["framework"] = token
    p["framework"] = p.get("framework") or backends.DEFAULT_FRAMEWORK
    return p


def _parses(run_id) -> bool:
    try:
        parse_any_run_id(str(run_id))
        return True
    except ConfigError:
        return False


def _run_id_consistent(df: pd.DataFrame) -> pd.Series:
    """run_id encodes partition, framework, backend, step setting (precision and compile
    mode), nodes, workers, batch, LR rule and repeat."""
    ok = []
    for rid, part, fw, be, prec, comp, nodes, w, b, lr, rep in zip(
        df["run_id"],
        df["partition"],
        df["framework"],
        df["backend"],
        df["precision"],
        df["compile"],
        df["nodes"],
        df["workers"],
        df["batch_per_worker"],
        df["lr_rule"],
        df["repeat"],
    ):
        try:
            p = parse_any_run_id(rid)
        except Exception:
            ok.append(False)
            continue
        ok.append(
            (
                p["partition"],
                p["framework"],
                p["backend"],
                p["precision"],
                p["compile"],
                p["nodes"],
                p["workers"],
                p["batch"],
                p["lr_rule"],
                p["repeat"],
            )
            == (part, fw, be, prec, comp, nodes, w, b, lr, rep)
        )
    return pd.Series(ok, index=df.index)


def _completed_has_timing(df: pd.DataFrame) -> pd.Series:
    return (df["status"] != "completed") | (df["epoch_time_s"].notna() & df["throughput"].notna())


def _shares_sum(df: pd.DataFrame) -> pd.Series:
    s = df[["data_share", "compute_share", "sync_share", "update_share"]].sum(axis=1, min_count=1)
    return s.isna() | ((s - 1.0).abs() <= 1e-6)


# columns the runs and summary tables share, with the same checks
_CONFIG_COLUMNS = {
    "partition": Column(str),
    "framework": Column(str),
    "backend": Column(str, Check.isin(BACKENDS)),
    "precision": Column(str, Check.isin(PRECISIONS)),
    "compile": Column(str, Check.isin(COMPILE_MODES)),
    "batch_per_worker": _int(1),
    "lr_rule": Column(str, Check.isin(LR_RULES)),
    "workers": _int(1),
}
_SHARE = Check.in_range(0, 1 + SHARE_TOL)
_TIMES_AND_LOSS = {
    "epoch_time_s": _num(Check.gt(0)),
    "throughput": _num(Check.gt(0)),
    "data_share": _num(_SHARE),
    "sync_share": _num(_SHARE),
    "final_test_loss": _num(Check.ge(0)),
}

RUNS_SCHEMA = pa.DataFrameSchema(
    {
        "run_id": Column(str, Check(lambda s: s.map(_parses), name="a run id")),
        "candidate": Column(str, nullable=True, required=False),
        **_CONFIG_COLUMNS,
        **_TIMES_AND_LOSS,
        "nodes": _int(1),
        "workers_per_node": _int(1),
        "global_batch": _int(1),
        "repeat": _int(0),
        "learning_rate": _num(Check.gt(0), nullable=False),
        "status": Column(str, Check.isin(RECORD_STATUSES)),
        "exit_status": _int(),
        "epochs_completed": _int(0),
        "epochs_timed": _int(0),
        "steps_per_epoch": _num(Check.gt(0)),
        "step_time_s": _num(Check.gt(0)),
        "data_step_s": _num(Check.ge(0)),
        "compute_step_s": _num(Check.ge(0)),
        "sync_step_s": _num(Check.ge(0)),
        "update_step_s": _num(Check.ge(0)),
        "other_step_s": _num(),
        "compute_share": _num(_SHARE),
        "update_share": _num(_SHARE),
        "other_share": _num(),
        "utilisation": _num(Check.in_range(0, 100 * 64)),  # percent; summed over devices allowed
        "best_test_loss": _num(Check.ge(0)),
        "final_train_loss": _num(Check.ge(0)),
        "time_to_target_s": _num(Check.ge(0)),
        "train_time_s": _num(Check.ge(0)),
        # issue 30 item 7: NaN without a start-up figure, +inf where not reached
        "startup_s": _num(Check.ge(0)),
        "launch_to_target_s": _num(Check.ge(0)),
        "model_bytes": _int(1),
    },
    checks=[
        Check(
            lambda df: df["global_batch"] == df["workers"] * df["batch_per_worker"],
            name="global_batch equals workers x batch_per_worker",
        ),
        Check(lambda df: df["nodes"] <= df["workers"], name="nodes not above workers"),
        Check(_run_id_consistent, name="run_id matches the record's config"),
        Check(_completed_has_timing, name="completed run has timed (non-warm-up) epochs"),
        Check(_shares_sum, name="phase shares sum to 1"),
        Check(
            lambda df: (
                df["best_test_loss"].isna()
                | df["final_test_loss"].isna()
                | (df["best_test_loss"] <= df["final_test_loss"] + 1e-12)
            ),
            name="best test loss <= final test loss",
        ),
    ],
    strict=False,
    name="runs",
)

SUMMARY_SCHEMA = pa.DataFrameSchema(
    {
        **_CONFIG_COLUMNS,
        **_TIMES_AND_LOSS,
        "n_completed": _int(0),
        "speedup": _num(Check.gt(0)),
        "efficiency": _num(Check.gt(0)),
        "speedup_ttt": _num(Check.gt(0)),
        "has_baseline": Column(bool, coerce=True),
        "baseline_status": Column(str, Check.isin(["ok", "missing", "failed", "not_in_sweep"])),
        "speedup_per_gpu": _num(),
        "target_test_loss": _num(Check.gt(0)),
        "n_target_in_warmup": _int(0),
        "target_too_loose": Column(bool, coerce=True),
        "n_repeats": _int(0),
        "speedup_lo": _num(Check.gt(0)),
        "speedup_hi": _num(Check.gt(0)),
        "efficiency_lo": _num(Check.gt(0)),
        "efficiency_hi": _num(Check.gt(0)),
        "speedup_ttt_lo": _num(Check.ge(0)),  # 0: replicates with censored medians
        "speedup_ttt_hi": _num(Check.gt(0)),
        "ci_note": Column(str, nullable=True),
    },
    checks=[
        Check(lambda df: ~df.duplicated(CONFIG_KEYS), name="one row per configuration"),
        Check(
            lambda df: (
                (df["speedup_lo"].isna() & df["speedup_hi"].isna())
                | (df["speedup_lo"] <= df["speedup_hi"])
            ),
            name="speedup interval lo <= hi (or no interval)",
        ),
        Check(
            lambda df: df["speedup_lo"].isna() | (df["n_repeats"] >= 3),
            name="an interval needs at least 3 completed repeats",
        ),
        Check(
            lambda df: df["speedup_lo"].notna() | (df["ci_note"].fillna("") != ""),
            name="no interval: ci_note says why",
        ),
        Check(
            lambda df: ~df["target_too_loose"].astype(bool) | df["speedup_ttt"].isna(),
            name="no time-to-target speedup where the target is too loose",
        ),
    ],
    strict=False,
    name="summary",
)

ALLREDUCE_COLUMNS = ["partition", "backend", "workers", "nodes", "bytes", "time_s"]  # required
# the names hvdscale measure-allreduce writes -> the names used here
ALLREDUCE_ALIASES = {"p10": "p10_s", "p90": "p90_s", "algbw": "algbw_Bps", "busbw": "busbw_Bps"}

ALLREDUCE_SCHEMA = pa.DataFrameSchema(
    {
        "partition": Column(str),
        "backend": Column(str, Check.isin(BACKENDS)),
        "workers": _int(1),
        "nodes": _int(1),
        "bytes": _num(Check.gt(0), nullable=False),
        "time_s": _num(Check.gt(0), nullable=False),
        "p10_s": _num(Check.ge(0), required=False),
        "p90_s": _num(Check.ge(0), required=False),
        "algbw_Bps": _num(required=False),
        "busbw_Bps": _num(required=False),
    },
    strict=False,
    name="allreduce",
)


def describe_failures(err: pa.errors.SchemaErrors) -> dict:
    """Map row index -> list of 'field: problem' strings from a lazy validation error.

    Failures without a row index (a missing column, a wrong dtype) are returned under
    the key None.
    """
    fc = err.failure_cases
    out: dict = {}
    seen = set()
    for row in fc.itertuples(index=False):
        idx = row.index
        key = None if idx is None or (isinstance(idx, float) and idx != idx) else int(idx)
        if row.schema_context == "DataFrameSchema" and row.check not in ("column_in_dataframe",):
            field = f"check '{row.check}'"
            if (key, field) in seen:
                continue
            seen.add((key, field))
            msg = f"{field} failed"
        else:
            msg = f"{row.column}: failed {row.check} (value {row.failure_case!r})"
        out.setdefault(key, []).append(msg)
    return out
