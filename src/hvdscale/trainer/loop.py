"""The epoch loop: shuffle, run the epoch's steps, evaluate on the validation split,
reduce the metrics over the ranks, record the epoch, checkpoint, and stop at the target,
a budget or a non-finite loss; then evaluate the test split once."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from hvdscale.matrix.runid import run_kind
from hvdscale.record.build import epoch_entry, finite_or_none
from hvdscale.record.timing import PHASES, EpochTimer
from hvdscale.slurm import timelimit
from hvdscale.target import has_flattened
from hvdscale.trainer.checkpoint import Checkpointer, ResumeState
from hvdscale.trainer.metrics import EpochMetrics
from hvdscale.trainer.protocols import Optimiser, Steps
from hvdscale.trainer.worker import WorkerInfo
from hvdscale.workload.base import VAL_LOSS, Metric, workload_for


class NanLoss(Exception):
    pass


#: why a run's training loop ended (the record's target.stop_reason)
#: (flat: a calibration run that has flattened, training.target.calibration.until_flat)
STOP_REASONS = ("target", "flat", "max_epochs", "max_train_s", "nan_loss", "time_limit")


@dataclass
class TimelineWindow:
    """Horovod's timeline for ``steps`` steps from the start of ``epoch`` (issue 16 item
    6): hvd.start_timeline / hvd.stop_timeline (HOROVOD_TIMELINE=DYNAMIC, set before
    hvd.init), on every rank. None of it with one process without Horovod."""

    hvd: object
    path: str
    epoch: int
    steps: int
    done: bool = False

    def start(self) -> None:
        self.hvd.start_timeline(self.path)  # HVD: record the collectives from now on

    def stop(self) -> None:
        if not self.done:
            self.hvd.stop_timeline()  # HVD:
            self.done = True


@dataclass
class LoopPlan:
    """What the loop runs, from the config and the data."""

    run_id: str
    max_epochs: int
    warmup_epochs: int
    steps: int  # per epoch and rank
    samples_per_epoch: int  # all ranks
    steps_per_execution: int
    instrument_every: int
    shuffle: bool
    seed: int  # the run's seed (hvdscale.matrix.runtable.run_seed): weights and shuffle
    target: float | None = None  # validation-loss target (None: train the budget)
    stop_at_target: bool = True
    max_train_s: float | None = None
    timeline: TimelineWindow | None = None
    # a calibration run with until_flat: stop once flat after this many epochs (else None)
    flat_min_epochs: int | None = None
    # the workload's validation metric the target is on (a loss to go below, an accuracy
    # to reach; hvdscale.workload.base.Metric)
    metric: Metric = VAL_LOSS

    @classmethod
    def from_config(
        cls, cfg: dict, run_id: str, steps: int, global_batch: int, seed: int, target=None
    ) -> LoopPlan:
        t = cfg["training"]
        cal = (t.get("target") or {}).get("calibration") or {}
        flat = run_kind(run_id) == "cal" and cal.get("until_flat", False)
        return cls(
            run_id=run_id,
            max_epochs=t["max_epochs"],
            warmup_epochs=t["warmup_epochs"],
            steps=steps,
            samples_per_epoch=steps * global_batch,
            steps_per_execution=t["steps_per_execution"],
            instrument_every=t["instrument_every"],
            shuffle=t["shuffle"],
            seed=seed,
            target=target,
            stop_at_target=t["stop_at_target"],
            max_train_s=t["max_train_s"],
            flat_min_epochs=int(cal.get("min_epochs") or 0) if flat else None,
            metric=workload_for(cfg).metric,
        )

    @property
    def epochs(self) -> int:  # the budget (before issue 16: every run trained this many)
        return self.max_epochs

    def stop_reason(
        self, epoch: int, val_loss: float | None, elapsed_s: float, val_history=()
    ) -> str | None:
        """Whether to stop after ``epoch`` (the same on every rank: reduced values). Never
        at the target inside the warm-up epochs: a record needs one timed epoch for its
        epoch time (time to target still counts from the first crossing, flagged as in
        the warm-up by the aggregation). ``val_loss``: the value of the plan's metric (the
        validation loss, or a classifier's validation accuracy). ``val_history``: the
        validation losses of every epoch so far, this one included (a calibration run's
        flat rule reads them)."""
        if (
            self.stop_at_target
            and self.target is not None
            and val_loss is not None
            and self.metric.reached(val_loss, self.target)
            and epoch >= self.warmup_epochs
        ):
            return "target"
        if self.flat_min_epochs is not None and has_flattened(val_history, self.flat_min_epochs):
            return "flat"
        if epoch + 1 >= self.max_epochs:
            return "max_epochs"
        if self.max_train_s is not None and elapsed_s >= self.max_train_s:
            return "max_train_s"
        return None


@dataclass
class LoopResult:
    status: str = "completed"  # or nan_loss
    error: str | None = None
    test_values: int | None = None  # test values of all ranks (the final evaluation)
    rank_sync_s: float = 0.0  # this rank's measured sync time over this attempt's epochs
    exit_code: int | None = None  # set when the run stops early (SLURM time limit)
    stop_reason: str | None = None


def run_epoch_steps(
    program: Steps,
    perm: np.ndarray,
    steps: int,
    spe: int,
    k_inst: int,
    timeline: TimelineWindow | None = None,
):
    """One epoch's training steps, as ``hvdscale train`` runs them (also used by
    benchmarks/bench_train_overhead.py). Every ``k_inst``-th call of ``spe`` steps runs the
    timed variant. ``timeline``: the epoch's first ``timeline.steps`` steps run in plain
    calls under Horovod's timeline (not counted as timed or plain). Returns (EpochTimer
    with steps/timed_steps and the calls by kind, (loss_sum, phase sums [data, compute,
    sync, update] over the timed steps, launch overhead of the timed calls, wall time of
    the step loop)), all of this rank."""
    program.start_epoch(perm)
    timer = EpochTimer(steps=steps)
    tl_left = timeline.steps if timeline is not None else 0
    if tl_left:
        timeline.start()
    t0 = time.perf_counter()
    done, call, host_data, call_wall = 0, 0, 0.0, 0.0
    while done < steps:
        n = min(spe, steps - done, tl_left or spe)
        timed = not tl_left and k_inst > 0 and call % k_inst == 0  # k_inst 0: benchmarks
        tc = time.perf_counter()
        hd = program.run_steps(done, n, timed)
        wall = time.perf_counter() - tc
        if tl_left:
            timer.add_call("timeline", n, wall)
            tl_left -= n
            if not tl_left:
                timeline.stop()
        else:
            timer.add_call("timed" if timed else "plain", n, wall)
            call += 1
        if timed:
            call_wall += wall - hd
            host_data += hd
            timer.timed_steps += n
        done += n
    t_train = time.perf_counter() - t0
    if timeline is not None:
        timeline.stop()
    loss_sum, in_graph = program.epoch_results()
    # in_graph: the four phases and the noise-scale sums, which belong to no phase
    dispatch = call_wall - float(in_graph.sum())
    phases = in_graph[: len(PHASES)].copy()
    phases[0] += host_data  # host path: gathering and converting rows is data loading
    return timer, (loss_sum, phases, dispatch, t_train)


def train_epochs(
    program: Steps,
    worker: WorkerInfo,
    plan: LoopPlan,
    progress: ResumeState,
    checkpointer: Checkpointer,
    sampler,
    optim: Optimiser,
    log,
) -> LoopResult:
    """Run epochs until the validation loss reaches the target or a budget runs out;
    ``progress`` gets every epoch's record. A non-finite loss ends the loop with status
    nan_loss (on every rank: the losses are reduced). Then (not after a time-limit stop)
    the test split is evaluated once, into the last epoch's ``test_loss``."""
    result = LoopResult()
    prev = progress.utilisation_samples
    sampler.offset_s = prev[-1][0] if prev else 0.0
    sampler.start()
    worker.barrier(name="train_start")  # HVD: every rank starts epoch timing together
    try:
        result.stop_reason = _resumed_stop(plan, progress)
        epoch = progress.start_epoch
        while result.stop_reason is None:
            m = _one_epoch(program, worker, plan, progress, sampler, optim, epoch, result, log)
            if not m.finite():
                raise NanLoss(
                    f"loss is not finite after epoch {epoch} (train {m.train_loss}, validation "
                    f"{m.val_loss}); learning rate {optim.lr:g} is too large for "
                    "this configuration"
                )
            result.stop_reason = plan.stop_reason(
                epoch, _metric_value(plan, m), m.elapsed, _val_history(progress)
            )
            if result.stop_reason is None and timelimit.stop_requested(
                worker, epoch, plan.max_epochs
            ):  # SIGUSR1 before the limit
                result.stop_reason = "time_limit"
            if worker.is_root and checkpointer.due(last_epoch=result.stop_reason is not None):
                checkpointer.save(epoch, progress, prev + list(sampler.samples))
            worker.barrier(name=f"epoch_end_{epoch}")  # HVD: wait for the checkpoint
            if result.stop_reason == "time_limit":
                result.exit_code = timelimit.stopped(
                    log, plan.run_id, epoch, checkpointer.out_dir, worker.is_root
                )
            epoch += 1
    except NanLoss as exc:
        result.status, result.error = "nan_loss", str(exc)
        result.stop_reason = "nan_loss"
        print(f"ERROR: {plan.run_id}: {exc}", file=sys.stderr, flush=True)
    finally:
        sampler.stop()
    if result.stop_reason != "time_limit" and result.status == "completed":
        _final_test(program, worker, progress, result, log)
    return result


