"""Synthetic run records that validate against workflow/schemas/run.schema.json.

The analysis and report tests make their records with it (``import fixtures_runs``).
Two ways to make records:

* ``record_from_epochs(run_id, wall_s=[...], ...)``: exact, hand-made numbers (known
  answers for the aggregation tests);
* ``simulate_record(run_id, cfg, ...)``: a realistic run from a small performance model
  (per-step compute and data time per partition, ring-allreduce synchronisation with
  per partition/backend latency and bandwidth, a loss curve that depends on the number
  of optimizer steps and the learning-rate rule, run-to-run noise).

``write_study`` writes a whole study (every run of a config's run table, with some
missing, failed, nan_loss or malformed on request); ``allreduce_rows`` makes an
allreduce size sweep from known alpha/beta for the cost-model tests.
"""

from __future__ import annotations

import copy
import json
import math
import re
import zlib
from pathlib import Path

import numpy as np

from hvdscale.analysis.schemas import parse_any_run_id
from hvdscale.config.load import validate_config
from hvdscale.matrix.runtable import learning_rate_for, run_table

PROJECT_ROOT = Path(__file__).resolve().parents[1]
MODEL_PARAMETERS = 153441
MODEL_BYTES = MODEL_PARAMETERS * 4

# per partition: step time = c0 + c1 * batch (compute), d0 + d1 * batch (data), update u
PERF = {
    "alpha": dict(
        c0=2.0e-3,
        c1=0.6e-6,
        d0=0.05e-3,
        d1=0.25e-6,
        u=0.30e-3,
        kind="gpu",
        gpu="A100",
        host="taurusi8{:03d}",
        cpu="AMD EPYC 7352 24-Core Processor",
    ),
    "hpdlf": dict(
        c0=2.6e-3,
        c1=1.4e-6,
        d0=0.06e-3,
        d1=0.35e-6,
        u=0.40e-3,
        kind="gpu",
        gpu="RTX2080Ti",
        host="taurusml{:03d}",
        cpu="Intel Xeon E5-2603 v4",
    ),
    "gpu2": dict(
        c0=4.5e-3,
        c1=5.0e-6,
        d0=0.10e-3,
        d1=0.60e-6,
        u=0.70e-3,
        kind="gpu",
        gpu="K80",
        host="taurusi2{:03d}",
        cpu="Intel Xeon E5-2680 v3",
    ),
    "local": dict(
        c0=0.8e-3,
        c1=35e-6,
        d0=0.05e-3,
        d1=1.0e-6,
        u=0.25e-3,
        kind="cpu",
        gpu="",
        host="localhost{:0d}",
        cpu="Generic x86-64",
    ),
}
# (alpha latency s, beta bandwidth B/s) inside a node and across nodes
NET = {
    "nccl": ((12e-6, 40e9), (25e-6, 10e9)),
    "mpi": ((20e-6, 8e9), (40e-6, 5e9)),
    "gloo": ((35e-6, 4e9), (70e-6, 2.5e9)),
}

TORCH = "torch-ddp"
# torch-ddp (issue 19): compute per step relative to Horovod-TF, and the share of the
# allreduce that DDP hides behind the backward pass (overlap)
TORCH_COMPUTE = 0.85
TORCH_OVERLAP = 0.6

# the noise scale simulate_record reports for multi-worker runs: B_simple = 2000
NOISE_G2, NOISE_TRACE = 0.01, 20.0

_SCHEMA_PATH = PROJECT_ROOT / "workflow" / "schemas" / "run.schema.json"


def run_schema() -> dict:
    return json.loads(_SCHEMA_PATH.read_text())


def load_test_config(name: str = "config.yaml", **training) -> dict:
    """A validated config from config/{name}, with training keys overridden."""
    import yaml

    raw = yaml.safe_load((PROJECT_ROOT / "config" / name).read_text())
    raw.setdefault("training", {}).update(training)
    if "repeats" in training:  # every sweep, whatever repeats the config gives one
        for sweep in raw.get("scaling", {}).get("sweeps", []):
            sweep.pop("repeats", None)
    return validate_config(raw)


def ring_time(p: int, nbytes: float, alpha: float, beta: float) -> float:
    """Ring allreduce: 2(p-1) alpha + 2(p-1)/p * bytes / beta."""
    if p <= 1:
        return 0.0
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / beta


