"""Train one run: this is ONE rank of a Horovod job (train env).

Started N times by `hvdscale launch` (horovodrun, mpirun or srun); started directly it
is a one-worker run. Reads the validated config snapshot (JSON), finds the run in its
scaling matrix, reads only this rank's part of the train, validation and test splits,
trains the stress-strain network with Adam and Horovod (weights and shuffle from the
run's derived seed, hvdscale.matrix.runtable.run_seed) until the validation loss reaches the
target of ``--target target.json`` or a budget (training.max_epochs, max_train_s) runs
out, evaluates the test split once at the end, and writes (rank 0 only)
OUT_DIR/metrics.json (the run record, validated against workflow/schemas/run.schema.json),
OUT_DIR/history.csv, checkpoints in OUT_DIR/checkpoint/ (training.checkpoint_every_s) and, with
training.timeline (whole run) or training.timeline_steps (a window after the warm-up
epochs), OUT_DIR/timeline.json (written by Horovod; the label proof reads it).

Re-running the same command after a crash resumes from the last checkpointed epoch.
Each rank writes OUT_DIR/.pids/rank-N.pid (diagnostics: which process is which rank).

Exit status: 0 completed; 3 the loss became NaN/inf (a run record with status nan_loss
is written); 2 bad input (config, data, checkpoint), with a one-line message; 1 other
errors.

Example (one rank, without a launcher):
  hvdscale train --config results/config/runs/local_gloo_n1_w1_b75_lrnone_r0.json \\
      --run-id local_gloo_n1_w1_b75_lrnone_r0 --data-dir results/data \\
      --out-dir results/runs/local_gloo_n1_w1_b75_lrnone_r0

Layout of the package: device (rank detection, CPU binding, device pinning), data (row
planning, reading, normalisation, steps per epoch), checkpoint (find/save, ResumeState),
optim (model, optimizer, LR schedule), step (the compiled step: a clock and a batch
source), metrics (EpochMetrics and its allreduce), loop (the epochs), fault (test-only
delay hook), main (command line and the top-level function). The run record is built by
hvdscale.record.build. Nothing here imports TensorFlow or Horovod at module level.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

from hvdscale.errors import UserError
from hvdscale.launch import timelimit
from hvdscale.matrix.config import config_hash, load_config
from hvdscale.matrix.runtable import find_run
from hvdscale.record.build import (
    EXIT_NAN,
    build_record,
    environment_block,
    system_block,
    utc_now,
    write_run_outputs,
)
from hvdscale.record.labelproof import prove
from hvdscale.record.timing import timeline_check
from hvdscale.trainer.checkpoint import Checkpointer
from hvdscale.trainer.data import load_rank_data
from hvdscale.trainer.device import bind_cpus, pin_device
from hvdscale.trainer.fault import FaultDelay
from hvdscale.trainer.horovod_tf.optim import Optimisation
from hvdscale.trainer.horovod_tf.step import build_step_program
from hvdscale.trainer.loop import LoopPlan, TimelineWindow, train_epochs
from hvdscale.trainer.utilisation import NullSampler, UtilisationSampler
from hvdscale.trainer.worker import WorkerInfo, detect_launcher, launcher_rank_env


def add_arguments(p):
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
        help="run as a single process without importing Horovod (debugging; workers must be 1)",
    )


def run(args) -> int:
    """Run one rank; leave OUT_DIR/.pids/rank-N.exit with the exit status (diagnostics:
    a rank without it was killed or crashed hard)."""
    # a launcher's SIGTERM (clean-up after another rank failed) ends this rank through
    # the normal exit path, so the exit marker says "143" and not "killed"
    on_term = lambda *_: sys.exit(143)  # noqa: E731
    return run_rank(args, launcher_rank_env()["rank"], train_rank, on_term)


def run_rank(args, rank: int, train, on_term) -> int:
    """The rank's frame, for both frameworks: pid file, orphan watchdog, SIGTERM
    handler ``on_term``, the SIGUSR1 time-limit stop, then ``train(args, out_dir)``;
    OUT_DIR/.pids/rank-N.exit gets the exit status however it ends."""
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_pid_file(out_dir, rank)
    start_orphan_watchdog()
    signal.signal(signal.SIGTERM, on_term)
    timelimit.install()  # SIGUSR1 before the SLURM time limit: checkpoint, exit 4
    code = 1
    try:
        code = train(args, out_dir)
        return code
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        raise
    except UserError:
        code = 2
        raise
    finally:
        try:
            (out_dir / ".pids" / f"rank-{rank}.exit").write_text(f"{code}\n")
        except OSError:
            pass


def train_rank(args, out_dir: Path) -> int:
    """Train this rank's part of the run; rank 0 writes the run record. Exit status.
    The recipe, in the order of Horovod's TF2 examples: bind the CPUs, hvd.init(), pin the
    device, read the rank's data, build the model, resume or broadcast, train, record."""
    cfg = load_config(args.config)
    run_ = find_run(cfg, args.run_id)
    tcfg = cfg["training"]
    started_utc = utc_now()

    target = read_target(args.target)
    seed = run_.seed  # run_seed(config seed, repeat, kind)
    bound = bind_cpus(tcfg.get("cpu_binding", "auto"))  # before any thread exists
    dynamic_timeline(tcfg, args.no_horovod)  # before hvd.init
    worker = WorkerInfo.init(use_horovod=not args.no_horovod)  # HVD: hvd.init() first
    device, device_desc = pin_device(worker, tcfg["threads_per_worker"])  # HVD: one per rank
    check_worker_count(run_, worker)
    log = root_logger(worker)
    log(
        f"{run_.run_id}: {worker.size} worker(s), controller {worker.controller}, {device_desc}"
        + (f", bound to cores {bound}" if bound else "")
    )
    fault = announce_fault(FaultDelay.from_env())

    data = load_rank_data(Path(args.data_dir), cfg, worker, run_.batch)
    optim = Optimisation.build(cfg, run_.lr_rule, worker.size, data.steps, seed)
    chash = config_hash(cfg)
    checkpointer = Checkpointer.for_run(
        out_dir, optim.checkpoint(), run_.run_id, chash, worker.size, seed, tcfg
    )
    progress = checkpointer.restore(worker, log)  # HVD: rank 0 reads, then broadcasts
    optim.broadcast(worker)  # HVD: rank 0's weights and optimizer state everywhere
    if not progress.history and worker.is_root:  # a fresh start: the initial weights
        progress.initial_weights_sha256 = optim.weights_sha256()
    progress.begin_attempt(started_utc)
    environment, system = describe_environment(worker, device_desc, chash, progress.attempts[0])

    program = build_step_program(
        optim.model, optim.optimizer, worker, tcfg, train=(data.x_train, data.y_train),
        test=(data.x_test, data.y_test), val=(data.x_val, data.y_val), batch=run_.batch,
        device=device, fault=fault,
    )  # fmt: skip
    data.release()
    program.warm_up(tcfg["steps_per_execution"])
    plan = LoopPlan.from_config(
        cfg, run_.run_id, data.steps, run_.batch * worker.size, seed, target["value"]
    )
    plan.timeline = timeline_window(worker, tcfg, out_dir, progress.start_epoch)
    sampler = make_sampler(worker)
    result = train_epochs(program, worker, plan, progress, checkpointer, sampler, optim, log)

    shutdown(worker)
    if result.exit_code is not None:  # stopped before the time limit: the retry resumes
        return result.exit_code
    if not worker.is_root:
        # exit 0 even after nan_loss: a non-zero exit would make the launcher kill rank 0
        # while it writes the record; rank 0's exit status speaks for the job
        return 0
    record = run_record(
        run_,
        cfg,
        worker,
        optim,
        data,
        progress,
        result,
        sampler,
        fault,
        environment,
        system,
        seed=seed,
        target=target,
    )
    timeline = out_dir / "timeline.json"
    record["label_proof"] = prove(record, timeline if timeline.is_file() else None)
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
    fault,
    environment,
    system=None,
    *,
    seed=None,
    target=None,
) -> dict:
    """Rank 0's run record from the objects of the run."""
    env = os.environ.get("HOROVOD_TIMELINE")
    timeline = Path(env) if env and env != "DYNAMIC" else None  # training.timeline
    return build_record(
        run=run_,
        cfg=cfg,
        workers=worker.size,
        controller=worker.controller,
        launcher=detect_launcher(),
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
        fault_delay=fault.describe(),
        system=system,
        seed=seed,
        kind=getattr(run_, "kind", ""),
        target=target,
        stop_reason=result.stop_reason,
        initial_weights_sha256=progress.initial_weights_sha256,
    )