def _resumed_stop(plan: LoopPlan, progress: ResumeState) -> str | None:
    """A resumed run whose checkpointed epochs already end it (the decision of its last
    epoch, from the recorded values; the same on every rank: rank 0 broadcast them)."""
    if not progress.history:
        return None
    last = progress.history[-1]
    val = last.get(plan.metric.key)
    return plan.stop_reason(last["epoch"], val, last["elapsed_s"], _val_history(progress))


def _val_history(progress: ResumeState) -> list:
    """Every recorded epoch's validation loss (all attempts), in order."""
    return [h.get("val_loss") for h in progress.history]


def _final_test(program, worker, progress, result, log) -> None:
    """The one test evaluation, after the stop decision (never used for any decision)."""
    sse, nvals = program.test_sse()
    tot = worker.allreduce(np.asarray([sse, nvals], np.float64), op="sum", name="final_test")
    result.test_values = int(tot[1])  # HVD: (one allreduce)
    loss = float(tot[0] / tot[1]) if tot[1] > 0 else float("nan")
    correct = _correct(program, "test")
    if progress.history:
        progress.history[-1]["test_loss"] = finite_or_none(loss)
    if correct is not None:  # HVD: (one allreduce)
        hits = worker.allreduce(np.asarray([correct], np.float64), op="sum", name="final_test_acc")
        acc = float(hits[0] / tot[1]) if tot[1] > 0 else float("nan")
        if progress.history:
            progress.history[-1]["test_accuracy"] = finite_or_none(acc)
        log(f"final test accuracy {acc:.4f}")
    log(f"final test loss {loss:.5g} (evaluated once, after the stop decision)")


