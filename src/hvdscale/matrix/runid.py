"""Run ids and allreduce-sweep ids: defined and parsed here, nowhere else.

A run id encodes a training run's place in the scaling matrix (partition, framework,
backend, nodes, workers, per-worker batch, LR rule, tuning candidate, kind, repeat);
``parse_run_id`` reads one id, ``parse_run_ids`` a column of them (the analysis tables).
The scaling-group keys (``GROUP_KEYS``: the runs that differ only in their workers and
repeat) live here too, because a run id names them.
"""

from __future__ import annotations

import re

from hvdscale.errors import ConfigError
from hvdscale.matrix import backends

#: training.precision and training.compile values (issue 32), the id's default first
PRECISIONS = ("fp32", "bf16", "fp16", "tf32")
COMPILE_MODES = ("off", "default", "max")


def step_setting_suffix(precision: str, compile_mode: str) -> str:
    """The run-id component of a step setting: '' for fp32/off, '_bf16', '_cmax', ..."""
    prec = "" if precision == PRECISIONS[0] else f"_{precision}"
    comp = "" if compile_mode == COMPILE_MODES[0] else f"_c{compile_mode}"
    return prec + comp


def step_setting_order(precision: str, compile_mode: str) -> tuple[int, int]:
    """Sort key of a step setting: the orders of PRECISIONS and COMPILE_MODES (fp32/off
    first), unknown names last."""
    return (
        PRECISIONS.index(precision) if precision in PRECISIONS else len(PRECISIONS),
        COMPILE_MODES.index(compile_mode) if compile_mode in COMPILE_MODES else len(COMPILE_MODES),
    )


# run_id: {partition}[_{framework}]_{backend}_n{nodes}_w{workers}_b{batch}_lr{rule}
#         [_{precision}][_c{compile}][_m{mult}_wu{warmup}][_{kind}]_r{repeat}
# The framework only when it is not the default horovod-tf (local_torch-ddp_gloo_...),
# so the ids of Horovod runs are those of the studies before issue 19.
# The step settings (issue 32) only where they are not fp32 and off (_bf16, _cmax,
# _fp16_cdefault), so the ids of the studies before them stay as they were.
# The optional _m{mult}_wu{warmup} component marks a candidate of the learning-rate
# re-tuning sweep (scaling.tune): LR multiplier (decimal point written as "p", e.g. 0p5)
# and warm-up epochs. The optional kind: cal (a target calibration run: 1 worker, the
# long budget of training.target.calibration, no stop at the target) or rerun (a re-run
# of the selected candidate of a tuning group with fresh seeds).
# The frameworks and backends come from the registry (hvdscale.matrix.backends):
# run_id_pattern() reads it now, RUN_ID_PATTERN is what it read at import.
def run_id_pattern() -> str:
    return (
        r"(?P<partition>[a-z][a-z0-9-]{0,31})"
        rf"(?:_(?P<framework>{backends.framework_alternation()}))?"
        rf"_(?P<backend>{backends.id_alternation()})_n(?P<nodes>[0-9]+)"
        r"_w(?P<workers>[0-9]+)_b(?P<batch>[0-9]+)_lr(?P<lr_rule>none|linear|sqrt)"
        rf"(?:_(?P<precision>{'|'.join(PRECISIONS[1:])}))?"
        rf"(?:_c(?P<compile>{'|'.join(COMPILE_MODES[1:])}))?"
        r"(?:_m(?P<lr_mult>[0-9]+(?:p[0-9]{1,2})?)_wu(?P<tune_warmup>[0-9]+))?"
        r"(?:_(?P<kind>cal|rerun))?_r(?P<repeat>[0-9]+)"
    )


RUN_ID_PATTERN = run_id_pattern()


# run ids of a kind (end of the id): target calibration runs, tuning re-runs
CAL_ID = r"_cal_r[0-9]+$"


RERUN_ID = r"_rerun_r[0-9]+$"


# the same without named groups (Snakemake wildcard constraints)
RUN_ID_WILDCARD = re.sub(r"\(\?P<\w+>", "(?:", RUN_ID_PATTERN)


def format_multiplier(m: float) -> str:
    """An LR multiplier as a run_id component: 0.5 -> '0p5', 2 -> '2', 1.25 -> '1p25'."""
    text = f"{round(float(m), 2):.2f}".rstrip("0").rstrip(".")
    return text.replace(".", "p")


