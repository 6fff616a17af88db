"""The run record: ``metrics.json`` (validated against workflow/schemas/run.schema.json
before it is written, atomically), ``history.csv`` (one row per epoch) beside it, and
``failure.json`` for runs that ended without a record.

No TensorFlow or Horovod here: the workflow env imports this module too (tests,
aggregation), and the launcher writes failure.json with it.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path

from hvdscale import native
from hvdscale.config.load import RUN_SCHEMA
from hvdscale.io import write_json_atomic, write_text_atomic
from hvdscale.record.environment import horovod_env
from hvdscale.record.history import history_csv
from hvdscale.record.run_summary import summarise, target_block
from hvdscale.record.startup import launch_to_target, total_startup
from hvdscale.record.timing import TIMING_METHODS, instrumentation_block, sync_block
from hvdscale.slurm.site import nccl_env_now
from hvdscale.slurm.threads import threads_for_rank
from hvdscale.workload.base import VAL_LOSS, is_default, workload_for, workload_name

SCHEMA_VERSION = 1

# Exit status of a training run whose loss became NaN/inf (a result, not a crash).
EXIT_NAN = 3


class RecordError(ValueError):
    """The record does not satisfy the run schema (a bug in the producer)."""


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def finite_or_none(x):
    """JSON has no NaN/inf: non-finite numbers become null."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


# --------------------------------------------------------------------------- environment


def system_block(nodes: list[str]) -> dict:
    """The record's optional ``system`` (hvdscale.record.system.collect_system with the
    run's hosts as node names), checked against the run schema here so that writing the
    record cannot fail on it. Never raises: what failed is in ``errors``."""
    try:
        from hvdscale.record.system import (
            collect_system,  # inside the try: the record never fails on it
        )

        system = collect_system(nodes=nodes)
        from jsonschema import Draft202012Validator

        sub = load_run_schema()["properties"]["system"]
        problems = [
            f"{'.'.join(map(str, e.absolute_path)) or '(top level)'}: {e.message}"
            for e in Draft202012Validator(sub).iter_errors(system)
        ]
        if problems:
            return {
                "nodes": sorted(set(map(str, nodes))),
                "errors": {"schema": "; ".join(problems)[:500]},
            }
        return system
    except Exception as exc:  # a description must never cost the run its record
        return {"errors": {"collect_system": f"{type(exc).__name__}: {exc}"[:500]}}


# --------------------------------------------------------------------------- the record


# launcher book-keeping that says nothing about the configuration
def epoch_entry(
    *,
    epoch: int,
    warmup: bool,
    wall_s: float,
    steps: int,
    samples: int,
    throughput: float,
    timing: dict,
    train_loss: float,
    test_loss: float | None,
    elapsed_s: float,
    utilisation_mean: float | None,
    learning_rate: float,
    attempt: int,
    val_loss: float | None = None,
    extra: dict | None = None,
) -> dict:
    """One element of the record's ``epochs`` (and a row of history.csv); ``timing`` is
    hvdscale.record.timing.EpochTimer.record_fields(); ``extra``: further optional fields
    (instrumentation, noise scale, wall_measured_s)."""
    return {
        "epoch": epoch,
        "warmup": warmup,
        "wall_s": round(wall_s, 6),
        "steps": steps,
        "samples": samples,
        "throughput": round(throughput, 3),
        **timing,
        "train_loss": finite_or_none(train_loss),
        "val_loss": finite_or_none(val_loss),
        "test_loss": finite_or_none(test_loss),
        "elapsed_s": round(elapsed_s, 6),
        "utilisation_mean": utilisation_mean,
        "learning_rate": learning_rate,
        "attempt": attempt,
        **(extra or {}),
    }


def emulated_gpus(cfg: dict, partition: str) -> bool:
    """Whether ``partition`` declares its GPUs emulated in ``cfg``
    (``scaling.partitions.<name>.emulated_gpus``; false when the config does not say)."""
    parts = (cfg.get("scaling") or {}).get("partitions") or {}
    return bool((parts.get(partition) or {}).get("emulated_gpus", False))


