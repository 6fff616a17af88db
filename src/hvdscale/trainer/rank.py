"""Train one rank of a run, whatever its framework (train env).

``train_rank`` is the recipe, in the order of Horovod's TF2 examples: read the config
and the run, start the worker (bind the CPUs, initialise the framework, pin the device),
read the rank's rows, build the network and optimizer, resume or broadcast, train, and
(rank 0) write the run record. What differs between frameworks is a small object, a
``Framework``: how a worker starts, the optimizer and step program it builds, the
timeline window, what proves the run's label, the versions in the record, the shutdown.
Everything else is shared: the rows per rank (``trainer.data``), checkpoints and resume
(``trainer.checkpoint``), the epoch loop (``trainer.loop``), the utilisation sampler and
the run record (``record.build``, ``record.labelproof``).

Each framework's folder holds its object (``trainer.horovod_tf.framework.FRAMEWORK``,
``trainer.torch_ddp.framework.FRAMEWORK``); ``matrix.backends.TRAINERS`` names it, and the
run id names the framework (``framework_for_run``). ``run`` trains a rank inside the
rank's frame (``trainer.frame.run_rank``: pid file, signals, exit marker).
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from hvdscale.config.load import load_config, run_config_hash
from hvdscale.errors import UserError
from hvdscale.matrix import backends
from hvdscale.matrix.runid import parse_run_id
from hvdscale.matrix.runtable import find_run
from hvdscale.record.build import EXIT_NAN, build_record, system_block, utc_now, write_run_outputs
from hvdscale.record.environment import environment_block
from hvdscale.record.startup import launch_stamp, startup_since
from hvdscale.record.timing import timeline_check
from hvdscale.target import read_target
from hvdscale.trainer.checkpoint import Checkpointer
from hvdscale.trainer.data import load_rank_data
from hvdscale.trainer.frame import run_rank
from hvdscale.trainer.loop import LoopPlan, TimelineWindow, train_epochs
from hvdscale.trainer.placement import GpuDemand, affinity, cuda_visible_devices
from hvdscale.trainer.protocols import Optimiser, Steps
from hvdscale.trainer.utilisation import NullSampler, UtilisationSampler
from hvdscale.trainer.worker import WorkerInfo


@dataclass
class Started:
    """A rank once its framework is up."""

    worker: WorkerInfo  # rank, size and the book-keeping collectives
    device: Any  # what the framework's steps run on (its own kind of handle)
    device_desc: str  # the device in the record (environment.devices): GPU:i (name), CPU...
    bound: list[int] | None  # the cores the rank is bound to (None: not bound)
    summary: str  # what rank 0's first log line says about the job


class Framework(Protocol):
    """What ``train_rank`` asks of a framework. Implementations:
    ``trainer.horovod_tf.framework.HorovodTF``, ``trainer.torch_ddp.framework.TorchDDP``."""

    name: str  # the framework's name (matrix.backends.FRAMEWORKS)
    log_name: str  # what rank 0's log lines start with
    record_config: dict  # keys of the record's config block the framework sets itself
    on_term: Any  # the SIGTERM handler while the rank trains (trainer.frame.run_rank)

    def rank_env(self) -> dict:
        """{"rank", ...} as the launcher announced it, before the framework is up (the
        pid file and the exit marker are named by it)."""

    def start(self, args, run_, tcfg: dict, demand: GpuDemand | None = None) -> Started:
        """Bind the CPUs, initialise the framework, pin the rank's device, in that order
        (before any thread or op of the framework exists). A rank that would compute on
        the CPU where ``demand`` (its partition) needs a GPU stops with
        ``GpuDemand.check``'s error."""

    def optimisation(self, cfg: dict, run_, worker, steps: int, device) -> Optimiser:
        """The network seeded with the run's seed, its optimizer with the run's LR rule
        and warm-up, built so that its state exists before it is restored or broadcast."""

    def step_program(
        self, optim, worker, tcfg: dict, device, *, train, test, val, batch: int
    ) -> Steps:
        """The rank's step program over its rows (``train``/``test``/``val``: (x, y))."""

    def timeline_window(
        self, worker, tcfg: dict, out_dir: Path, start_epoch: int
    ) -> TimelineWindow | None:
        """The timeline window the loop records (issue 16 item 6), or None."""

    def versions(self) -> dict:
        """The framework's versions for the record's environment block (keys
        ``tensorflow`` and ``horovod`` fill those fields, "none" without them; other keys
        are added)."""

    def label_facts(self, worker) -> dict:
        """What the framework itself reports for the label proof (before it shuts down)."""

    def shutdown(self, worker, program) -> None:
        """Every rank at the end of training: wait for the others, release the framework."""

    def launcher(self) -> str:
        """The launcher that started the rank (the record's config.launcher)."""

    def timeline_file(self) -> Path | None:
        """The whole-run timeline the launcher asked for (training.timeline), or None."""

    def label_proof(self, record: dict, facts: dict, out_dir: Path) -> dict:
        """The record's label_proof (``record.labelproof.prove`` and the framework's facts)."""

    def leave(self) -> None:
        """After the rank has ended, however it ended: release what the framework still
        holds (a no-op where nothing is left)."""