def _metric_value(plan: LoopPlan, m: EpochMetrics) -> float:
    """The epoch's value of the plan's metric (validation loss or accuracy)."""
    return m.val_accuracy if plan.metric.key == "val_accuracy" else m.val_loss


def _correct(program, split: str) -> float | None:
    """A classifier's correct predictions of its last evaluation of ``split`` (None for
    a regression: its records keep the fields they had)."""
    if getattr(program, "loss_name", "mse") != "cross_entropy":
        return None
    return float(program.eval_correct[split])


def _sync_fields(program) -> dict:
    """A step program's per-epoch samples for ``timing.sync`` (torch-ddp's
    ``sync_fields``: its comm-hook and no-communication step times); none for Horovod,
    whose sync phase is all the record needs."""
    fields = getattr(program, "sync_fields", None)
    return fields() if fields is not None else {}


def _one_epoch(program, worker, plan, progress, sampler, optim, epoch, result, log):
    """Train, evaluate (validation) and reduce one epoch; append its record to ``progress``."""
    rng = np.random.default_rng([plan.seed, epoch, worker.rank])
    n = program.n_local
    perm = rng.permutation(n) if plan.shuffle else np.arange(n)
    u0 = sampler.now()
    t_epoch0 = time.perf_counter()
    tl = plan.timeline if plan.timeline is not None and plan.timeline.epoch == epoch else None
    timer, (loss_sum, phases, dispatch, t_train) = run_epoch_steps(
        program, perm, plan.steps, plan.steps_per_execution, plan.instrument_every, tl
    )
    te0 = time.perf_counter()
    sse, nvals = program.val_sse()
    correct = _correct(program, "val")
    t_eval = time.perf_counter() - te0
    train_s = timer.headline_train_s(t_train)
    excess = t_train - train_s  # instrumentation (and timeline) time, out of the headline
    result.rank_sync_s += float(phases[2]) * plan.steps / max(timer.timed_steps, 1)
    gsq = program.grad_sq()
    elapsed = progress.elapsed_s + time.perf_counter() - t_epoch0 - excess
    local = EpochMetrics(
        loss_sum / plan.steps, sse, nvals, *phases, dispatch, t_train, t_eval, *gsq, elapsed,
        correct or 0.0,
    )  # fmt: skip
    m = local.allreduce(worker, name=f"epoch_metrics_{epoch}")  # HVD: (one allreduce)
    measured = time.perf_counter() - t_epoch0
    wall = measured - excess
    progress.elapsed_s += wall
    rec = epoch_entry(
        epoch=epoch,
        warmup=epoch < plan.warmup_epochs,
        wall_s=wall,
        steps=plan.steps,
        samples=plan.samples_per_epoch,
        throughput=plan.samples_per_epoch / train_s,  # this rank's step loop
        timing=m.timer(plan.steps, timer.timed_steps, wall).record_fields(),
        train_loss=m.train_loss,
        val_loss=m.val_loss,
        test_loss=None,  # evaluated once, at the end (train_epochs)
        elapsed_s=progress.elapsed_s,
        utilisation_mean=sampler.mean_between(u0, sampler.now()),
        learning_rate=optim.current_lr(),
        attempt=len(progress.attempts),
        extra={
            "wall_measured_s": round(measured, 6),
            **timer.instrumentation_fields(),
            **m.noise_fields(),
            **_sync_fields(program),
            **({"val_accuracy": finite_or_none(m.val_accuracy)} if correct is not None else {}),
        },
    )
    progress.history.append(rec)
    log(
        f"epoch {epoch}: {rec['wall_s']:.2f} s, {rec['throughput']:.0f} samples/s, train loss "
        f"{m.train_loss:.5g}, val loss {m.val_loss:.5g} (data {rec['time_data_s']:.3f} / "
        f"compute {rec['time_compute_s']:.3f} / sync {rec['time_sync_s']:.3f} / update "
        f"{rec['time_update_s']:.3f} s)"
    )
    return m