def _record_config(run, cfg, workers, controller, launcher, lr_base, lr, seed, kind) -> dict:
    """The run's configuration as the record states it (first part; build_record adds the
    model, Horovod and step settings)."""
    tcfg = cfg["training"]
    return {
        # another workload than stress-strain (records of stress-strain runs stay as they were)
        **({} if is_default(cfg) else {"workload": workload_name(cfg)}),
        "framework": getattr(run, "framework", "horovod-tf"),  # issue 19 (Run.framework)
        "partition": run.partition,
        # the partition's GPUs and whether they are emulated (a test cluster's GPUs, the
        # ranks train on the CPU): the label proof checks every rank's device against them
        "gpus_per_node": getattr(run, "gpus_per_node", None),
        "emulated_gpus": emulated_gpus(cfg, run.partition),
        "backend": run.backend,
        "nodes": run.nodes,
        "workers": workers,
        "workers_per_node": run.workers_per_node,
        "batch_per_worker": run.batch,
        "global_batch": run.batch * workers,
        "lr_rule": run.lr_rule,
        "learning_rate_base": lr_base,
        "learning_rate": lr,
        "lr_warmup": tcfg["lr_warmup"],
        "epochs": tcfg["max_epochs"],  # the budget, as before issue 16 (analysis reads it)
        "max_epochs": tcfg["max_epochs"],
        "max_train_s": tcfg["max_train_s"],
        "stop_at_target": tcfg["stop_at_target"],
        "warmup_epochs": tcfg["warmup_epochs"],
        # the threads the rank used (auto resolved in the rank's environment: an integer)
        "threads_per_worker": threads_for_rank(tcfg["threads_per_worker"], os.environ),
        "launcher": launcher,
        "cpu_binding": tcfg.get("cpu_binding", "auto"),
        "controller": controller,
        "repeat": run.repeat,
        "seed": cfg["seed"] if seed is None else int(seed),  # the run's derived seed
        "seed_base": cfg["seed"],
        "kind": kind,
        "data_in_device_memory": tcfg["data_in_device_memory"],
        "precision": tcfg.get("precision", "fp32"),  # issue 32
        "compile": tcfg.get("compile", "off"),
        # training.mkl_code_path as the rank ran (its MKL library mapped: intel); torch-ddp
        # only, null for Horovod-TF (which ignores it)
        "mkl_code_path": (
            native.mkl_code_path() if getattr(run, "framework", "") == "torch-ddp" else None
        ),
        "target_test_loss": tcfg.get("target_test_loss"),
        "timeline_steps": tcfg["timeline_steps"],
    }


def _step_config(cfg: dict, model_parameters: int, samples_per_epoch: int) -> dict:
    """The record config's model, Horovod and step settings."""
    tcfg = cfg["training"]
    return dict(
        model_parameters=model_parameters,
        model_bytes=model_bytes(model_parameters),
        horovod_env=horovod_env(),
        nccl_env=nccl_env_now(),  # NCCL_* the ranks ran with (training.nccl)
        gloo_epoll_yield=native.loaded(),  # hvdscale.native's library in this rank
        steps_per_execution=tcfg["steps_per_execution"],
        backward_passes_per_step=tcfg["horovod"]["backward_passes_per_step"],
        compression=tcfg["horovod"]["compression"],
        instrument_every=tcfg["instrument_every"],
        shard_policy=tcfg["shard_policy"],
        hidden_units=cfg["model"]["hidden_units"],
        activation=cfg["model"]["activation"],
        samples_per_epoch=samples_per_epoch,
    )


def _outcome_blocks(epochs, workers, tcfg, target, stop_reason, framework,
                    metric=VAL_LOSS) -> dict:  # fmt: skip
    """The record's ``target`` and ``timing`` blocks."""
    tv = (target or {}).get("value")
    mode = (target or {}).get("mode", "none")
    inst = instrumentation_block(epochs, tcfg["instrument_every"])
    sync = sync_block(epochs, workers, framework, inst["uninstrumented_step_s"])
    return {
        "target": target_block(
            epochs, tv, mode, stop_reason, tcfg["max_epochs"], tcfg["max_train_s"], metric
        ),
        "timing": {"instrumentation": inst, "sync": sync},
    }