def parse_run_id(run_id: str) -> dict:
    m = re.fullmatch(run_id_pattern(), run_id)
    if not m:
        raise ConfigError(
            f"run_id {run_id!r}: expected {{partition}}[_torch-ddp]_{{backend}}_n{{nodes}}"
            "_w{workers}_b{batch}_lr{none|linear|sqrt}[_bf16|_fp16|_tf32][_cdefault|_cmax]"
            "[_m{lr multiplier}_wu{warm-up}]"
            "[_cal|_rerun]_r{repeat}, e.g. local_gloo_n1_w2_b75_lrnone_r0, "
            "local_torch-ddp_gloo_n1_w2_b75_lrnone_r0, "
            "local_gloo_n1_w2_b75_lrlinear_m0p5_wu1_r0 or local_mpi_n1_w1_b75_lrnone_cal_r0"
        )
    d = m.groupdict()
    d["framework"] = d["framework"] or backends.DEFAULT_FRAMEWORK
    if backends.framework_problems(d["framework"], [d["backend"]]):
        raise ConfigError(
            f"run_id {run_id!r}: framework {d['framework']} has no backend {d['backend']!r} "
            f"(it has {', '.join(backends.names(d['framework']))})"
        )
    for k in ("nodes", "workers", "batch", "repeat"):
        d[k] = int(d[k])
    d["kind"] = d["kind"] or ""
    d["precision"] = d["precision"] or PRECISIONS[0]
    d["compile"] = d["compile"] or COMPILE_MODES[0]
    d["candidate"] = f"m{d['lr_mult']}_wu{d['tune_warmup']}" if d["lr_mult"] is not None else ""
    if d["lr_mult"] is not None:
        d["lr_mult"] = parse_multiplier(d["lr_mult"])
        d["tune_warmup"] = int(d["tune_warmup"])
    return d


def run_id_parts(run_id) -> dict:
    """``parse_run_id`` for tables: the components of a run id, or {} where the value is
    not one (no error; a table may hold ids of another study)."""
    try:
        return parse_run_id(str(run_id))
    except ConfigError:
        return {}


def run_kind(run_id) -> str:
    """'' (scaling run or tuning candidate), 'cal' or 'rerun'."""
    return run_id_parts(run_id).get("kind", "")


def run_candidate(run_id) -> str:
    """'m{mult}_wu{warm-up}' for a tuning candidate (or its re-run), else ''."""
    return run_id_parts(run_id).get("candidate", "")


def rerun_candidate_id(run_id) -> str:
    """The selection run (repeat 0) of the tuning candidate a re-run id repeats:
    ``..._m2_wu1_rerun_r3`` -> ``..._m2_wu1_r0``."""
    return re.sub(r"_rerun_r[0-9]+$", "_r0", str(run_id))


def config_id(run_id) -> str:
    """The run id without its repeat: the configuration the repeats share."""
    return re.sub(r"_r[0-9]+$", "", str(run_id))


# A scaling group: runs that differ only in the number of workers (and the repeat); the
# framework (issue 19) is a key too, so a speedup never mixes Horovod and DDP runs, and so
# are the step's precision and compile mode (issue 32): each setting against its own
# 1-worker runs, like against like.
GROUP_KEYS = [
    "partition",
    "framework",
    "backend",
    "precision",
    "compile",
    "batch_per_worker",
    "lr_rule",
]


CONFIG_KEYS = GROUP_KEYS + ["workers"]


# allreduce sweep id: {partition}_{backend}_n{nodes}_w{workers}; the backends from the
# registry (hvdscale.matrix.backends): allreduce_id_pattern() reads it now, the constants at import
def allreduce_id_pattern() -> str:
    return (
        r"(?P<partition>[a-z][a-z0-9-]{0,31})"
        rf"_(?P<backend>{backends.id_alternation()})_n(?P<nodes>[0-9]+)"
        r"_w(?P<workers>[0-9]+)"
    )


ALLREDUCE_ID_PATTERN = allreduce_id_pattern()


# the same without named groups (Snakemake wildcard constraints)
ALLREDUCE_ID_WILDCARD = re.sub(r"\(\?P<\w+>", "(?:", ALLREDUCE_ID_PATTERN)


def parse_multiplier(text: str) -> float:
    return float(text.replace("p", "."))
