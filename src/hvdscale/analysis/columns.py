"""The columns of the aggregation tables (runs.csv, epochs.csv, status.csv, summary.csv),
in their file order. One place: the aggregation writes them, the readers require them,
the tests and the report refer to them. New summary columns go into SUMMARY_COLUMNS."""

from __future__ import annotations

from hvdscale.matrix.backends import DEFAULT_FRAMEWORK
from hvdscale.matrix.runid import step_setting_order
from hvdscale.record.history import HISTORY_COLUMNS

#: the framework of a record without config.framework (records before issue 19)
FRAMEWORK_DEFAULT = DEFAULT_FRAMEWORK
#: how figures and the report name a framework (in full; short in table cells)
FRAMEWORK_LABELS = {FRAMEWORK_DEFAULT: "Horovod-TF", "torch-ddp": "PyTorch DDP"}
FRAMEWORK_SHORT = {FRAMEWORK_DEFAULT: "Horovod", "torch-ddp": "DDP"}


def framework_label(framework) -> str:
    """A framework as the report names it: 'Horovod-TF', 'PyTorch DDP' (else as given)."""
    return FRAMEWORK_LABELS.get(str(framework), str(framework))


def framework_short(framework) -> str:
    """A framework's short name for table cells: 'Horovod', 'DDP'."""
    return FRAMEWORK_SHORT.get(str(framework), framework_label(framework))


PHASES = ["data", "compute", "sync", "update"]
STATUSES = ["completed", "nan_loss", "failed", "missing", "malformed", "mislabelled"]
CSV_FLOAT_FORMAT = "%.10g"

# the train environment's versions as a run record states them
ENV_VERSIONS = ["python", "tensorflow", "horovod", "mpi", "numpy"]
# the fields of a run record's "config" object that runs.csv copies, in order
RECORD_CONFIG_FIELDS = [
    "partition",
    "framework",  # issue 19: config.framework, absent in older records = horovod-tf
    "backend",
    "nodes",
    "workers",
    "workers_per_node",
    "batch_per_worker",
    "global_batch",
    "lr_rule",
    "repeat",
    "learning_rate",
    "epochs",
    "warmup_epochs",
    "launcher",
    "controller",
    "compression",
    "model_bytes",
    "target_test_loss",
]
# timing.sync of a run record (issue 19) -> runs.csv columns (appended at the end)
SYNC_FIELDS = {
    "sync_allreduce_s": "allreduce_s",
    "sync_comm_hook_s": "comm_hook_s",
    "sync_exposed_s": "exposed_s",
    "sync_no_comm_step_s": "no_comm_step_s",
}
SYNC_COLUMNS = list(SYNC_FIELDS)
#: runs.csv columns of the start-up (issue 30 item 7: timing.startup_s and
#: target.launch_to_target_s of the record; appended at the end)
STARTUP_COLUMNS = ["startup_s", "launch_to_target_s"]
#: runs.csv's step settings (issue 32) and what a table written before them reads as
STEP_SETTING_COLUMNS = ["precision", "compile", "warm_up_s"]
STEP_SETTING_DEFAULTS = {"precision": "fp32", "compile": "off", "warm_up_s": float("nan")}
#: runs.csv's dynamic loss scale of fp16 runs (issue 32: the record's loss_scale.final and
#: .skipped_updates; NaN for other precisions, older records and tables written before them)
LOSS_SCALE_FIELDS = {"loss_scale_final": "final", "skipped_updates": "skipped_updates"}
LOSS_SCALE_COLUMNS = list(LOSS_SCALE_FIELDS)
STEP_SETTING_DEFAULTS.update(dict.fromkeys(LOSS_SCALE_COLUMNS, float("nan")))
RUNS_COLUMNS = [
    "run_id",
    *RECORD_CONFIG_FIELDS,
    "candidate",
    "lr_multiplier",
    "target_mode",
    "status",
    "exit_status",
    "error",
    "epochs_completed",
    "epochs_timed",
    "steps_per_epoch",
    "epoch_time_s",
    "throughput",
    "step_time_s",
    *(f"{ph}_step_s" for ph in PHASES),
    "other_step_s",
    *(f"{ph}_share" for ph in PHASES),
    "other_share",
    "utilisation",
    "utilisation_kind",
    "final_test_loss",
    "best_test_loss",
    "final_train_loss",
    "time_to_target_s",
    "reached_target",
    "target_epoch",
    "target_in_warmup",
    "train_time_s",
    "kind",
    "seed",
    "final_val_loss",
    "best_val_loss",
    "target_val_loss",
    "target_censored",
    "stop_reason",
    "epochs_to_target",
    "label_ok",
    "label_problems",
    "slurm_job_id",
    "hosts",
    "n_hosts",
    "devices",
    "cpu_model",
    "git_commit",
    "config_hash",
    "config_hash_match",
    *ENV_VERSIONS,
    "started_utc",
    "resumed",
    "attempts",
    "timing_method",
    "record",
    # issue 19: the record's timing.sync (per-step seconds; NaN where not measured)
    *SYNC_COLUMNS,
    # issue 30 item 7: start-up (launcher's start to the epoch loop) and start-up + time
    # to target; NaN without a start-up figure (older records), launch to target +inf
    # where the target was not reached
    *STARTUP_COLUMNS,
    # issue 32: the step's arithmetic and compilation (config.precision / compile; older
    # records: fp32, off) and the warm-up that compiled it (timing.warm_up_s; NaN where
    # absent)
    *STEP_SETTING_COLUMNS,
    # issue 32: fp16's loss scale at the end of the run and the updates it skipped
    *LOSS_SCALE_COLUMNS,
]
# the run record's per-epoch history (history.HISTORY_COLUMNS) without these
_NOT_IN_EPOCHS = {
    "time_other_s",
    "time_dispatch_s",
    "time_train_s",
    "time_eval_s",
    "learning_rate",
    "attempt",
}
EPOCH_COLUMNS = [
    "run_id",
    "framework",
    *(c for c in HISTORY_COLUMNS if c not in _NOT_IN_EPOCHS),
]
if "val_loss" not in EPOCH_COLUMNS:  # until the run record's history has it (issue 16)
    EPOCH_COLUMNS.insert(EPOCH_COLUMNS.index("test_loss"), "val_loss")
