"""The epoch loop: shuffle, run the epoch's steps, evaluate, reduce the metrics over the
ranks, record the epoch, stop on a non-finite loss, checkpoint."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from hvdscale import timelimit
from hvdscale.runrecord import epoch_entry
from hvdscale.train.checkpoint import Checkpointer, ResumeState
from hvdscale.train.metrics import EpochMetrics
from hvdscale.train.optim import Optimisation
from hvdscale.train.step import StepProgram
from hvdscale.worker import WorkerInfo


class NanLoss(Exception):
    pass


@dataclass
class LoopPlan:
    """What the loop runs, from the config and the data."""

    run_id: str
    epochs: int
    warmup_epochs: int
    steps: int  # per epoch and rank
    samples_per_epoch: int  # all ranks
    steps_per_execution: int
    instrument_every: int
    shuffle: bool
    seed: int

    @classmethod
    def from_config(cls, cfg: dict, run_id: str, steps: int, global_batch: int) -> LoopPlan:
        t = cfg["training"]
        return cls(
            run_id=run_id,
            epochs=t["epochs"],
            warmup_epochs=t["warmup_epochs"],
            steps=steps,
            samples_per_epoch=steps * global_batch,
            steps_per_execution=t["steps_per_execution"],
            instrument_every=t["instrument_every"],
            shuffle=t["shuffle"],
            seed=cfg["seed"],
        )


@dataclass
class LoopResult:
    status: str = "completed"  # or nan_loss
    error: str | None = None
    test_values: int | None = None  # test values of all ranks (last epoch)
    rank_sync_s: float = 0.0  # this rank's measured sync time over this attempt's epochs
    exit_code: int | None = None  # set when the run stops early (SLURM time limit)


def run_epoch_steps(program: StepProgram, perm: np.ndarray, steps: int, spe: int, k_inst: int):
    """One epoch's training steps, as ``hvdscale train`` runs them (also used by
    benchmarks/bench_train_overhead.py). Every ``k_inst``-th call of ``spe`` steps runs the
    timed variant. Returns (EpochTimer with steps/timed_steps, (loss_sum, phase sums
    [data, compute, sync, update] over the timed steps, launch overhead of the timed
    calls, wall time of the step loop)), all of this rank."""
    from hvdscale.timing import EpochTimer

    program.start_epoch(perm)
    timer = EpochTimer(steps=steps)
    t0 = time.perf_counter()
    done, call, host_data, call_wall = 0, 0, 0.0, 0.0
    while done < steps:
        n = min(spe, steps - done)
        if k_inst > 0 and call % k_inst == 0:  # timed call (k_inst 0: none, benchmarks only)
            tc = time.perf_counter()
            hd = program.run_steps(done, n, True)
            call_wall += time.perf_counter() - tc - hd
            host_data += hd
            timer.timed_steps += n
        else:
            program.run_steps(done, n, False)
        done += n
        call += 1
    t_train = time.perf_counter() - t0
    loss_sum, in_graph = program.epoch_results()
    dispatch = call_wall - float(in_graph.sum())
    phases = in_graph.copy()
    phases[0] += host_data  # host path: gathering and converting rows is data loading
    return timer, (loss_sum, phases, dispatch, t_train)


def train_epochs(
    program: StepProgram,
    worker: WorkerInfo,
    plan: LoopPlan,
    progress: ResumeState,
    checkpointer: Checkpointer,
    sampler,
    optim: Optimisation,
    log,
) -> LoopResult:
    """Run the remaining epochs; ``progress`` gets every epoch's record. A non-finite loss
    ends the loop with status nan_loss (on every rank: the losses are reduced)."""
    result = LoopResult()
    prev = progress.utilisation_samples
    sampler.offset_s = prev[-1][0] if prev else 0.0
    sampler.start()
    worker.barrier(name="train_start")  # HVD: every rank starts epoch timing together
    try:
        for epoch in range(progress.start_epoch, plan.epochs):
            m = _one_epoch(program, worker, plan, progress, sampler, optim, epoch, result, log)
            if not m.finite():
                raise NanLoss(
                    f"loss is not finite after epoch {epoch} (train {m.train_loss}, test "
                    f"{m.test_loss}); learning rate {optim.lr:g} is too large for "
                    "this configuration"
                )
            if worker.is_root:
                checkpointer.save(epoch, progress, prev + list(sampler.samples))
            worker.barrier(name=f"epoch_end_{epoch}")  # HVD: wait for the checkpoint
            if timelimit.stop_requested(worker, epoch, plan.epochs):  # SIGUSR1 before the limit
                result.exit_code = timelimit.stopped(
                    log, plan.run_id, epoch, checkpointer.out_dir, worker.is_root
                )
                break
    except NanLoss as exc:
        result.status, result.error = "nan_loss", str(exc)
        print(f"ERROR: {plan.run_id}: {exc}", file=sys.stderr, flush=True)
    finally:
        sampler.stop()
    return result


def _one_epoch(program, worker, plan, progress, sampler, optim, epoch, result, log):
    """Train, evaluate and reduce one epoch; append its record to ``progress``."""
    rng = np.random.default_rng([plan.seed, epoch, worker.rank])
    n = program.n_local
    perm = rng.permutation(n) if plan.shuffle else np.arange(n)
    u0 = sampler.now()
    t_epoch0 = time.perf_counter()
    timer, (loss_sum, phases, dispatch, t_train) = run_epoch_steps(
        program, perm, plan.steps, plan.steps_per_execution, plan.instrument_every
    )
    te0 = time.perf_counter()
    sse, nvals = program.test_sse()
    t_eval = time.perf_counter() - te0
    result.rank_sync_s += float(phases[2]) * plan.steps / max(timer.timed_steps, 1)
    local = EpochMetrics(loss_sum / plan.steps, sse, nvals, *phases, dispatch, t_train, t_eval)
    m = local.allreduce(worker, name=f"epoch_metrics_{epoch}")  # HVD: (one allreduce)
    result.test_values = int(m.test_values)
    wall = time.perf_counter() - t_epoch0
    progress.elapsed_s += wall
    rec = epoch_entry(
        epoch=epoch,
        warmup=epoch < plan.warmup_epochs,
        wall_s=wall,
        steps=plan.steps,
        samples=plan.samples_per_epoch,
        throughput=plan.samples_per_epoch / t_train,  # this rank's step loop
        timing=m.timer(plan.steps, timer.timed_steps, wall).record_fields(),
        train_loss=m.train_loss,
        test_loss=m.test_loss,
        elapsed_s=progress.elapsed_s,
        utilisation_mean=sampler.mean_between(u0, sampler.now()),
        learning_rate=optim.current_lr(),
        attempt=len(progress.attempts),
    )
    progress.history.append(rec)
    log(
        f"epoch {epoch}: {rec['wall_s']:.2f} s, {rec['throughput']:.0f} samples/s, train loss "
        f"{m.train_loss:.5g}, test loss {m.test_loss:.5g} (data {rec['time_data_s']:.3f} / "
        f"compute {rec['time_compute_s']:.3f} / sync {rec['time_sync_s']:.3f} / update "
        f"{rec['time_update_s']:.3f} s)"
    )
    return m
