"""Runs outside the plain scaling matrix: the tuning re-runs and the target's config slice.

The re-runs of the selected tuning candidates (kind rerun, run ids ``..._rerun_r{k}``)
depend on the selection (checkpoint select_tuned -> tuned.csv), so they are not in
``run_table``; ``rerun_runs`` builds them from the selected candidates. ``target_config``
cuts out the part of the config the study's target depends on (rule calibrate_target).
Re-exported by ``hvdscale.config.load``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable

from hvdscale.errors import ConfigError
from hvdscale.matrix.backends import DEFAULT_FRAMEWORK
from hvdscale.matrix.runid import COMPILE_MODES, PRECISIONS, format_multiplier, parse_run_id
from hvdscale.matrix.runtable import Run, run_sort_key, tune_runs


def rerun_runs(cfg: dict, tuned_rows: Iterable) -> list[Run]:
    """The re-runs of the selected tuning candidates (kind rerun).

    ``tuned_rows``: the selected candidates, each a run id, a Run, or a mapping with a
    ``run_id`` or with the candidate's fields (partition, backend, workers,
    batch or batch_per_worker, lr_rule, and candidate or lr_mult and tune_warmup), e.g.
    a row of tuned.csv. Every one re-runs
    scaling.tune.rerun_repeats times with the same layout, LR rule, multiplier and
    warm-up, with fresh seeds (repeats 0..rerun_repeats-1 of kind rerun).
    """
    tune = cfg["scaling"].get("tune")
    if not tune:
        return []
    known = {_candidate_key(r): r for r in tune_runs(cfg)}
    out: dict[str, Run] = {}
    for row in tuned_rows:
        key = _candidate_key(row)
        if key not in known:
            raise ConfigError(
                f"selected tuning candidate {key}: not a candidate of scaling.tune of this config"
            )
        base = known[key]
        for r in range(tune["rerun_repeats"]):
            run = dataclasses.replace(base, repeat=r, kind="rerun")
            out[run.run_id] = run
    return [out[k] for k in sorted(out, key=run_sort_key(out))]


def _candidate_key(row) -> tuple:
    """(partition, backend, workers, batch, lr_rule, candidate, framework, precision,
    compile) of a selected candidate (a row without a framework: horovod-tf; without a
    precision or compile mode: fp32, off)."""
    if isinstance(row, Run):
        return (
            row.partition,
            row.backend,
            row.workers,
            row.batch,
            row.lr_rule,
            row.candidate,
            row.framework,
            row.precision,
            row.compile,
        )
    if isinstance(row, str) or (hasattr(row, "get") and row.get("run_id")):
        rid = row if isinstance(row, str) else str(row.get("run_id"))
        d = parse_run_id(rid)
        return (
            d["partition"],
            d["backend"],
            d["workers"],
            d["batch"],
            d["lr_rule"],
            d["candidate"],
            d["framework"],
            d["precision"],
            d["compile"],
        )
    batch = row.get("batch", row.get("batch_per_worker"))
    cand = row.get("candidate")
    if not cand:
        cand = f"m{format_multiplier(float(row['lr_mult']))}_wu{int(row['tune_warmup'])}"
    return (
        str(row["partition"]),
        str(row["backend"]),
        int(row["workers"]),
        int(batch),
        str(row["lr_rule"]),
        cand,
        str(row.get("framework") or DEFAULT_FRAMEWORK),
        str(_given(row.get("precision")) or PRECISIONS[0]),
        str(_given(row.get("compile")) or COMPILE_MODES[0]),
    )


def _given(value):
    """A table cell's value, None for an empty or NaN cell."""
    if value is None or value != value or value == "":
        return None
    return value


def _step_defaults(cfg: dict) -> dict:
    t = cfg["training"]
    out = {}
    if (t.get("precision") or PRECISIONS[0]) != PRECISIONS[0]:
        out["precision"] = t["precision"]
    if (t.get("compile") or COMPILE_MODES[0]) != COMPILE_MODES[0]:
        out["compile"] = t["compile"]
    return out


def target_config(cfg: dict) -> dict:
    """The part of the config the study's target depends on (rule calibrate_target).

    A valid config: absolute mode, only the mode and the loss; calibrated mode, the
    percent, the calibration block, the seed and the calibration partition (its GPU
    count only) with a one-point sweep at the calibration configuration, so that its
    calibration_runs have the full config's run ids. Editing anything else leaves
    target.json, and so every trained run, untouched.
    """
    tgt = cfg["training"]["target"]
    # another workload than stress-strain: its metric decides what the target means
    wl = (
        {"workload": cfg["workload"]}
        if cfg.get("workload", "stress-strain") != "stress-strain"
        else {}
    )
    if tgt["mode"] != "calibrated":
        return {**wl, "training": {"target": {"mode": tgt["mode"], "value": tgt["value"]}}}
    cal = copy.deepcopy(tgt["calibration"])
    if cal.get("framework") == DEFAULT_FRAMEWORK:
        del cal["framework"]  # as before issue 19: target.json of Horovod studies unchanged
    part = cal["partition"]
    return {
        **wl,
        "seed": cfg["seed"],
        "training": {
            "target": {"mode": "calibrated", "value": tgt["value"], "calibration": cal},
            "warmup_epochs": cfg["training"]["warmup_epochs"],
            # the calibration runs' step setting (training.precision / compile): only
            # where it is not fp32 / off, so target.json of earlier studies stays as it was
            **_step_defaults(cfg),
        },
        "scaling": {
            # only what names the calibration runs (1 worker: always 1 node): editing a
            # partition's runtime or memory must not rewrite target.json (every run
            # depends on its time stamp)
            "partitions": {
                part: {
                    "gpus_per_node": cfg["scaling"]["partitions"][part]["gpus_per_node"],
                    "cores_per_node": 1,
                    "mem_mb_per_node": 1,
                }
            },
            "sweeps": [
                {
                    "name": "calibration",
                    "partitions": [part],
                    "workers": [1],
                    "backends": [cal["backend"]],
                    "batch_sizes": [cal["batch"]],
                    "lr_rules": [cal["lr_rule"]],
                    **({"frameworks": [cal["framework"]]} if "framework" in cal else {}),
                }
            ],
        },
    }