def load_framework(name: str) -> Framework:
    """The trainer object of framework ``name`` (matrix.backends.TRAINERS names it)."""
    try:
        target = backends.TRAINERS[name]
    except KeyError:
        known = ", ".join(backends.TRAINERS)
        raise UserError(f"framework {name!r}: expected one of {known}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def framework_for_run(run_id: str) -> Framework:
    """The trainer of the framework that the run id names (the default when it names none)."""
    return load_framework(parse_run_id(run_id)["framework"])


def run(args, framework: Framework) -> int:
    """One rank of the run with ``framework``'s trainer, in the rank's frame (pid file,
    SIGTERM handler, SIGUSR1 stop, exit marker); then the framework lets go of whatever it
    still holds. Exit status."""
    try:
        rank = framework.rank_env()["rank"]
        return run_rank(args, rank, partial(train_rank, framework=framework), framework.on_term)
    finally:
        framework.leave()


def train_rank(args, out_dir: Path, framework: Framework) -> int:
    """Train this rank's part of the run; rank 0 writes the run record. Exit status.
    The recipe, in the order of Horovod's TF2 examples: bind the CPUs, init, pin the
    device, read the rank's data, build the model, resume or broadcast, train, record."""
    cfg = load_config(args.config)
    run_ = find_run(cfg, args.run_id)
    tcfg = cfg["training"]
    started_utc = utc_now()

    target = run_target(args.target)
    seed = run_.seed  # run_seed(config seed, repeat, kind)
    check_framework(run_, framework)
    # Horovod: bind, hvd.init(), pin the device; a rank of a GPU partition without a GPU
    # stops here, before its first step (GpuDemand)
    rank = framework.start(args, run_, tcfg, GpuDemand.of(cfg, run_))
    worker = rank.worker
    check_worker_count(run_, worker)
    log = root_logger(worker, framework.log_name)
    log(f"{run_.run_id}: {rank.summary}" + (f", bound to cores {rank.bound}" if rank.bound else ""))

    data = load_rank_data(Path(args.data_dir), cfg, worker, run_.batch)
    optim = framework.optimisation(cfg, run_, worker, data.steps, rank.device)
    chash = run_config_hash(cfg)  # results_dir at its default: a moved study matches
    checkpointer = Checkpointer.for_run(
        out_dir, optim.checkpoint(), run_.run_id, chash, worker.size, seed, tcfg
    )
    progress = checkpointer.restore(worker, log)  # HVD: rank 0 reads, then broadcasts
    optim.broadcast(worker)  # HVD: rank 0's weights and optimizer state everywhere
    if not progress.history and worker.is_root:  # a fresh start: the initial weights
        progress.initial_weights_sha256 = optim.weights_sha256()
    progress.begin_attempt(started_utc)
    environment, system = describe_environment(
        worker, rank.device_desc, chash, progress.attempts[0], framework
    )

    program = framework.step_program(
        optim, worker, tcfg, rank.device, train=(data.x_train, data.y_train),
        test=(data.x_test, data.y_test), val=(data.x_val, data.y_val), batch=run_.batch,
    )  # fmt: skip
    data.release()
    warm_up_started = time.perf_counter()
    program.warm_up(tcfg["steps_per_execution"])  # tracing / compilation: no epoch's time
    warm_up_s = time.perf_counter() - warm_up_started
    plan = LoopPlan.from_config(
        cfg, run_.run_id, data.steps, run_.batch * worker.size, seed, target["value"]
    )
    plan.timeline = framework.timeline_window(worker, tcfg, out_dir, progress.start_epoch)
    sampler = make_sampler(worker)
    # start-up of this attempt: the launcher's start (HVDSCALE_LAUNCH_START) to here, the
    # start of the epoch loop; rank 0's is recorded (null without the stamp)
    progress.loop_started(startup_since(launch_stamp(), time.time()))
    result = train_epochs(program, worker, plan, progress, checkpointer, sampler, optim, log)
    loss_scale = loss_scale_state(program)  # issue 32: fp16's scale, before the shutdown

    facts = framework.label_facts(worker)  # before the framework shuts down
    framework.shutdown(worker, program)
    if result.exit_code is not None:  # stopped before the time limit: the retry resumes
        return result.exit_code
    if not worker.is_root:
        # exit 0 even after nan_loss: a non-zero exit would make the launcher kill rank 0
        # while it writes the record; rank 0's exit status speaks for the job
        return 0
    record = run_record(
        run_, cfg, worker, optim, data, progress, result, sampler, environment,
        system, seed=seed, target=target, framework=framework, loss_scale=loss_scale,
    )  # fmt: skip
    record["timing"]["warm_up_s"] = round(warm_up_s, 4)
    record["config"].update(getattr(program, "record_config", {}))  # e.g. compile_mode
    record["label_proof"] = framework.label_proof(record, facts, out_dir)
    write_run_outputs(out_dir, record)
    log(f"wrote {out_dir / 'metrics.json'} (status {result.status})")
    return EXIT_NAN if result.status == "nan_loss" else 0


# =========================================================================== helpers


def run_record(
    run_,
    cfg,
    worker,
    optim,
    data,
    progress,
    result,
    sampler,
    environment,
    system=None,
    *,
    seed=None,
    target=None,
    framework: Framework,
    loss_scale: dict | None = None,
) -> dict:
    """Rank 0's run record from the objects of the run (``loss_scale``: the step
    program's ``loss_scale_state()``)."""
    timeline = framework.timeline_file()  # training.timeline: the whole run's
    record = build_record(
        run=run_,
        cfg=cfg,
        workers=worker.size,
        controller=worker.controller,
        launcher=framework.launcher(),
        status=result.status,
        error=result.error,
        learning_rate_base=optim.lr_base,
        learning_rate=optim.lr,
        model_parameters=optim.n_params,
        steps_per_epoch=data.steps,
        environment=environment,
        attempts=progress.attempts,
        epochs=progress.history,
        utilisation=utilisation_block(sampler, progress.utilisation_samples),
        timeline=timeline.name if timeline is not None and timeline.is_file() else None,
        timeline_check=timeline_check(
            timeline, result.rank_sync_s, progress.epochs_this_attempt(), worker.size
        ),
        data={**data.info, "test_values": result.test_values},
        system=system,
        seed=seed,
        kind=getattr(run_, "kind", ""),
        target=target,
        stop_reason=result.stop_reason,
        initial_weights_sha256=progress.initial_weights_sha256,
        framework=framework.name,
        loss_scale=loss_scale,
    )
    record["config"].update(framework.record_config)
    return record


def loss_scale_state(program) -> dict | None:
    """The step program's dynamic loss scale at the end of training (fp16: final,
    skipped_updates, updates); None without loss scaling or for a program that has
    none (a benchmark's variant)."""
    state = getattr(program, "loss_scale_state", None)
    return state() if callable(state) else None


def run_target(path) -> dict:
    """The run's target from ``--target`` (target.json, read and validated by
    hvdscale.target.read_target); no file: {"value": None, "mode": "none"} (train the
    budget)."""
    if path is None:
        return {"value": None, "mode": "none"}
    spec = read_target(path)
    return {"value": float(spec["value"]), "mode": str(spec["mode"])}


def check_framework(run_, framework: Framework) -> None:
    """The run is a run of ``framework`` (its run id names the framework)."""
    if run_.framework != framework.name:
        raise UserError(
            f"run {run_.run_id} is a run of framework {run_.framework}, not {framework.name}: "
            "run ids name their framework unless it is the default "
            f"{backends.DEFAULT_FRAMEWORK} ({{partition}}_{{framework}}_{{backend}}_..., "
            "config key scaling.sweeps[].frameworks)"
        )


def check_worker_count(run_, worker: WorkerInfo) -> None:
    if worker.size != run_.workers:
        raise UserError(
            f"run {run_.run_id} needs {run_.workers} workers but {worker.size} were started; "
            "start it with hvdscale launch"
        )


def root_logger(worker: WorkerInfo, name: str = "hvdscale train"):
    """print() on rank 0 (lines start with ``[name]``), nothing elsewhere."""
    if worker.is_root:
        return lambda msg: print(f"[{name}] {msg}", flush=True)
    return lambda msg: None


def describe_environment(
    worker: WorkerInfo, device_desc: str, chash: str, first_attempt: dict, framework: Framework
):
    """Every rank's host, device, cores (its CPU affinity after ``bind_cpus``) and
    CUDA_VISIBLE_DEVICES (the GPU ids its launcher, e.g. srun --gpus-per-task=1, bound; all ranks
    take part, one collective); rank 0 gets the environment block (with the framework's
    versions) and the system description now, so that writing the record at the end is
    quick. (None, None) on other ranks."""
    gathered = worker.allgather_object(
        (worker.hostname, device_desc, affinity(), cuda_visible_devices()), name="hosts"
    )  # HVD: allgather_object
    if not worker.is_root:
        return None, None
    hosts = [g[0] for g in gathered]
    # issue 13: rank 0 describes the system (CPU, GPUs, CUDA/cuDNN/NCCL, MPI, network,
    # nodes) now; never raises (what failed is in system.errors)
    system = system_block(hosts)
    versions = dict(framework.versions())
    environment = environment_block(
        config_hash=chash,
        hostnames=hosts,
        devices=[g[1] for g in gathered],
        cores=[g[2] for g in gathered],
        visible_gpus=[g[3] for g in gathered],
        tensorflow=versions.pop("tensorflow", "none"),
        horovod=versions.pop("horovod", "none"),
        started_utc=first_attempt["started_utc"],
    )
    environment.update(versions)
    return environment, system


def make_sampler(worker: WorkerInfo):
    return UtilisationSampler(interval_s=0.25) if worker.is_root else NullSampler()


def utilisation_block(sampler, earlier_samples: list) -> dict:
    return {
        "kind": sampler.kind,
        "interval_s": sampler.interval_s,
        "samples": earlier_samples + list(sampler.samples),
    }


# -------------------------------------------------- the command: hvdscale train


def add_train_arguments(p):
    p.add_argument(
        "--config",
        required=True,
        help="validated config snapshot as JSON (hvdscale write-config), "
        "e.g. results/config/full.json",
    )
    p.add_argument(
        "--run-id",
        required=True,
        help="run of the config's scaling matrix, e.g. local_gloo_n1_w2_b75_lrnone_r0",
    )
    p.add_argument(
        "--data-dir", required=True, help="data directory with manifest.json, e.g. results/data"
    )
    p.add_argument("--out-dir", required=True, help="run directory, e.g. results/runs/RUN_ID")
    p.add_argument(
        "--target",
        default=None,
        help="target.json of the study (results/scaling/target.json: mode, value): train "
        "until the validation loss reaches its value or a budget runs out; without it the "
        "budget (training.max_epochs, training.max_train_s) is trained",
    )
    p.add_argument(
        "--no-horovod",
        action="store_true",
        help="a Horovod-TF run as a single process without importing Horovod (debugging; "
        "workers must be 1); torch-ddp runs never import Horovod",
    )


def run_train(args) -> int:
    """Train one run: this is ONE rank of it (train env).

    Started N times by `hvdscale launch` (horovodrun, mpirun or srun for a Horovod run,
    torchrun or srun for a torch-ddp run); started directly it is a one-worker run. Reads the
    validated config snapshot (JSON), finds the run in its scaling matrix (the run id names
    the framework: horovod-tf unless it says torch-ddp), reads only this rank's part of the
    train, validation and test splits, trains the stress-strain network with Adam (weights
    and shuffle from the run's derived seed, hvdscale.matrix.runtable.run_seed) until the
    validation loss reaches the target of ``--target target.json`` or a budget
    (training.max_epochs, max_train_s) runs out, evaluates the test split once at the end,
    and writes (rank 0 only) OUT_DIR/metrics.json (the run record, validated against
    workflow/schemas/run.schema.json), OUT_DIR/history.csv, checkpoints in
    OUT_DIR/checkpoint/ (training.checkpoint_every_s) and, for Horovod with training.timeline
    (whole run) or training.timeline_steps (a window after the warm-up epochs),
    OUT_DIR/timeline.json (written by Horovod; the label proof reads it).

    Re-running the same command after a crash resumes from the last checkpointed epoch.
    Each rank writes OUT_DIR/.pids/rank-N.pid (diagnostics: which process is which rank)
    and OUT_DIR/.pids/rank-N.exit with its exit status.

    Exit status: 0 completed; 3 the loss became NaN/inf (a run record with status nan_loss
    is written); 4 stopped for the SLURM time limit (checkpoint written); 2 bad input
    (config, data, checkpoint), with a one-line message; 1 other errors.

    Examples (one rank, without a launcher; two torch-ddp ranks, as hvdscale launch
    starts them on one machine):
      hvdscale train --config results/runs/local_gloo_n1_w1_b75_lrnone_r0/config.json \\
          --run-id local_gloo_n1_w1_b75_lrnone_r0 --data-dir results/data \\
          --out-dir results/runs/local_gloo_n1_w1_b75_lrnone_r0
      torchrun --standalone --nproc-per-node 2 -m hvdscale.cli train \\
          --config results/runs/local_torch-ddp_gloo_n1_w2_b75_lrnone_r0/config.json \\
          --run-id local_torch-ddp_gloo_n1_w2_b75_lrnone_r0 --data-dir results/data \\
          --out-dir results/runs/local_torch-ddp_gloo_n1_w2_b75_lrnone_r0
    """
    return run(args, framework_for_run(args.run_id))