#: the record epochs' gradient-noise-scale sums (issue 30: the noise scale near the target
#: is estimated from epochs.csv; older epochs tables without them read as NaN)
NOISE_EPOCH_COLUMNS = ["noise_steps", "g_local_sq", "g_global_sq"]
EPOCH_COLUMNS += [c for c in NOISE_EPOCH_COLUMNS if c not in EPOCH_COLUMNS]
#: a classifier's validation accuracy per epoch: epochs.csv has the column only where a
#: record's epochs have it (a study on a loss, the default, writes the table as before)
METRIC_EPOCH_COLUMNS = ["val_accuracy"]
#: runs.csv's target metric (the record's target.metric: val_accuracy) and each run's
#: best value of it; only where a record's target names a metric other than the
#: validation loss (the default's tables are unchanged; without them: the validation loss)
METRIC_RUN_COLUMNS = ["target_metric", "best_target_value"]


def with_optional(columns: list[str], optional: list[str], rows: list[dict]) -> list[str]:
    """``columns`` and those of ``optional`` that any of ``rows`` has."""
    return columns + [c for c in optional if any(c in r for r in rows)]


# the configuration of a run as status.csv lists it
STATUS_CONFIG_FIELDS = [
    "partition",
    "framework",
    "backend",
    "precision",  # issue 32: the step setting, an axis of the matrix
    "compile",
    "nodes",
    "workers",
    "batch_per_worker",
    "lr_rule",
    "repeat",
]
STATUS_COLUMNS = [
    "run_id",
    *STATUS_CONFIG_FIELDS,
    "status",
    "in_config",
    "exit_status",
    "detail",
    "path",
]
# per-run statistics whose median over completed repeats the summary shows
SUMMARY_MEDIANS = [
    "steps_per_epoch",
    "step_time_s",
    *(f"{ph}_step_s" for ph in PHASES),
    "other_step_s",
    *(f"{ph}_share" for ph in PHASES),
    "utilisation",
    "best_test_loss",
]
SUMMARY_COLUMNS = [
    "partition",
    "framework",
    "backend",
    "precision",  # issue 32: each step setting against its own 1-worker runs
    "compile",
    "batch_per_worker",
    "lr_rule",
    "workers",
    "nodes",
    "global_batch",
    "n_expected",
    *(f"n_{s}" for s in STATUSES),
    "epoch_time_s",
    "epoch_time_min_s",
    "epoch_time_max_s",
    "throughput",
    "throughput_min",
    "throughput_max",
    "steps_per_epoch",
    "step_time_s",
    *(f"{ph}_step_s" for ph in PHASES),
    "other_step_s",
    *(f"{ph}_share" for ph in PHASES),
    "utilisation",
    "final_test_loss",
    "final_test_loss_min",
    "final_test_loss_max",
    "best_test_loss",
    "time_to_target_s",
    "time_to_target_min_s",
    "time_to_target_max_s",
    "target_test_loss",
    "n_reached_target",
    "n_target_in_warmup",
    "target_too_loose",
    "has_baseline",
    "baseline_status",
    "baseline_epoch_time_s",
    "baseline_time_to_target_s",
    "speedup",
    "speedup_min",
    "speedup_max",
    "efficiency",
    "speedup_ttt",
    "efficiency_ttt",
    "speedup_per_gpu",
    "speedup_fit_intercept",
    "speedup_per_gpu_ttt",
    "fit_points",
    "n_repeats",
    "speedup_lo",
    "speedup_hi",
    "efficiency_lo",
    "efficiency_hi",
    "speedup_ttt_lo",
    "speedup_ttt_hi",
    "ci_note",
    # issue 16: censoring, the two factors of the TTT speedup, validation losses
    "n_ttt_total",
    "ttt_note",
    "epochs_to_target",
    "baseline_epochs_to_target",
    "epochs_ratio",
    "target_val_loss",
    "best_val_loss",
    "final_val_loss",
]
# read as text, whatever the values look like
STRING_COLUMNS = [
    "run_id",
    "partition",
    "framework",
    "backend",
    "lr_rule",
    "status",
    "error",
    "detail",
    "path",
    "launcher",
    "controller",
    "compression",
    "slurm_job_id",
    "hosts",
    "devices",
    "cpu_model",
    "git_commit",
    "config_hash",
    *ENV_VERSIONS,
    "started_utc",
    "record",
    "utilisation_kind",
    "baseline_status",
    "timing_method",
    "candidate",
    "target_mode",
    "ci_note",
    "ttt_note",
    "kind",
    "stop_reason",
    "label_problems",
    "note",
    "ci_method",
]

