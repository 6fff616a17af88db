"""Train one run: this is ONE rank of a Horovod job (train env).

Started N times by `hvdscale launch` (horovodrun, mpirun or srun); started directly it
is a one-worker run. Reads the validated config snapshot (JSON), finds the run in its
scaling matrix, reads only this rank's part of the train split and of the test split,
trains the stress-strain network with Adam and Horovod, and writes (rank 0 only)
OUT_DIR/metrics.json (the run record, validated against workflow/schemas/run.schema.json),
OUT_DIR/history.csv, a checkpoint per epoch in OUT_DIR/checkpoint/ and, with
training.timeline, OUT_DIR/timeline.json (written by Horovod).

Re-running the same command after a crash resumes from the last completed epoch.
Each rank writes OUT_DIR/.pids/rank-N.pid (diagnostics: which process is which rank).

Exit status: 0 completed; 3 the loss became NaN/inf (a run record with status nan_loss
is written); 2 bad input (config, data, checkpoint), with a one-line message; 1 other
errors.

Example (one rank, without a launcher):
  hvdscale train --config results/config/runs/local_gloo_n1_w1_b75_lrnone_r0.json \\
      --run-id local_gloo_n1_w1_b75_lrnone_r0 --data-dir results/data \\
      --out-dir results/runs/local_gloo_n1_w1_b75_lrnone_r0
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from hvdscale.common import EXIT_NAN
from hvdscale.config import config_hash, find_run, learning_rate_for, load_config
from hvdscale.errors import DataError, UserError
from hvdscale.io import write_json_atomic, write_text_atomic
from hvdscale.worker import WorkerInfo, detect_launcher, launcher_rank_env

EVAL_BATCH = 4096


class NanLoss(Exception):
    pass


def add_arguments(p):
    p.add_argument(
        "--config",
        required=True,
        help="validated config snapshot as JSON (hvdscale write-config), e.g. results/config/full.json",
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
        "--no-horovod",
        action="store_true",
        help="run as a single process without importing Horovod (debugging; workers must be 1)",
    )


# =========================================================================== helpers


def plan_rows(
    counts: list[int], workers: int, rank: int, policy: str, what: str = "train"
) -> list[tuple[int, int, int]]:
    """This rank's part of a split: [(shard index, first row, end row), ...].

    ``whole`` (or ``auto`` when the shard count is divisible by the workers): every rank
    gets shards_per_rank whole consecutive shards. ``slices`` (or ``auto`` otherwise): the
    split's samples in shard order are cut into ``workers`` contiguous ranges of equal
    size (+-1), each rank reading only the shard rows of its range.
    """
    n = len(counts)
    if policy not in ("auto", "whole", "slices"):
        raise UserError(
            f"config key training.shard_policy: got {policy!r}; expected auto, whole or slices"
        )
    if policy == "whole" or (policy == "auto" and n % workers == 0):
        if n % workers:
            raise DataError(
                f"{what} split: {n} shard(s) cannot be divided among {workers} workers as whole shards "
                f"(training.shard_policy 'whole'); make data.split_shards.{what} a multiple of {workers} "
                "or set training.shard_policy to 'auto' or 'slices'"
            )
        k = n // workers
        return [(i, 0, counts[i]) for i in range(rank * k, (rank + 1) * k)]
    total = sum(counts)
    a, b = total * rank // workers, total * (rank + 1) // workers
    out, off = [], 0
    for i, c in enumerate(counts):
        lo, hi = max(a, off), min(b, off + c)
        if lo < hi:
            out.append((i, lo - off, hi - off))
        off += c
    return out


def read_rows(data_dir: Path, entries: list[dict], plan: list[tuple[int, int, int]], n_points: int):
    """Read the planned rows (whole shards via h5.read_shards, else row ranges)."""
    from hvdscale.data import h5

    if plan and all(lo == 0 and hi == entries[i]["n_samples"] for i, lo, hi in plan):
        return h5.read_shards([data_dir / entries[i]["file"] for i, _, _ in plan], n_points)
    total = sum(hi - lo for _, lo, hi in plan)
    curves = np.empty((total, n_points, 3), dtype=np.float32)
    labels = np.empty((total, 2), dtype=np.float32)
    ids = np.empty(total, dtype=np.int64)
    at = 0
    for i, lo, hi in plan:
        path = data_dir / entries[i]["file"]
        m = hi - lo
        with h5.open_h5(path) as fh:
            n = h5.check_layout(fh, path, n_points)
            if hi > n:
                raise DataError(f"{path}: {n} samples; rows {lo}..{hi - 1} needed")
            sel = np.s_[at : at + m]
            fh["curves"].read_direct(curves, source_sel=np.s_[lo:hi], dest_sel=sel)
            fh["labels"].read_direct(labels, source_sel=np.s_[lo:hi], dest_sel=sel)
            fh["sample_id"].read_direct(ids, source_sel=np.s_[lo:hi], dest_sel=sel)
        h5.check_finite(path, curves[at : at + m], labels[at : at + m], ids[at : at + m])
        at += m
    return curves, labels, ids


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


def local_rank_and_size() -> tuple[int, int]:
    """This process's local rank and the number of ranks on its node, from the launcher's
    environment (before hvd.init(); 0, 1 when started directly)."""
    env = os.environ
    for rk, sk in (
        ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
        ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
        ("SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"),
    ):
        if rk in env and sk in env:
            try:
                return int(env[rk]), int(env[sk].split("(")[0].split(",")[0])
            except ValueError:
                continue
    return 0, 1


def bind_cpus(
    policy: str, local_rank: int | None = None, local_size: int | None = None
) -> list[int] | None:
    """Pin this rank (and every thread it starts later: TensorFlow's pools, Horovod's
    background thread, the MPI/Gloo progress threads) to its own share of the node's cores.

    ``core``: the cores this process may use are cut into ``local_size`` equal consecutive
    groups and the rank takes group ``local_rank`` (with more ranks than cores, core
    local_rank mod cores). A rank that the launcher already bound (its allowed cores are
    fewer than the node's) is left as it is. ``none``: leave placement to the OS. ``auto``: ``core`` when
    the node runs more than one rank and at least one core per rank, else ``none``.
    Must run before hvd.init() and before any TensorFlow op (threads inherit the mask).
    Returns the cores bound to, or None when not bound.
    """
    if policy not in ("auto", "none", "core"):
        raise UserError(
            f"config key training.cpu_binding: got {policy!r}; expected auto, none or core"
        )
    if policy == "none" or not hasattr(os, "sched_setaffinity"):
        return None
    lr, ls = local_rank_and_size()
    lr = lr if local_rank is None else local_rank
    ls = ls if local_size is None else local_size
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < (os.cpu_count() or len(cores)):
        return None  # the launcher already bound this rank (srun --cpu-bind, mpirun --bind-to): keep it
    if policy == "auto" and not (1 < ls <= len(cores)):
        return None
    if ls <= len(cores):
        k = len(cores) // max(ls, 1)
        mine = cores[lr * k : (lr + 1) * k]
    else:
        mine = [cores[lr % len(cores)]]
    if not mine:
        return None
    os.sched_setaffinity(0, mine)
    return mine


def pin_device(worker: WorkerInfo, threads: int) -> tuple[str, str]:
    """One device per local rank; thread pools sized before any TensorFlow op runs.

    Returns (TF device string, description for the record).
    """
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        if worker.local_rank >= len(gpus):
            raise UserError(
                f"rank {worker.rank}: local rank {worker.local_rank} but only {len(gpus)} GPU(s) "
                "on this node; start one worker per GPU"
            )
        gpu = gpus[worker.local_rank]  # HVD: one GPU per local rank
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")  # HVD: pin the rank to its GPU
        try:
            name = tf.config.experimental.get_device_details(gpu).get("device_name", "GPU")
        except Exception:
            name = "GPU"
        return "/GPU:0", f"GPU:{worker.local_rank} ({name})"
    tf.config.set_visible_devices([], "GPU")
    return "/CPU:0", f"CPU ({threads} thread{'s' if threads > 1 else ''})"


# =========================================================================== checkpoints


def checkpoint_dir(out_dir: Path) -> Path:
    return out_dir / "checkpoint"


def find_checkpoint(out_dir: Path) -> tuple[Path, dict] | None:
    """The newest complete checkpoint (directory, state) or None."""
    ck = checkpoint_dir(out_dir)
    if not ck.is_dir():
        return None
    candidates = []
    latest = ck / "LATEST"
    if latest.is_file():
        candidates.append(ck / latest.read_text().strip())
    candidates += sorted((p for p in ck.glob("epoch-*") if p.is_dir()), reverse=True)
    for d in candidates:
        try:
            state = json.loads((d / "state.json").read_text())
            if (d / "weights.index").is_file():
                return d, state
        except (OSError, ValueError):
            continue
    return None


def save_checkpoint(out_dir: Path, ckpt, state: dict) -> Path:
    """Write weights + optimizer state + state.json into a temporary directory, fsync,
    rename it to checkpoint/epoch-NNNN (atomic), then point LATEST at it."""
    ck = checkpoint_dir(out_dir)
    ck.mkdir(parents=True, exist_ok=True)
    name = f"epoch-{state['epoch']:04d}"
    tmp = ck / f".tmp-{name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    ckpt.write(str(tmp / "weights"))
    write_json_atomic(tmp / "state.json", state)
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    final = ck / name
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    dfd = os.open(ck, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    write_text_atomic(ck / "LATEST", name + "\n")
    for old in ck.iterdir():  # older checkpoints and leftovers of killed writers
        if old.name != name and (old.name.startswith("epoch-") or old.name.startswith(".tmp-")):
            shutil.rmtree(old, ignore_errors=True)
    return final


# =========================================================================== the step


class StepProgram:
    """The compiled training step(s) and evaluation of one rank.

    ``steps(n)`` runs n optimizer steps (micro-batches) in one graph execution. The timed
    variant carries tf.timestamp() ops at the phase boundaries (see hvdscale.timing).
    Every Horovod-specific line is marked ``# HVD:``.
    """

    def __init__(
        self,
        *,
        model,
        optimizer,
        worker: WorkerInfo,
        x_train,
        y_train,
        x_test,
        y_test,
        batch: int,
        device: str,
        in_device_memory: bool,
        compression: str,
        backward_passes_per_step: int,
    ):
        import tensorflow as tf

        self.tf = tf
        self.model = model
        self.opt = optimizer
        self.worker = worker
        self.batch = int(batch)
        self.device = device
        self.on_gpu = "GPU" in device
        self.in_device_memory = in_device_memory
        self.bpps = int(backward_passes_per_step)
        self.vars = model.trainable_variables
        self.n_local = len(x_train)
        hvd = worker.hvd
        self.compression = None
        if hvd is not None:
            self.compression = (
                hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
            )  # HVD:

        with tf.device(device):
            self.loss_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="loss_sum")
            self.timers = tf.Variable(
                tf.zeros([4], tf.float64), trainable=False, name="phase_timers"
            )
            self.cursor = tf.Variable(0, dtype=tf.int32, trainable=False, name="cursor")
            if in_device_memory:
                # the rank's shard as device tensors; batches are gathered inside the step
                self.x_train = tf.constant(x_train)
                self.y_train = tf.constant(y_train)
                self.perm = tf.Variable(
                    tf.zeros([self.n_local], tf.int32), trainable=False, name="perm"
                )
            else:
                self.x_host, self.y_host = x_train, y_train
                self.host_perm = np.arange(self.n_local)
            self.x_test = tf.constant(x_test)
            self.y_test = tf.constant(y_test)
            if self.bpps > 1:
                self.acc = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.vars]
                self.micro = tf.Variable(0, dtype=tf.int64, trainable=False, name="micro_step")

        n_spec = tf.TensorSpec([], tf.int32)
        if in_device_memory:
            sig = [n_spec]
            self._timed = tf.function(
                lambda n: self._loop(n, None, None, True), input_signature=sig
            )
            self._plain = tf.function(
                lambda n: self._loop(n, None, None, False), input_signature=sig
            )
        else:
            P = x_train.shape[1:]
            sig = [
                tf.TensorSpec([None, *P], tf.float32),
                tf.TensorSpec([None, 2], tf.float32),
                n_spec,
            ]
            self._timed = tf.function(
                lambda x, y, n: self._loop(n, x, y, True), input_signature=sig
            )
            self._plain = tf.function(
                lambda x, y, n: self._loop(n, x, y, False), input_signature=sig
            )
        self._eval = tf.function(self._eval_sse)
        self._n_consts: dict[int, object] = {}

    # ------------------------------------------------------------------ graph pieces

    def _stamp_after(self, deps):
        """tf.timestamp() that runs after ``deps`` (on a GPU: after the device finished them)."""
        tf = self.tf
        deps = [d for d in deps if d is not None]
        if self.on_gpu and deps:
            with tf.device(self.device):
                one = tf.reshape(deps[-1], [-1])[:1]  # one element, taken on the GPU
            with tf.device("/CPU:0"):  # its copy to the host waits for the GPU stream
                deps = [tf.identity(one)]
        with tf.control_dependencies(deps):
            return tf.timestamp()

    def _allreduce(self, grads):
        """Average the gradients over all ranks in one fused group (Horovod 0.28 API)."""
        if not self.worker.distributed:
            return list(
                grads
            )  # one worker: nothing to reduce (Horovod itself skips size-1 allreduces)
        hvd = self.worker.hvd
        return hvd.grouped_allreduce(
            list(grads),
            op=hvd.Average,
            compression=self.compression,  # HVD:
            name="grads",
        )  # HVD: gradient allreduce

    def _apply(self, grads):
        tf = self.tf
        it = self.opt.apply_gradients(zip(grads, self.vars))
        with tf.control_dependencies([it]):
            # reading the weights back orders "done" after every variable update
            return [tf.reshape(v, [-1])[0] for v in self.vars]

    def _fetch(self, j, xs, ys):
        tf = self.tf
        B = self.batch
        if self.in_device_memory:
            i = self.cursor.assign_add(1) - 1
            idx = self.perm[i * B : (i + 1) * B]
            return tf.gather(self.x_train, idx), tf.gather(self.y_train, idx)
        return xs[j * B : (j + 1) * B], ys[j * B : (j + 1) * B]

    def _one_step(self, j, xs, ys, t_prev, timed):
        tf = self.tf
        cd = tf.control_dependencies
        with cd([t_prev] if timed else []):
            x, y = self._fetch(j, xs, ys)
        t1 = self._stamp_after([x, y]) if timed else None
        with cd([t1] if timed else []):
            x = tf.identity(x)
        with tf.GradientTape() as tape:
            pred = self.model(x, training=True)
            loss = tf.reduce_mean(tf.square(pred - y))
        grads = tape.gradient(loss, self.vars)
        self.loss_sum.assign_add(tf.cast(loss, tf.float64))
        if self.bpps == 1:
            t2 = self._stamp_after(list(grads) + [loss]) if timed else None
            with cd([t2] if timed else []):
                grads = [tf.identity(g) for g in grads]
            grads = self._allreduce(grads)  # HVD: synchronisation phase
            t3 = self._stamp_after(grads) if timed else None
            with cd([t3] if timed else []):
                grads = [tf.identity(g) for g in grads]
            done = self._apply(grads)
            t4 = self._stamp_after(done) if timed else None
        else:
            # backward_passes_per_step: accumulate locally, allreduce + apply every bpps-th pass
            acc_ops = [a.assign_add(g) for a, g in zip(self.acc, grads)]
            m = self.micro.assign_add(1)
            t2 = self._stamp_after(acc_ops + [loss]) if timed else tf.constant(0.0, tf.float64)

            def sync_and_apply():
                with cd([t2]):
                    avg = [a.read_value() / float(self.bpps) for a in self.acc]
                red = self._allreduce(avg)  # HVD: synchronisation phase
                t3_ = self._stamp_after(red) if timed else t2
                with cd([t3_]):
                    red = [tf.identity(g) for g in red]
                done = self._apply(red)
                with cd(done):
                    resets = [a.assign(tf.zeros_like(a)) for a in self.acc]
                t4_ = self._stamp_after(done + resets) if timed else t2
                return t3_, t4_

            def skip():
                return t2, t2

            t3, t4 = tf.cond(tf.equal(m % self.bpps, 0), sync_and_apply, skip)
        if not timed:
            return t_prev
        self.timers.assign_add(tf.stack([t1 - t_prev, t2 - t1, t3 - t2, t4 - t3]))
        return t4

    def _loop(self, n, xs, ys, timed):
        tf = self.tf
        t_prev = tf.timestamp() if timed else tf.constant(0.0, tf.float64)
        for j in tf.range(n):
            # one iteration at a time: steps are sequential anyway, and fewer in-flight
            # iteration frames make a call cheaper to start and finish
            tf.autograph.experimental.set_loop_options(parallel_iterations=1)
            t_prev = self._one_step(j, xs, ys, t_prev, timed)
        return t_prev

    def _eval_sse(self):
        tf = self.tf
        n = tf.shape(self.x_test)[0]
        sse = tf.constant(0.0, tf.float64)
        for a in tf.range(0, n, EVAL_BATCH):
            x = self.x_test[a : a + EVAL_BATCH]
            y = self.y_test[a : a + EVAL_BATCH]
            pred = self.model(x, training=False)
            sse += tf.reduce_sum(tf.cast(tf.square(pred - y), tf.float64))
        return sse

    # ------------------------------------------------------------------ host side

    def _n(self, n: int):
        if n not in self._n_consts:
            self._n_consts[n] = self.tf.constant(n, self.tf.int32)
        return self._n_consts[n]

    def warm_up(self, spe: int) -> None:
        """Trace and instantiate every function without changing any state (0 steps)."""
        zero = self._n(0)
        self._n(spe)
        if self.in_device_memory:
            self._timed(zero)
            self._plain(zero)
        else:
            empty_x = self.tf.zeros([0, *self.x_host.shape[1:]], self.tf.float32)
            empty_y = self.tf.zeros([0, 2], self.tf.float32)
            self._timed(empty_x, empty_y, zero)
            self._plain(empty_x, empty_y, zero)
        self._eval()

    def start_epoch(self, perm: np.ndarray) -> None:
        self.loss_sum.assign(0.0)
        self.timers.assign(self.tf.zeros([4], self.tf.float64))
        self.cursor.assign(0)
        if self.in_device_memory:
            self.perm.assign(perm.astype(np.int32))
        else:
            self.host_perm = perm

    def run_steps(self, start: int, n: int, timed: bool) -> float:
        """Run steps start..start+n-1 of the epoch; returns the host-side data time
        (host path: gathering and converting the batch rows; 0 on the device path)."""
        fn = self._timed if timed else self._plain
        if self.in_device_memory:
            fn(self._n(n))
            return 0.0
        t0 = time.perf_counter()
        rows = self.host_perm[start * self.batch : (start + n) * self.batch]
        xs = self.tf.constant(self.x_host[rows])
        ys = self.tf.constant(self.y_host[rows])
        t1 = time.perf_counter()
        fn(xs, ys, self._n(n))
        return t1 - t0

    def epoch_results(self) -> tuple[float, np.ndarray]:
        return float(self.loss_sum.numpy()), np.asarray(self.timers.numpy(), dtype=np.float64)

    def test_sse(self) -> tuple[float, int]:
        """Sum of squared errors over this rank's test rows, and the number of values."""
        return float(self._eval().numpy()), int(self.x_test.shape[0]) * 2


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


class WarmupSchedule:
    """Linear ramp from the base to the scaled learning rate over ``warmup_updates``
    optimizer updates (Goyal et al.), then constant. Built lazily (needs TensorFlow)."""

    @staticmethod
    def make(base: float, target: float, warmup_updates: int):
        import tensorflow as tf

        class _Warmup(tf.keras.optimizers.schedules.LearningRateSchedule):
            def __init__(self):
                self.base, self.target, self.n = (
                    float(base),
                    float(target),
                    max(1, int(warmup_updates)),
                )

            def __call__(self, step):
                frac = tf.minimum(tf.cast(step, tf.float32) / float(self.n), 1.0)
                return self.base + (self.target - self.base) * frac

            def get_config(self):
                return {"base": self.base, "target": self.target, "warmup_updates": self.n}

        return _Warmup()


# =========================================================================== the run


def run(args) -> int:
    """Run one rank; leave OUT_DIR/.pids/rank-N.exit with the exit status (diagnostics:
    a rank without it was killed or crashed hard)."""
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rank = launcher_rank_env()["rank"]
    write_pid_file(out_dir, rank)
    start_orphan_watchdog()
    # a launcher's SIGTERM (clean-up after another rank failed) ends this rank through
    # the normal exit path, so the exit marker says "143" and not "killed"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from hvdscale import timelimit  # issue 12: SIGUSR1 before the SLURM time limit

    timelimit.install()  # issue 12
    code = 1
    try:
        code = _train(args, out_dir)
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


def _train(args, out_dir: Path) -> int:
    cfg = load_config(args.config)
    run_ = find_run(cfg, args.run_id)
    tcfg = cfg["training"]
    started_utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    # ------------------------------------------------------------ CPU binding, Horovod, device
    bound = bind_cpus(
        tcfg.get("cpu_binding", "auto")
    )  # before any thread exists (see docs/performance.md)
    worker = WorkerInfo.init(use_horovod=not args.no_horovod)  # HVD: hvd.init() first
    device, device_desc = pin_device(
        worker, tcfg["threads_per_worker"]
    )  # HVD: one device per local rank
    if worker.size != run_.workers:
        raise UserError(
            f"run {run_.run_id} needs {run_.workers} workers but {worker.size} were started; "
            "start it with hvdscale launch"
        )
    import tensorflow as tf

    from hvdscale.model import build_model, check_parameter_count, model_bytes
    from hvdscale.runrecord import (
        environment_block,
        finite_or_none,
        summarise,
        utc_now,
        write_run_outputs,
    )
    from hvdscale.site_settings import nccl_env_now  # issue 12
    from hvdscale.timing import TIMING_METHOD, parse_timeline
    from hvdscale.utilisation import NullSampler, UtilisationSampler

    hvd = worker.hvd
    log = (
        (lambda msg: print(f"[hvdscale train] {msg}", flush=True))
        if worker.is_root
        else (lambda msg: None)
    )
    log(
        f"{run_.run_id}: {worker.size} worker(s), controller {worker.controller}, {device_desc}"
        + (f", bound to cores {bound}" if bound else "")
    )

    # ------------------------------------------------------------ data (checked before training)
    error = None
    data = None
    try:
        check_parameter_count(cfg)
        data = prepare_data(Path(args.data_dir), cfg, worker, run_.batch)
    except UserError as exc:
        error = str(exc)
    problems = worker.agree(error, name="setup_errors")
    if problems:
        if len({e for _, e in problems}) == 1 and len(problems) == worker.size:
            raise DataError(problems[0][1])
        raise DataError("; ".join(f"rank {r}: {e}" for r, e in problems))
    x_train, y_train, x_test, y_test, data_info = data
    counts = worker.allgather_object(
        len(x_train), name="train_counts"
    )  # HVD: every rank's sample count
    steps = steps_per_epoch(counts, run_.batch, tcfg["horovod"]["backward_passes_per_step"])
    data_info["train_samples_per_rank"] = counts

    # ------------------------------------------------------------ model, optimizer
    tf.keras.utils.set_random_seed(cfg["seed"])
    model = build_model(cfg)
    n_params = check_parameter_count(cfg)
    bpps = tcfg["horovod"]["backward_passes_per_step"]
    lr_base = tcfg["learning_rate"]
    lr = learning_rate_for(lr_base, run_.lr_rule, worker.size)
    updates_per_epoch = steps // bpps
    if tcfg["lr_warmup"] and tcfg["warmup_epochs"] > 0 and lr != lr_base:
        schedule = WarmupSchedule.make(lr_base, lr, tcfg["warmup_epochs"] * updates_per_epoch)
    else:
        schedule = lr
    opt = tf.keras.optimizers.Adam(learning_rate=schedule)
    opt.build(model.trainable_variables)
    ckpt = tf.train.Checkpoint(model=model, optimizer=opt)

    # ------------------------------------------------------------ resume (rank 0 reads, broadcasts)
    chash = config_hash(cfg)
    resume_state = None
    if worker.is_root and tcfg["checkpoint"]:
        found = find_checkpoint(out_dir)
        if found is not None:
            d, state = found
            mismatch = [
                k
                for k, v in (
                    ("run_id", run_.run_id),
                    ("config_hash", chash),
                    ("workers", worker.size),
                )
                if state.get(k) != v
            ]
            if mismatch:
                log(
                    f"WARNING: checkpoint {d} is from another configuration ({', '.join(mismatch)} differ); "
                    "starting from epoch 0"
                )
            else:
                ckpt.read(str(d / "weights")).assert_existing_objects_matched()
                resume_state = state
                log(f"resuming from {d} (epochs 0..{state['epoch']} done)")
    resume_state = worker.broadcast_object(resume_state, root_rank=0, name="resume_state")  # HVD:
    if hvd is not None and worker.size > 1:
        hvd.broadcast_variables(
            model.variables, root_rank=0
        )  # HVD: same initial weights everywhere
        hvd.broadcast_variables(opt.variables, root_rank=0)  # HVD: same optimizer state everywhere

    start_epoch = resume_state["epoch"] + 1 if resume_state else 0
    history = list(resume_state["epochs"]) if resume_state else []
    elapsed = float(resume_state["elapsed_s"]) if resume_state else 0.0
    attempts = list(resume_state["attempts"]) if resume_state else []
    attempts.append(
        {
            "started_utc": started_utc,
            "start_epoch": start_epoch,
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        }
    )
    util_prev = list(resume_state.get("utilisation_samples", [])) if resume_state else []

    # ------------------------------------------------------------ environment (all ranks)
    gathered = worker.allgather_object(
        (worker.hostname, device_desc), name="hosts"
    )  # HVD: allgather_object
    hostnames = [h for h, _ in gathered]
    devices = [d for _, d in gathered]
    environment = None
    if worker.is_root:  # collected now, so that writing the record at the end is quick
        environment = environment_block(
            config_hash=chash,
            hostnames=hostnames,
            devices=devices,
            tensorflow=tf.__version__,
            horovod=_horovod_version(),
            started_utc=attempts[0]["started_utc"],
        )

    program = StepProgram(
        model=model,
        optimizer=opt,
        worker=worker,
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        batch=run_.batch,
        device=device,
        in_device_memory=tcfg["data_in_device_memory"],
        compression=tcfg["horovod"]["compression"],
        backward_passes_per_step=bpps,
    )
    del x_train, y_train, x_test, y_test
    spe = tcfg["steps_per_execution"]
    k_inst = tcfg["instrument_every"]
    program.warm_up(spe)

    sampler = UtilisationSampler(interval_s=0.25) if worker.is_root else NullSampler()
    sampler.offset_s = util_prev[-1][0] if util_prev else 0.0
    sampler.start()
    worker.barrier(name="train_start")  # HVD: every rank starts epoch timing together
    status, error_msg = "completed", None
    n_test_values = None
    epochs_total = tcfg["epochs"]
    samples_per_epoch = steps * run_.batch * worker.size
    rank0_sync_s = 0.0
    try:
        for epoch in range(start_epoch, epochs_total):
            rng = np.random.default_rng([cfg["seed"], epoch, worker.rank])
            perm = (
                rng.permutation(program.n_local) if tcfg["shuffle"] else np.arange(program.n_local)
            )
            u0 = sampler.now()
            t_epoch0 = time.perf_counter()
            timer, local = run_epoch_steps(program, perm, steps, spe, k_inst)
            loss_sum, phases, dispatch, t_train = local
            te0 = time.perf_counter()
            sse, nvals = program.test_sse()
            t_eval = time.perf_counter() - te0
            rank0_sync_s += float(phases[2]) * steps / max(timer.timed_steps, 1)
            # HVD: metrics and timings summed over all ranks in one allreduce
            local = [loss_sum / steps, sse, nvals, *phases, dispatch, t_train, t_eval]
            red = worker.allreduce(local, op="sum", name=f"epoch_metrics_{epoch}")
            W = worker.size
            train_loss = red[0] / W
            test_loss = red[1] / red[2] if red[2] > 0 else float("nan")
            n_test_values = int(red[2])
            timer.phase_sums = list(red[3:7] / W)  # phase times: means over ranks
            timer.dispatch_sum = red[7] / W
            timer.train_wall = red[8] / W
            timer.eval_wall = red[9] / W
            wall = time.perf_counter() - t_epoch0
            timer.epoch_wall = wall
            elapsed += wall
            rec = {
                "epoch": epoch,
                "warmup": epoch < tcfg["warmup_epochs"],
                "wall_s": round(wall, 6),
                "steps": steps,
                "samples": samples_per_epoch,
                "throughput": round(samples_per_epoch / t_train, 3),
                **timer.record_fields(),
                "train_loss": finite_or_none(train_loss),
                "test_loss": finite_or_none(test_loss),
                "elapsed_s": round(elapsed, 6),
                "utilisation_mean": sampler.mean_between(u0, sampler.now()),
                "learning_rate": float(
                    tf.keras.backend.get_value(
                        schedule(opt.iterations) if callable(schedule) else schedule
                    )
                ),
                "attempt": len(attempts),
            }
            history.append(rec)
            log(
                f"epoch {epoch}: {rec['wall_s']:.2f} s, {rec['throughput']:.0f} samples/s, train loss "
                f"{train_loss:.5g}, test loss {test_loss:.5g} (data {rec['time_data_s']:.3f} / compute "
                f"{rec['time_compute_s']:.3f} / sync {rec['time_sync_s']:.3f} / update {rec['time_update_s']:.3f} s)"
            )
            if not (math.isfinite(train_loss) and math.isfinite(test_loss)):
                raise NanLoss(
                    f"loss is not finite after epoch {epoch} (train {train_loss}, test {test_loss}); "
                    f"learning rate {lr:g} is too large for this configuration"
                )
            if tcfg["checkpoint"] and worker.is_root:
                save_checkpoint(
                    out_dir,
                    ckpt,
                    {
                        "run_id": run_.run_id,
                        "config_hash": chash,
                        "workers": worker.size,
                        "epoch": epoch,
                        "epochs": history,
                        "elapsed_s": elapsed,
                        "attempts": attempts,
                        "shuffle": {
                            "seed": cfg["seed"],
                            "rule": "numpy default_rng([seed, epoch, rank]).permutation",
                            "next_epoch": epoch + 1,
                        },
                        "utilisation_samples": util_prev + list(sampler.samples),
                        "saved_utc": utc_now(),
                    },
                )
            worker.barrier(
                name=f"epoch_end_{epoch}"
            )  # HVD: nobody starts the next epoch before the checkpoint
            from hvdscale import timelimit  # issue 12: stop before the SLURM time limit

            if timelimit.stop_requested(worker, epoch, epochs_total):  # issue 12
                return timelimit.stopped(log, run_.run_id, epoch, out_dir, worker.is_root)
    except NanLoss as exc:
        status, error_msg = "nan_loss", str(exc)
        print(f"ERROR: {run_.run_id}: {exc}", file=sys.stderr, flush=True)
    finally:
        sampler.stop()

    worker.barrier(name="train_end")  # HVD:
    if hvd is not None:
        hvd.shutdown()  # HVD: flush the timeline before rank 0 reads it
    if not worker.is_root:
        # exit 0 even after nan_loss: a non-zero exit would make the launcher kill rank 0
        # while it writes the record; rank 0's exit status speaks for the job
        return 0

    # ------------------------------------------------------------ run record (rank 0)
    timeline_path = (
        Path(os.environ["HOROVOD_TIMELINE"]) if os.environ.get("HOROVOD_TIMELINE") else None
    )
    timeline_check = None
    if timeline_path is not None and timeline_path.is_file() and worker.size > 1:
        try:
            tl = parse_timeline(timeline_path, tensor_filter="grads")
            timeline_check = {
                "timeline_span_s": round(tl["span_s"], 6),
                "timeline_allreduce_s": round(tl["allreduce_s"], 6),
                "timeline_negotiate_s": round(tl["negotiate_s"], 6),
                "timeline_allreduce_ops": tl["allreduce_ops"],
                "measured_sync_s_rank0": round(rank0_sync_s, 6),
                "epochs": len(history) - (start_epoch if resume_state else 0),
            }
        except (OSError, ValueError) as exc:
            timeline_check = {"error": str(exc)}
    horovod_env = {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith("HOROVOD_")
        and not k.startswith(
            (
                "HOROVOD_GLOO_RENDEZVOUS",
                "HOROVOD_RANK",
                "HOROVOD_SIZE",
                "HOROVOD_LOCAL_",
                "HOROVOD_CROSS_",
                "HOROVOD_HOSTNAME",
            )
        )
    }
    record = {
        "schema_version": 1,
        "run_id": run_.run_id,
        "status": status,
        "exit_status": EXIT_NAN if status == "nan_loss" else 0,
        "error": error_msg,
        "config": {
            "partition": run_.partition,
            "backend": run_.backend,
            "nodes": run_.nodes,
            "workers": worker.size,
            "workers_per_node": run_.workers_per_node,
            "batch_per_worker": run_.batch,
            "global_batch": run_.batch * worker.size,
            "lr_rule": run_.lr_rule,
            "learning_rate_base": lr_base,
            "learning_rate": lr,
            "lr_warmup": tcfg["lr_warmup"],
            "epochs": epochs_total,
            "warmup_epochs": tcfg["warmup_epochs"],
            "threads_per_worker": tcfg["threads_per_worker"],
            "launcher": detect_launcher(),
            "cpu_binding": tcfg.get("cpu_binding", "auto"),
            "controller": worker.controller,
            "repeat": run_.repeat,
            "seed": cfg["seed"],
            "data_in_device_memory": tcfg["data_in_device_memory"],
            "target_test_loss": tcfg["target_test_loss"],
            "model_parameters": n_params,
            "model_bytes": model_bytes(n_params),
            "horovod_env": horovod_env,
            "nccl_env": nccl_env_now(),  # issue 12: NCCL_* the ranks ran with
            "steps_per_execution": spe,
            "backward_passes_per_step": bpps,
            "compression": tcfg["horovod"]["compression"],
            "instrument_every": k_inst,
            "shard_policy": tcfg["shard_policy"],
            "hidden_units": cfg["model"]["hidden_units"],
            "activation": cfg["model"]["activation"],
            "steps_per_epoch": steps,
            "samples_per_epoch": samples_per_epoch,
        },
        "environment": environment,
        "resume": {"resumed": len(attempts) > 1, "attempts": attempts},
        "epochs": history,
        "summary": summarise(history, tcfg["target_test_loss"]),
        "utilisation": {
            "kind": sampler.kind,
            "interval_s": sampler.interval_s,
            "samples": util_prev + list(sampler.samples),
        },
        "timing_method": TIMING_METHOD,
        "timeline": timeline_path.name
        if timeline_path is not None and timeline_path.is_file()
        else None,
        "timeline_check": timeline_check,
        "data": {**data_info, "test_values": n_test_values},
        "finished_utc": utc_now(),
    }
    from hvdscale.labelproof import prove  # issue 12: every run proves its label

    record["label_proof"] = prove(record, timeline_path)  # issue 12
    write_run_outputs(out_dir, record)
    log(f"wrote {out_dir / 'metrics.json'} (status {status})")
    return EXIT_NAN if status == "nan_loss" else 0


def _horovod_version() -> str:
    try:
        import horovod

        return horovod.__version__
    except ImportError:
        return "none"


def prepare_data(data_dir: Path, cfg: dict, worker: WorkerInfo, batch: int):
    """Check and read this rank's rows of both splits; raise UserError/DataError on problems."""
    from hvdscale.data.check import load_manifest, verify_data_dir, verify_shard
    from hvdscale.model import normalisation_from_manifest, normalise

    tcfg = cfg["training"]
    manifest = load_manifest(data_dir)
    n_points = cfg["data"]["n_points"]
    if manifest["n_points"] != n_points:
        raise DataError(
            f"{data_dir / 'manifest.json'}: {manifest['n_points']} points per curve; "
            f"the config says data.n_points = {n_points}"
        )
    plans = {}
    for split in ("train", "test"):
        entries = manifest["shards"][split]
        policy = tcfg["shard_policy"] if split == "train" else "auto"
        plans[split] = plan_rows(
            [int(e["n_samples"]) for e in entries], worker.size, worker.rank, policy, split
        )
    # checksums: rank 0 verifies every shard, every other rank the shards it reads
    if worker.is_root:
        verify_data_dir(data_dir, verify_checksums=True)
    else:
        for split in ("train", "test"):
            for i in sorted({i for i, _, _ in plans[split]}):
                verify_shard(data_dir, manifest["shards"][split][i], manifest, verify_checksum=True)
    norm = normalisation_from_manifest(manifest)
    arrays = {}
    for split in ("train", "test"):
        curves, labels, _ids = read_rows(
            data_dir, manifest["shards"][split], plans[split], n_points
        )
        arrays[split] = normalise(curves, labels, norm)
        del curves, labels
    info = {
        "rank0_train_rows": [
            [manifest["shards"]["train"][i]["file"], lo, hi] for i, lo, hi in plans["train"]
        ],
        "counts": manifest["counts"],
    }
    return (*arrays["train"], *arrays["test"], info)


def steps_per_epoch(counts: list[int], batch: int, bpps: int) -> int:
    """Steps every rank runs per epoch: the smallest rank's full batches (a multiple of
    backward_passes_per_step), so that all ranks issue the same collectives."""
    steps = (min(counts) // batch) // bpps * bpps
    if steps < 1:
        raise DataError(
            f"train split: the smallest rank's part has {min(counts)} samples, fewer than one step of "
            f"batch {batch} x backward_passes_per_step {bpps}; use more data or fewer workers"
        )
    return steps