def build_record(
    *,
    run,
    cfg: dict,
    workers: int,
    controller: str,
    launcher: str,
    status: str,
    error: str | None,
    learning_rate_base: float,
    learning_rate: float,
    model_parameters: int,
    steps_per_epoch: int,
    environment: dict | None,
    attempts: list[dict],
    epochs: list[dict],
    utilisation: dict,
    timeline: str | None,
    timeline_check: dict | None,
    data: dict,
    system: dict | None = None,
    seed: int | None = None,
    kind: str = "",
    target: dict | None = None,
    stop_reason: str | None = None,
    initial_weights_sha256: str | None = None,
    framework: str = "horovod-tf",
    loss_scale: dict | None = None,
) -> dict:
    """The run record (metrics.json) of a training run, as run.schema.json describes it.

    ``run``: the config's scaling-matrix row (hvdscale.matrix.runtable.find_run); ``cfg``: the full
    validated config; ``utilisation``: kind, interval_s and samples; ``system``:
    system_block() of rank 0, recorded only when given (optional field);
    ``seed``: the run's derived seed (hvdscale.matrix.runtable.run_seed; the config's seed when
    None); ``kind``: '' | 'cal' | 'rerun'; ``target``: {"value", "mode"} of the
    validation-loss target (None: no target, the budget is trained); ``stop_reason``: why
    the loop ended (hvdscale.trainer.loop.STOP_REASONS); ``framework``: the trainer's
    framework, which decides how ``timing.sync`` reads the epochs
    (hvdscale.record.timing.sync_block); ``loss_scale``: the step program's
    ``loss_scale_state()`` at the end of training (fp16: final, skipped_updates, updates;
    None otherwise, written as null).
    """
    tcfg = cfg["training"]
    config = _record_config(
        run, cfg, workers, controller, launcher, learning_rate_base, learning_rate, seed, kind
    )
    config.update(_step_config(cfg, model_parameters, steps_per_epoch * run.batch * workers))
    config["steps_per_epoch"] = steps_per_epoch
    metric = workload_for(cfg).metric
    stop = stop_reason or ("nan_loss" if status == "nan_loss" else "max_epochs")
    record = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run.run_id,
        "status": status,
        "exit_status": EXIT_NAN if status == "nan_loss" else 0,
        "error": error,
        "config": config,
        "environment": environment,
        "resume": {"resumed": len(attempts) > 1, "attempts": attempts},
        "epochs": epochs,
        "summary": summarise(epochs, (target or {}).get("value"), metric),
        **_outcome_blocks(epochs, workers, tcfg, target, stop, framework, metric),
        "loss_scale": loss_scale_block(loss_scale),  # issue 32: fp16's dynamic loss scale
        "initial_weights_sha256": initial_weights_sha256,
        "utilisation": utilisation,
        "timing_method": TIMING_METHODS[framework],
        "timeline": timeline,
        "timeline_check": timeline_check,
        "data": data,
        "finished_utc": utc_now(),
    }
    record.update({} if system is None else {"system": system})
    _add_startup(record, attempts)
    return record


def loss_scale_block(state: dict | None) -> dict | None:
    """The record's ``loss_scale`` from a step program's ``loss_scale_state()`` (None:
    the run had no loss scaling)."""
    if state is None:
        return None
    return {
        "final": float(state["final"]),
        "skipped_updates": int(state["skipped_updates"]),
        "updates": int(state["updates"]),
    }


def _add_startup(record: dict, attempts: list[dict]) -> None:
    """Issue 30 item 7: ``timing.startup_s`` (the attempts' start-up, launcher's start to
    epoch loop, summed) and ``target.launch_to_target_s`` (start-up up to the target epoch
    plus the time to target); null where a figure is missing (hvdscale.record.startup)."""
    record["timing"]["startup_s"] = total_startup(attempts)
    tgt = record["target"]
    tgt["launch_to_target_s"] = launch_to_target(attempts, tgt["epoch"], tgt["time_to_target_s"])


# --------------------------------------------------------------------------- validation


def load_run_schema() -> dict:
    with open(RUN_SCHEMA) as fh:
        return json.load(fh)


def validate_record(record: dict) -> None:
    """Raise RecordError naming every field that violates the run schema."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(load_run_schema())
    errors = sorted(validator.iter_errors(record), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = [
            f"{'.'.join(str(p) for p in e.absolute_path) or '(top level)'}: {e.message}"
            for e in errors[:20]
        ]
        raise RecordError("run record does not match run.schema.json:\n  " + "\n  ".join(lines))


def write_run_outputs(out_dir: str | Path, record: dict) -> Path:
    """Validate, then write history.csv and metrics.json (atomically, metrics.json last)."""
    validate_record(record)
    out_dir = Path(out_dir)
    write_text_atomic(out_dir / "history.csv", history_csv(record["epochs"]))
    path = out_dir / "metrics.json"
    write_json_atomic(path, record)
    return path


def read_record(path: str | Path) -> dict | None:
    """A valid record from ``path``, or None (missing, unreadable or invalid)."""
    try:
        with open(path) as fh:
            rec = json.load(fh)
        validate_record(rec)
        return rec
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- failure


def write_failure(
    path: str | Path,
    *,
    run_id: str,
    exit_status: int,
    error_tail: str,
    launcher: str,
    command: list[str] | None = None,
    program: str = "train",
    message: str | None = None,
) -> Path:
    """``OUT_DIR/failure.json`` for a run that ended without a usable record: run_id,
    status "failed", the exit status, a one-line message naming the failed rank(s) where
    known, the tail of the launcher's output and the time."""
    path = Path(path)
    write_json_atomic(
        path,
        {
            "run_id": run_id,
            "status": "failed",
            "program": program,
            "exit_status": int(exit_status),
            "message": message,
            "launcher": launcher,
            "command": command,
            "error_tail": error_tail[-8000:],
            "time_utc": utc_now(),
            "hostname": platform.node(),
            "python": sys.executable,
        },
    )
    return path


def model_bytes(n_parameters: int) -> int:
    """Size of the float32 weights (= the gradient message per step)."""
    return 4 * n_parameters