def read_target(path) -> dict:
    """The study's validation-loss target from target.json ({"mode", "value", ...}); no
    file: {"value": None, "mode": "none"} (train the budget)."""
    if path is None:
        return {"value": None, "mode": "none"}
    import json
    import math

    try:
        t = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"--target {path}: cannot read the target file ({exc})") from None
    value = t.get("value") if isinstance(t, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(
            f"--target {path}: key 'value' must be a finite number (a validation loss); "
            f"got {value!r}"
        )
    if value <= 0:
        raise UserError(f"--target {path}: key 'value' must be > 0; got {value!r}")
    return {"value": float(value), "mode": str(t.get("mode", "absolute"))}


def dynamic_timeline(tcfg: dict, no_horovod: bool) -> None:
    """HOROVOD_TIMELINE=DYNAMIC (before hvd.init) lets the run record a timeline window
    with hvd.start_timeline (training.timeline_steps); a whole-run timeline
    (training.timeline, set by the launcher) is left alone."""
    if tcfg["timeline_steps"] > 0 and not no_horovod and not os.environ.get("HOROVOD_TIMELINE"):
        os.environ["HOROVOD_TIMELINE"] = "DYNAMIC"


def timeline_window(worker: WorkerInfo, tcfg: dict, out_dir: Path, start_epoch: int):
    """OUT_DIR/timeline.json for training.timeline_steps steps from the first epoch after
    the warm-up epochs (this attempt's first epoch if it starts later; the last epoch if
    every epoch is warm-up), or None (off, no Horovod, or a whole-run timeline)."""
    if worker.hvd is None or os.environ.get("HOROVOD_TIMELINE") != "DYNAMIC":
        return None
    epoch = min(max(tcfg["warmup_epochs"], start_epoch), tcfg["max_epochs"] - 1)
    return TimelineWindow(worker.hvd, str(out_dir / "timeline.json"), epoch, tcfg["timeline_steps"])


def check_worker_count(run_, worker: WorkerInfo) -> None:
    if worker.size != run_.workers:
        raise UserError(
            f"run {run_.run_id} needs {run_.workers} workers but {worker.size} were started; "
            "start it with hvdscale launch"
        )


def root_logger(worker: WorkerInfo):
    """print() on rank 0, nothing elsewhere."""
    if worker.is_root:
        return lambda msg: print(f"[hvdscale train] {msg}", flush=True)
    return lambda msg: None


def announce_fault(fault: FaultDelay) -> FaultDelay:
    if fault.active:
        print(
            f"hvdscale train: WARNING: fault injection {fault.describe()} s per step "
            "(HVDSCALE_FAULT_DELAY; test only): the timings of this run are not results",
            file=sys.stderr,
            flush=True,
        )
    return fault


def describe_environment(worker: WorkerInfo, device_desc: str, chash: str, first_attempt: dict):
    """Every rank's host and device (all ranks take part); rank 0 gets the environment
    block and the system description now, so that writing the record at the end is
    quick. (None, None) on other ranks."""
    gathered = worker.allgather_object(
        (worker.hostname, device_desc), name="hosts"
    )  # HVD: allgather_object
    if not worker.is_root:
        return None, None
    import tensorflow as tf

    # issue 13: rank 0 describes the system (CPU, GPUs, CUDA/cuDNN/NCCL, MPI, network,
    # nodes) now; never raises (what failed is in system.errors)
    system = system_block([h for h, _ in gathered])
    environment = environment_block(
        config_hash=chash,
        hostnames=[h for h, _ in gathered],
        devices=[d for _, d in gathered],
        tensorflow=tf.__version__,
        horovod=_horovod_version(),
        started_utc=first_attempt["started_utc"],
    )
    return environment, system


def make_sampler(worker: WorkerInfo):
    return UtilisationSampler(interval_s=0.25) if worker.is_root else NullSampler()


def utilisation_block(sampler, earlier_samples: list) -> dict:
    return {
        "kind": sampler.kind,
        "interval_s": sampler.interval_s,
        "samples": earlier_samples + list(sampler.samples),
    }


def shutdown(worker: WorkerInfo) -> None:
    worker.barrier(name="train_end")  # HVD:
    if worker.hvd is not None:
        worker.hvd.shutdown()  # HVD: flush the timeline before rank 0 reads it


def _horovod_version() -> str:
    try:
        import horovod

        return horovod.__version__
    except ImportError:
        return "none"


def write_pid_file(out_dir: Path, rank: int) -> None:
    d = out_dir / ".pids"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"rank-{rank}.pid").write_text(f"{os.getpid()}\n")


def start_orphan_watchdog(interval_s: float = 1.0) -> None:
    """Exit if the launcher that started this rank dies (e.g. SIGKILL of its process group).

    A rank whose parent (mpirun, the horovodrun task shell, slurmstepd) disappears would
    otherwise keep training as an orphan and race a restarted run for the checkpoint.
    """
    if os.environ.get("HVDSCALE_ORPHAN_WATCHDOG", "1") == "0":
        return
    parent = os.getppid()
    if parent <= 1:
        return

    def watch():
        while True:
            time.sleep(interval_s)
            if os.getppid() != parent:
                print(
                    f"hvdscale train: the launcher (pid {parent}) is gone; exiting",
                    file=sys.stderr,
                    flush=True,
                )
                os._exit(70)

    threading.Thread(target=watch, name="orphan-watchdog", daemon=True).start()