#: headline.csv (hvdscale aggregate --out-headline; analysis.headline, report.headline_text)
HEADLINE_COLUMNS = [
    "partition",
    "framework",
    "backend",
    "precision",  # the step setting: each against its own 1-worker runs (analysis/like.py)
    "compile",
    "batch_per_worker",
    "workers",
    "tuned",
    "speedup_ttt",
    "speedup_ttt_lo",
    "speedup_ttt_hi",
    "reached",
    "total",
    "base_reached",
    "base_total",
    "diverged",  # of the runs not reached, those whose loss diverged (non-finite)
    "base_diverged",
    "epoch_speedup",
    "epoch_lo",
    "epoch_hi",
    "epochs_ratio",
    "fixed_factor",
    "retained_fraction",
    "b_simple",
    "b_simple_lo",  # issue 30: its 95 % bootstrap interval over runs (analysis/noise_scale)
    "b_simple_hi",
    "critical_batch",
    "predicted_epochs_ratio",
    "global_batch",
    "note",
    "ci_method",
    # issue 30: against the fastest 1-worker configuration to the target
    "best1_baseline",
    "speedup_ttt_best1",
    "speedup_ttt_best1_lo",
    "speedup_ttt_best1_hi",
    # issue 30 item 7: the time-to-target speedup with the start-up counted (launch to target)
    "speedup_launch_ttt",
    "speedup_launch_ttt_lo",
    "speedup_launch_ttt_hi",
]
#: headline.csv columns added after the table first shipped: an older file reads with
#: them empty (NaN, '' for text) instead of failing (analysis.tables.read_headline)
HEADLINE_LATER = {
    "precision": "fp32",  # written before the step settings were a key: fp32, eager
    "compile": "off",
    "diverged": 0,  # written before the reasons were counted: none said diverged
    "base_diverged": 0,
    "b_simple_lo": float("nan"),  # issue 30: the noise-scale interval
    "b_simple_hi": float("nan"),
    "best1_baseline": "",
    "speedup_ttt_best1": float("nan"),
    "speedup_ttt_best1_lo": float("nan"),
    "speedup_ttt_best1_hi": float("nan"),
    "speedup_launch_ttt": float("nan"),  # issue 30 item 7: launch to target
    "speedup_launch_ttt_lo": float("nan"),
    "speedup_launch_ttt_hi": float("nan"),
}