def _parse(run_id: str) -> dict:
    """parse_run_id, with the run kind (``_cal``/``_rerun`` before ``_r{repeat}``) in
    ``kind`` whatever the installed run-id pattern knows about kinds, and the framework
    (``{partition}_torch-ddp_...``, issue 19) in ``framework`` whatever it knows about
    frameworks."""
    m = re.search(r"_(cal|rerun)(?=_r[0-9]+$)", run_id)
    try:
        p = dict(parse_any_run_id(run_id))
    except Exception:
        if not m:
            raise
        p = dict(parse_any_run_id(run_id[: m.start()] + run_id[m.end() :]))
    p["kind"] = p.get("kind") or (m.group(1) if m else "")
    return p


def study_target(cfg: dict) -> float:
    """The target validation loss simulated records of ``cfg`` are measured against."""
    tr = cfg["training"]
    t = tr.get("target") or {}
    if t.get("mode") == "absolute":
        return float(t["value"])
    return float(tr.get("target_test_loss", 0.05))


def _perf(partition: str) -> dict:
    return PERF.get(partition, PERF["local"])


def _base_record(
    run_id: str,
    *,
    workers_per_node: int | None = None,
    epochs: int = 10,
    warmup_epochs: int = 1,
    learning_rate_base: float = 4.7331e-4,
    target_test_loss: float = 0.05,
    launcher: str = "srun",
    seed: int = 20240601,
    config_hash: str = "0" * 64,
    git_commit: str = "a" * 40,
    slurm_job_id: str | None = "1000",
    kind: str = "",
) -> dict:
    p = _parse(run_id)
    kind = kind or p["kind"]
    perf = _perf(p["partition"])
    w, nodes = p["workers"], p["nodes"]
    wpn = workers_per_node or max(1, math.ceil(w / nodes))
    hosts = [perf["host"].format(1 + rank // wpn) for rank in range(w)]
    devices = [
        f"GPU:{rank % wpn} ({perf['gpu']})" if perf["kind"] == "gpu" else "CPU" for rank in range(w)
    ]
    controller = "gloo" if p["backend"] == "gloo" else "mpi"
    torch = p["framework"] == TORCH
    if torch:  # the torch-ddp trainer's record (issue 19): torchrun, torch.distributed
        launcher, controller = "torchrun", "gloo" if p["backend"] == "gloo" else "none"
    rec = {
        "schema_version": 1,
        "run_id": run_id,
        "status": "completed",
        "exit_status": 0,
        "error": None,
        "config": {
            "partition": p["partition"],
            "backend": p["backend"],
            "nodes": nodes,
            "workers": w,
            "workers_per_node": wpn,
            "batch_per_worker": p["batch"],
            "global_batch": w * p["batch"],
            "lr_rule": p["lr_rule"],
            "learning_rate_base": learning_rate_base,
            "learning_rate": learning_rate_for(learning_rate_base, p["lr_rule"], w),
            "lr_warmup": True,
            "epochs": epochs,
            "warmup_epochs": warmup_epochs,
            "threads_per_worker": 1,
            "launcher": launcher,
            "controller": controller,
            "repeat": p["repeat"],
            "seed": int(
                np.random.SeedSequence(
                    [seed, p["repeat"], {"": 0, "cal": 1, "rerun": 2}[kind]]
                ).generate_state(1)[0]
            ),
            "seed_base": seed,
            "kind": kind,
            "data_in_device_memory": False,
            "target_test_loss": target_test_loss,
            "model_parameters": MODEL_PARAMETERS,
            "model_bytes": MODEL_BYTES,
            "horovod_env": {"HOROVOD_GPU_OPERATIONS": p["backend"].upper()}
            if p["backend"] == "nccl"
            else {},
            "steps_per_execution": 1,
            "backward_passes_per_step": 1,
            "compression": "none",
        },
        "environment": {
            "hostnames": hosts,
            "python": "3.11.9",
            "tensorflow": "2.15.1",
            "horovod": "0.28.1",
            "mpi": "Open MPI 4.1.4",
            "numpy": "1.26.4",
            "git_commit": git_commit,
            "config_hash": config_hash,
            "started_utc": "2024-06-01T12:00:00Z",
            "slurm_job_id": slurm_job_id,
            "slurm_nodelist": ",".join(dict.fromkeys(hosts)),
            "devices": devices,
            "cpu_model": perf["cpu"],
        },
        "resume": {
            "resumed": False,
            "attempts": [
                {
                    "started_utc": "2024-06-01T12:00:00Z",
                    "start_epoch": 0,
                    "slurm_job_id": slurm_job_id,
                }
            ],
        },
        "epochs": [],
        "summary": {},
        "utilisation": {"kind": perf["kind"], "interval_s": 2.0, "samples": []},
        "timing_method": "epoch wall time on rank 0 (time.perf_counter); "
        "phases from instrumented steps",
        "timeline": None,
        "label_proof": {"ok": True, "problems": [], "world_size": w},
    }
    if torch:
        rec["config"]["framework"] = TORCH
        rec["config"]["horovod_env"] = {}
        rec["config"]["timeline_steps"] = 0
        rec["environment"]["torch"] = "2.13.0"
    # the step setting the run id names (issue 32: _bf16, _cmax ...; fp32/off otherwise)
    for key, default in (("precision", "fp32"), ("compile", "off")):
        if (p.get(key) or default) != default:
            rec["config"][key] = p[key]
    return rec


def target_block(rec: dict, target: float, mode: str = "absolute") -> dict:
    """The record's ``target`` block (contract of issue 16) from its validation losses."""
    eps = rec["epochs"]
    hit = next((e for e in eps if e.get("val_loss") is not None and e["val_loss"] <= target), None)
    vals = [e["val_loss"] for e in eps if e.get("val_loss") is not None]
    reason = {"nan_loss": "nan_loss", "failed": "time_limit"}.get(rec["status"], "max_epochs")
    if hit is not None and hit is eps[-1] and rec["status"] == "completed":
        reason = "target"
    return {
        "value": target,
        "mode": mode,
        "reached": hit is not None,
        "epoch": hit["epoch"] if hit is not None else None,
        "time_to_target_s": hit["elapsed_s"] if hit is not None else None,
        "censored": hit is None and rec["status"] == "completed",
        "stop_reason": reason,
        "best_val_loss": min(vals) if vals else None,
        "budget": {"max_epochs": rec["config"]["epochs"], "max_train_s": None},
    }


def _finish(rec: dict, utilisation: float | None = 80.0, interval_s: float = 2.0) -> dict:
    """Fill summary, target block and utilisation samples from the epochs."""
    eps = rec["epochs"]
    target = rec["config"]["target_test_loss"]
    rec["target"] = target_block(rec, target)
    timed = [e for e in eps if not e["warmup"]] or eps
    walls = [e["wall_s"] for e in timed]
    tot = sum(walls) or 1.0
    losses = [
        e["test_loss"] for e in eps if e["test_loss"] is not None and math.isfinite(e["test_loss"])
    ]
    ttt = rec["target"]["time_to_target_s"]
    rec["summary"] = {
        "epoch_time_median_s": float(np.median(walls)) if walls else None,
        "throughput_median": float(np.median([e["throughput"] for e in timed])) if timed else None,
        "sync_share": sum(e["time_sync_s"] for e in timed) / tot if timed else None,
        "data_share": sum(e["time_data_s"] for e in timed) / tot if timed else None,
        "compute_share": sum(e["time_compute_s"] for e in timed) / tot if timed else None,
        "update_share": sum(e["time_update_s"] for e in timed) / tot if timed else None,
        "final_test_loss": losses[-1] if losses else None,
        "best_test_loss": min(losses) if losses else None,
        "time_to_target_s": ttt,
        "epochs_completed": len(eps),
    }
    total = eps[-1]["elapsed_s"] if eps else 0.0
    n = int(total // interval_s)
    if utilisation is not None and n:
        rec["utilisation"]["samples"] = [
            [round(i * interval_s, 3), round(utilisation + 3.0 * math.sin(i), 2)]
            for i in range(1, n + 1)
        ]
    rec["utilisation"]["interval_s"] = interval_s
    return rec


def record_from_epochs(
    run_id: str,
    wall_s: list[float],
    *,
    test_loss: list[float | None] | None = None,
    train_loss: list[float | None] | None = None,
    shares: tuple[float, float, float, float] = (0.02, 0.70, 0.20, 0.05),
    steps: int | None = None,
    samples: int = 30000,
    warmup_epochs: int = 1,
    epochs: int | None = None,
    status: str = "completed",
    utilisation: float | None = 80.0,
    target_test_loss: float = 0.05,
    val_loss: list[float | None] | None = None,
    label_problems: list[str] | None = None,
    startup_s: float | None = None,
    **kw,
) -> dict:
    """A record with exactly these epoch wall times (first ``warmup_epochs`` marked warm-up).

    ``shares`` = (data, compute, sync, update) fractions of each epoch's wall time; the
    rest is ``time_other_s``. Throughput = samples / wall_s. ``val_loss`` (default: the
    ``test_loss`` values) decides the target block against ``target_test_loss`` (the
    target validation loss); the record keeps the test loss of the last epoch only (it
    is evaluated once, at the end). ``label_problems``: a failed label proof.
    ``startup_s``: the start-up of its one attempt (issue 30 item 7, :func:`add_startup`);
    None: a record of the older shape, without start-up fields.
    """
    rec = _base_record(
        run_id,
        epochs=epochs or len(wall_s),
        warmup_epochs=warmup_epochs,
        target_test_loss=target_test_loss,
        **kw,
    )
    p = _parse(run_id)
    steps = steps or max(1, samples // (p["workers"] * p["batch"]))
    test_loss = test_loss if test_loss is not None else [0.5 / (i + 1) for i in range(len(wall_s))]
    train_loss = (
        train_loss
        if train_loss is not None
        else [x * 0.9 if x is not None else None for x in test_loss]
    )
    val_loss = val_loss if val_loss is not None else list(test_loss)
    last = len(wall_s) - 1
    elapsed = 0.0
    for i, w in enumerate(wall_s):
        elapsed += w
        d, c, s, u = (w * f for f in shares)
        rec["epochs"].append(
            {
                "epoch": i,
                "warmup": i < warmup_epochs,
                "wall_s": w,
                "steps": steps,
                "samples": samples,
                "throughput": samples / w,
                "time_data_s": d,
                "time_compute_s": c,
                "time_sync_s": s,
                "time_update_s": u,
                "time_other_s": w - (d + c + s + u),
                "train_loss": train_loss[i],
                "val_loss": val_loss[i],
                "test_loss": test_loss[i] if i == last else None,
                "elapsed_s": elapsed,
                "utilisation_mean": utilisation,
            }
        )
    if label_problems:
        rec["label_proof"] = {"ok": False, "problems": list(label_problems)}
    rec["status"] = status
    if status == "failed":
        rec["exit_status"], rec["error"] = 1, "RuntimeError: simulated failure"
    elif status == "nan_loss":
        rec["exit_status"], rec["error"] = 3, "non-finite loss"
    return add_startup(_finish(rec, utilisation), startup_s)


def add_startup(rec: dict, startup_s: float | list[float | None] | None) -> dict:
    """The record's start-up fields (issue 30 item 7) as the trainer writes them: each
    attempt's ``startup_s`` (one number: every attempt's), ``timing.startup_s`` and
    ``target.launch_to_target_s`` (hvdscale.record.startup). None: leave the record of the
    older shape (no start-up fields at all)."""
    from hvdscale.record.startup import launch_to_target, total_startup

    if startup_s is None:
        return rec
    attempts = rec["resume"]["attempts"]
    values = startup_s if isinstance(startup_s, list) else [startup_s] * len(attempts)
    for a, v in zip(attempts, values):
        a["startup_s"] = v
    rec.setdefault("timing", {})["startup_s"] = total_startup(attempts)
    if rec.get("target") is not None:
        t = rec["target"]
        t["launch_to_target_s"] = launch_to_target(attempts, t["epoch"], t["time_to_target_s"])
    return rec


def simulate_record(
    run_id: str,
    *,
    epochs: int = 10,
    warmup_epochs: int = 1,
    train_samples: int = 750_000,
    status: str = "completed",
    stop_epoch: int | None = None,
    target_test_loss: float = 0.05,
    seed: int = 0,
    startup_s: float | None = None,
    **kw,
) -> dict:
    """A realistic record from the performance and loss model above.

    ``status`` "nan_loss" or "failed" stops the run after ``stop_epoch`` epochs
    (default: half of them); a nan_loss run's last test loss is null. ``startup_s``:
    the start-up of each attempt (:func:`add_startup`); None: no start-up fields.
    """
    p = _parse(run_id)
    w, b, nodes, part = p["workers"], p["batch"], p["nodes"], p["partition"]
    mult = 1.0
    if p["lr_mult"] is not None:  # a tuning candidate: its own base LR and warm-up
        mult, warmup_epochs = p["lr_mult"], p["tune_warmup"]
        kw.setdefault("learning_rate_base", 4.7331e-4 * mult)
    rng = np.random.default_rng(zlib.crc32(f"{run_id}/{seed}".encode()))
    perf = _perf(part)
    rec = _base_record(
        run_id,
        epochs=epochs,
        warmup_epochs=warmup_epochs,
        target_test_loss=target_test_loss,
        slurm_job_id=str(4_000_000 + rng.integers(0, 999_999)),
        **kw,
    )
    (a_in, b_in), (a_out, b_out) = NET[p["backend"]]
    alpha, beta = (a_out, b_out) if nodes > 1 else (a_in, b_in)
    steps = math.ceil(train_samples / (w * b))
    samples = steps * w * b
    t_compute = perf["c0"] + perf["c1"] * b
    t_data = perf["d0"] + perf["d1"] * b
    t_update = perf["u"]
    t_sync = ring_time(w, MODEL_BYTES, alpha, beta) * (1.0 + 0.15 * (w > 1)) + (
        30e-6 if w > 1 else 5e-6
    )
    t_allreduce = t_sync
    if p["framework"] == TORCH:  # DDP overlaps part of the allreduce with the backward pass
        t_compute *= TORCH_COMPUTE
        t_sync = t_allreduce * (1 - TORCH_OVERLAP)
    t_other = 0.02 * t_compute
    run_factor = float(rng.lognormal(0.0, 0.03))
    # loss model: progress ~ optimizer steps x effective LR, saturating for large LR
    lr_scale = mult * {"none": 1.0, "linear": float(w), "sqrt": math.sqrt(w)}[p["lr_rule"]]
    step_gain = min(lr_scale, 8.0) * (b / 75.0) ** 0.5
    progress_per_epoch = steps * step_gain / (train_samples / 75.0)
    floor = 0.02 + 0.004 * max(0.0, math.log2(lr_scale * b / 75.0))
    n_epochs = (
        epochs
        if status == "completed"
        else (stop_epoch if stop_epoch is not None else max(1, epochs // 2))
    )
    elapsed, progress = 0.0, 0.0
    util = (
        (88.0 if perf["kind"] == "gpu" else 97.0)
        * t_compute
        / (t_compute + t_data + t_sync + t_update)
    )
    for e in range(n_epochs):
        f = run_factor * float(rng.lognormal(0.0, 0.02)) * (1.35 if e < warmup_epochs else 1.0)
        d, c, s, u, o = (steps * t * f for t in (t_data, t_compute, t_sync, t_update, t_other))
        wall = d + c + s + u + o
        elapsed += wall
        progress += progress_per_epoch
        test = floor + 0.6 * math.exp(-1.2 * progress) * float(rng.lognormal(0.0, 0.03))
        train = test * 0.92
        if status == "nan_loss" and e == n_epochs - 1:
            test = train = None
        rec["epochs"].append(
            {
                "epoch": e,
                "warmup": e < warmup_epochs,
                "wall_s": wall,
                "steps": steps,
                "samples": samples,
                "throughput": samples / wall,
                "time_data_s": d,
                "time_compute_s": c,
                "time_sync_s": s,
                "time_update_s": u,
                "time_other_s": o,
                "train_loss": train,
                "val_loss": test,
                "test_loss": None if test is None or e < n_epochs - 1 else test * 1.01,
                "elapsed_s": elapsed,
                "utilisation_mean": round(util * float(rng.uniform(0.97, 1.03)), 2),
                **noise_epoch_fields(w, b, samples, steps, e < warmup_epochs),
            }
        )
    rec["status"] = status
    if status == "failed":
        rec["exit_status"], rec["error"] = (
            1,
            "horovod.common.exceptions.HorovodInternalError: ring broken",
        )
    elif status == "nan_loss":
        rec["exit_status"], rec["error"] = 3, f"non-finite loss in epoch {n_epochs - 1}"
    no_comm = (t_data + t_compute + t_update + t_other) * run_factor
    rec["timing"] = {"sync": sync_block(p["framework"], w, t_allreduce * run_factor, no_comm)}
    interval = max(2.0, elapsed / 150)
    return add_startup(_finish(rec, util, interval_s=interval), startup_s)


def noise_epoch_fields(workers: int, b: int, samples: int, steps: int, warmup: bool) -> dict:
    """One epoch's noise-scale sums (means per update) at their expectations for
    B_simple = NOISE_TRACE / NOISE_G2 = 2000, batches drawn without replacement from the
    epoch's ``samples``: |G|^2 + tr(Sigma) (1/B - 1/N) (analysis/noise_scale). None for
    1 worker and in warm-up epochs (the trainer's sums are over timed updates)."""
    if workers <= 1 or warmup:
        return {"noise_steps": 0, "g_local_sq": None, "g_global_sq": None}
    inv_n = 1.0 / samples
    return {
        "noise_steps": int(steps),
        "g_local_sq": NOISE_G2 + NOISE_TRACE * (1.0 / b - inv_n),
        "g_global_sq": NOISE_G2 + NOISE_TRACE * (1.0 / (workers * b) - inv_n),
    }


def sync_block(framework: str, workers: int, allreduce_s: float, no_comm_s: float) -> dict:
    """The record's timing.sync (contract of issue 19): Horovod's allreduce is not
    overlapped (exposed = allreduce, no comm hook); DDP's comm hook overlaps the backward
    pass and leaves (1 - TORCH_OVERLAP) of the allreduce exposed. 1 worker: nulls."""
    torch = framework == TORCH
    definition = (
        "exposed_s = median step time - median time of the same step under no_sync"
        if torch
        else "Horovod: the allreduce is not overlapped, exposed_s = allreduce_s"
    )
    if workers <= 1:
        keys = ("allreduce_s", "comm_hook_s", "exposed_s", "no_comm_step_s")
        return {**dict.fromkeys(keys), "definition": definition}
    exposed = allreduce_s * (1 - TORCH_OVERLAP) if torch else allreduce_s
    return {
        "allreduce_s": allreduce_s,
        "comm_hook_s": allreduce_s * 1.1 if torch else None,
        "exposed_s": exposed,
        "no_comm_step_s": no_comm_s if torch else None,
        "definition": definition,
    }


def torch_twin(rec_id: str) -> str:
    """The torch-ddp run id of a Horovod-TF run id (framework token after the partition)."""
    head, _, rest = rec_id.partition("_")
    return f"{head}_{TORCH}_{rest}"


def write_two_framework_study(runs_dir: str | Path, cfg: dict, *, skip_torch=(), **kw) -> list:
    """write_study's records of ``cfg`` (Horovod-TF) plus a torch-ddp twin of every one
    of its gloo runs (the backend both frameworks have on a CPU); ``skip_torch``: Horovod
    run ids whose twin is left out (e.g. a 1-worker baseline). Returns the ids written."""
    written = write_study(runs_dir, cfg, **kw)
    epochs = kw.get("epochs") or sim_epochs(cfg)
    train_samples = int(cfg["data"]["n_samples"] * cfg["data"]["train_fraction"])
    for run in run_table(cfg):
        if run.backend != "gloo" or run.run_id in skip_torch:
            continue
        rid = torch_twin(run.run_id)
        rec = simulate_record(
            rid,
            epochs=epochs,
            warmup_epochs=cfg["training"]["warmup_epochs"],
            train_samples=kw.get("train_samples") or train_samples,
            target_test_loss=study_target(cfg),
            workers_per_node=run.workers_per_node,
            launcher="torchrun",
        )
        write_record(runs_dir, rec)
        written.append(rid)
    return written


# ----------------------------------------------------------------------------- writing


def write_record(runs_dir: str | Path, rec: dict, run_id: str | None = None) -> Path:
    path = Path(runs_dir) / (run_id or rec["run_id"]) / "metrics.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))
    return path


def write_failure(
    runs_dir: str | Path,
    run_id: str,
    exit_status: int = 137,
    error: str = "srun: error: node failure; job step killed (OOM)",
    style: str = "short",
) -> Path:
    """failure.json: ``short`` = {run_id, status, exit_status, error, time}; ``launcher`` =
    the fields hvdscale.record.build.write_failure writes (message, error_tail, time_utc, ...)."""
    path = Path(runs_dir) / run_id / "failure.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    if style == "short":
        data = {
            "run_id": run_id,
            "status": "failed",
            "exit_status": exit_status,
            "error": error,
            "time": "2024-06-01T13:00:00Z",
        }
    else:
        data = {
            "run_id": run_id,
            "status": "failed",
            "program": "train",
            "exit_status": exit_status,
            "message": None,
            "launcher": "srun",
            "command": ["srun", "hvdscale", "train"],
            "error_tail": f"epoch 0: 12.0 s\n{error}\n",
            "time_utc": "2024-06-01T13:00:00Z",
            "hostname": "login1",
            "python": "/usr/bin/python3",
        }
    path.write_text(json.dumps(data))
    return path


def write_study(
    runs_dir: str | Path,
    cfg: dict,
    *,
    epochs: int | None = None,
    train_samples: int | None = None,
    missing: set[str] = frozenset(),
    failed: set[str] = frozenset(),
    nan_loss: set[str] = frozenset(),
    failed_record: set[str] = frozenset(),
    limit: int | None = None,
    config_hash: str | None = None,
) -> list[str]:
    """Write simulated records for the config's run table; returns the run_ids written.

    ``missing``: no files; ``failed``: only failure.json (the job died); ``failed_record``:
    a metrics.json with status failed; ``nan_loss``: stopped by a non-finite loss.
    ``limit``: write only the first ``limit`` runs (the rest are missing).
    """
    from hvdscale.analysis.aggregate import SliceHash

    epochs = epochs or sim_epochs(cfg)
    if train_samples is None:
        train_samples = int(cfg["data"]["n_samples"] * cfg["data"]["train_fraction"])
    table = {r.run_id: r for r in run_table(cfg)}
    slice_hash = SliceHash(cfg, table)  # what a real run records: its slice's hash
    written = []
    for i, run in enumerate(table.values()):
        rid = run.run_id
        if rid in missing or (limit is not None and i >= limit):
            continue
        if rid in failed:
            write_failure(runs_dir, rid)
            written.append(rid)
            continue
        status = (
            "nan_loss" if rid in nan_loss else "failed" if rid in failed_record else "completed"
        )
        rec = simulate_record(
            rid,
            epochs=epochs,
            warmup_epochs=cfg["training"]["warmup_epochs"],
            train_samples=train_samples,
            status=status,
            target_test_loss=study_target(cfg),
            workers_per_node=run.workers_per_node,
            config_hash=config_hash or slice_hash(rid),
            launcher=cfg["training"]["launcher"],
        )
        write_record(runs_dir, rec)
        written.append(rid)
    return written


def sim_epochs(cfg: dict) -> int:
    """Epochs of a simulated record: the config's budget, at most 20 (the default budget
    is a generous 300 epochs that real runs leave at the target; simulated records
    stay small)."""
    tr = cfg["training"]
    return min(20, tr.get("max_epochs", tr.get("epochs")))


def write_reruns(runs_dir: str | Path, cfg: dict, tuned, repeats: int = 5, **kw) -> list[str]:
    """Simulated re-runs (kind ``rerun``, fresh seeds) of every selected tuning candidate
    of ``tuned`` (select_tuned's table: status awaiting_reruns or selected); returns the
    run ids written. ``kw`` as for simulate_record (train_samples, ...)."""
    written = []
    for x in tuned[tuned["status"].isin(["awaiting_reruns", "selected"])].itertuples():
        first = next(
            r
            for r in run_table(cfg)
            if (r.partition, r.backend, r.workers, r.batch, r.lr_rule, r.candidate)
            == (x.partition, x.backend, x.workers, x.batch_per_worker, x.lr_rule, x.candidate)
        )
        for k in range(repeats):
            rid = re.sub(r"_r[0-9]+$", f"_rerun_r{k}", first.run_id)
            rec = simulate_record(
                rid,
                epochs=sim_epochs(cfg),
                target_test_loss=study_target(cfg),
                workers_per_node=first.workers_per_node,
                **kw,
            )
            write_record(runs_dir, rec)
            written.append(rid)
    return written


def bigger_thesis_config(min_runs: int = 1000) -> dict:
    """The thesis config with enough repeats for at least ``min_runs`` runs."""
    cfg = load_test_config("thesis.yaml")
    per_repeat = len(run_table(cfg)) // cfg["training"]["repeats"]
    cfg = load_test_config("thesis.yaml", repeats=max(1, math.ceil(min_runs / per_repeat)))
    return cfg


# ----------------------------------------------------------------------------- allreduce


def allreduce_rows(
    partition: str,
    backend: str,
    alpha: float,
    beta: float,
    *,
    workers=(2, 4, 8, 16, 32),
    sizes=None,
    noise: float = 0.02,
    slots_per_node: int = 8,
    seed: int = 0,
) -> list[dict]:
    """An allreduce size sweep (rows of results/allreduce/*.csv) from known alpha/beta."""
    rng = np.random.default_rng(seed)
    sizes = sizes if sizes is not None else [4 * 2**k for k in range(0, 25, 2)]  # 4 B .. 64 MiB
    rows = []
    for p in workers:
        for n in sizes:
            t = ring_time(p, n, alpha, beta) if p > 1 else 2e-6 + n / 50e9  # one rank: a local copy
            t *= float(rng.lognormal(0.0, noise))
            rows.append(
                {
                    "partition": partition,
                    "backend": backend,
                    "workers": p,
                    "nodes": math.ceil(p / slots_per_node),
                    "bytes": n,
                    "time_s": t,
                    "p10_s": t * 0.95,
                    "p90_s": t * 1.08,
                    "algbw_Bps": n / t,
                    "busbw_Bps": n / t * 2 * (p - 1) / p,
                }
            )
    return rows


def write_allreduce_csv(path: str | Path, rows: list[dict]) -> Path:
    import csv

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    return path


def study_allreduce(outdir: str | Path, cfg: dict, seed: int = 0) -> list[Path]:
    """One allreduce CSV per partition/backend of the config, from the NET model (inter-node)."""
    paths = []
    combos = sorted(
        {(r.partition, r.backend, r.gpus_per_node or r.workers_per_node) for r in run_table(cfg)}
    )
    seen = set()
    for part, be, slots in combos:
        if (part, be) in seen:
            continue
        seen.add((part, be))
        (a, b), _ = NET[be]
        rows = allreduce_rows(
            part,
            be,
            a,
            b,
            slots_per_node=max(1, slots),
            seed=seed,
            workers=(2, 4, 8, 16, 32) if part != "local" else (2,),
        )
        paths.append(write_allreduce_csv(Path(outdir) / f"{part}_{be}.csv", rows))
    return paths


def deep_copy(rec: dict) -> dict:
    return copy.deepcopy(rec)


def synthetic_system(rec: dict) -> dict:
    """A ``system`` object (hvdscale.record.system.collect_system's shape) for a synthetic
    record, from its partition's PERF entry and hosts."""
    perf = _perf(rec["config"]["partition"])
    gpu = perf["kind"] == "gpu"
    return {
        "hostname": rec["environment"]["hostnames"][0],
        "nodes": sorted(set(rec["environment"]["hostnames"])),
        "cpu_model": perf["cpu"],
        "cores": 24,
        "memory_mb": 64000,
        "gpus": [{"model": f"NVIDIA {perf['gpu']}", "driver": "535.104.05", "memory": "12288 MiB"}]
        * (4 if gpu else 0),
        "cuda_driver": "12.2" if gpu else "",
        "cuda_build": "12.2" if gpu else "",
        "cudnn": "8" if gpu else "",
        "nccl": "2.18.5" if gpu else "",
        "mpi": "mpirun (Open MPI) 4.1.4",
        "mpi_implementation": "Open MPI",
        "mpi_version": "4.1.4",
        "horovod_mpi": True,
        "horovod_gloo": True,
        "interfaces": [
            {"name": "ib0", "addresses": ["10.0.0.1"]},
            {"name": "ib:mlx5_0", "addresses": []},
        ]
        if gpu
        else [{"name": "eth0", "addresses": ["192.0.2.2"]}],
        "nccl_socket_ifname": "ib0" if gpu else "",
        "kernel": "5.14.0",
        "os": "Linux-5.14.0-x86_64-with-glibc2.34",
        "python": "3.11.9",
        "errors": {},
    }


def add_systems(runs_dir: str | Path, skip: int = 0) -> int:
    """Give the records under ``runs_dir`` a synthetic ``system`` (all but the first
    ``skip``, in sorted order, which stay as records before issue 13); how many got one."""
    n = 0
    for i, path in enumerate(sorted(Path(runs_dir).glob("*/metrics.json"))):
        if i < skip:
            continue
        rec = json.loads(path.read_text())
        rec["system"] = synthetic_system(rec)
        path.write_text(json.dumps(rec))
        n += 1
    return n