#: how a run may end for a reason of training (issue 30): every time-to-target statistic
#: counts these runs; a diverged run (nan_loss) that never reached the target is censored
#: like one that ran out of budget. Failed, missing, malformed and mislabelled runs are
#: infrastructure: excluded from the statistics, and listed.
TRAINING_ENDS = ("completed", "nan_loss")
#: the per-run columns a diverged run contributes nothing to (its epochs ended in NaN):
#: epoch-time statistics stay over completed runs
_DIVERGED_UNTIMED = ("epoch_time_s", "throughput", "step_time_s")


def ttt_runs(runs):
    """The runs of the time-to-target statistics: completed and diverged (``TRAINING_ENDS``).
    A diverged run that did not reach the target has time and epochs to target +inf (not
    reached, censored); its epoch-time columns are NaN, so medians of epoch time stay over
    the completed runs."""
    import math

    if runs is None or runs.empty or "status" not in runs:
        return runs
    out = runs[runs["status"].isin(TRAINING_ENDS)].copy()
    div = out["status"] == "nan_loss"
    if div.any():
        reached = out["reached_target"].astype(bool) if "reached_target" in out else False
        lost = div & ~reached
        for c in ("time_to_target_s", "epochs_to_target"):
            if c in out:
                out.loc[lost, c] = math.inf
        if "reached_target" in out:
            out.loc[lost, "reached_target"] = False
        for c in _DIVERGED_UNTIMED:
            if c in out:
                out.loc[div, c] = math.nan
    return out


def with_framework(df):
    """``df`` with a framework column (the default where a frame built before issue 19,
    or by hand, lacks one or leaves it empty), and with the other scaling-group keys of
    later issues (with_step_setting), so code that groups by GROUP_KEYS reads old tables."""
    if df is None:
        return df
    if "framework" not in df:
        df = df.assign(framework=FRAMEWORK_DEFAULT)
    elif df["framework"].isna().any():
        df = df.assign(framework=df["framework"].fillna(FRAMEWORK_DEFAULT))
    return with_step_setting(df)


def with_step_setting(df):
    """``df`` with precision and compile columns (issue 32: scaling-group keys); fp32 and
    off where a frame built before them, or by hand, lacks them or leaves them empty."""
    if df is None:
        return df
    fill = {k: STEP_SETTING_DEFAULTS[k] for k in ("precision", "compile")}
    missing = {k: v for k, v in fill.items() if k not in df}
    if missing:
        df = df.assign(**missing)
    if any(df[k].isna().any() for k in fill):
        df = df.assign(**{k: df[k].fillna(v) for k, v in fill.items()})
    return df


def step_settings_of(df) -> list[tuple[str, str]]:
    """The (precision, compile) pairs of ``df``'s rows, in the run ids' order (fp32/off
    first, matrix.runid.step_setting_order; unknown names last, then by name)."""
    pairs = set(zip(df["precision"], df["compile"], strict=True))
    return sorted(pairs, key=lambda x: (*step_setting_order(*x), *x))


def reference_framework(df):
    """The rows of the default framework (Horovod-TF, the reference study's): the
    comparisons with the reference study use those only."""
    df = with_framework(df)
    if df is None:
        return df
    return df[df["framework"].fillna(FRAMEWORK_DEFAULT) == FRAMEWORK_DEFAULT]


def names_framework(frameworks) -> bool:
    """Whether figures and tables name the framework: where there is more than one, or
    the only one is not the default (a Horovod-TF study looks as before issue 19)."""
    names = {FRAMEWORK_DEFAULT if f is None or f != f else str(f) for f in frameworks}
    return len(names) > 1 or names - {FRAMEWORK_DEFAULT} != set()


TARGET_COLUMNS = [
    "target_val_loss",
    "target_mode",
    "time_to_target_s",
    "reached_target",
    "target_epoch",
    "target_in_warmup",
    "target_censored",
    "epochs_to_target",
]
