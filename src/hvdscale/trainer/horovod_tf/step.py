"""The compiled training step of one rank, and its test-set evaluation.

Two independent choices shape the step, each an object instead of a flag:

* the **clock**: ``PhaseClock`` puts ``tf.timestamp()`` ops at the phase boundaries
  (data | compute | sync | update, see hvdscale.record.timing) and sums the phase durations into
  a variable; ``NoClock`` runs the same step without them;
* the **batch source**: ``DeviceBatches`` holds the rank's shard as device tensors and
  gathers each batch inside the graph; ``HostBatches`` slices host arrays and feeds the
  rows of ``steps_per_execution`` steps to each call.

The clocks are ``hvdscale.trainer.horovod_tf.clocks``, the batch sources
``hvdscale.trainer.horovod_tf.batches``. ``StepProgram`` compiles one ``tf.function`` per
clock (timed and plain) for its source; one call runs n optimizer steps in a graph loop.
Its host side is the interface the epoch loop drives (``trainer.protocols.Steps``). Every
Horovod-specific line is marked ``# HVD:``. No TensorFlow import at module level (the
workflow env imports the package).
"""

from __future__ import annotations

import contextlib
import os

import numpy as np

from hvdscale.matrix import backends
from hvdscale.record.timing import STEP_PARTS
from hvdscale.trainer.horovod_tf.batches import DeviceBatches, HostBatches
from hvdscale.trainer.horovod_tf.clocks import NoClock, PhaseClock
from hvdscale.trainer.horovod_tf.loss_scale import DynamicLossScale
from hvdscale.trainer.horovod_tf.xla_cache import CacheWatch
from hvdscale.trainer.protocols import EVAL_BATCH
from hvdscale.trainer.worker import WorkerInfo


def host_reduction(device: str, env=None) -> bool:  # HVD: issue 20
    """True when the gradients must leave the GPU before the allreduce: a backend with CPU
    operations, mpi or gloo (the launcher sets HOROVOD_CPU_OPERATIONS, hvdscale.matrix.backends;
    no HOROVOD_GPU_OPERATIONS) on a GPU.
    Horovod built with NCCL reduces GPU tensors with NCCL whatever the controller; a
    tensor on the host is reduced by the CPU operations, the label's collective."""
    env = os.environ if env is None else env
    registered = {b.cpu_operations for b in backends.entries() if b.cpu_operations}
    cpu_ops = env.get("HOROVOD_CPU_OPERATIONS", "").lower() in registered
    return "GPU" in device.upper() and cpu_ops and not env.get("HOROVOD_GPU_OPERATIONS")


# =========================================================================== the program


class StepProgram:
    """The compiled training step(s) and evaluation of one rank.

    ``run_steps(start, n, timed)`` runs n optimizer steps (micro-batches) in one graph
    execution; the timed variant carries the phase timestamps (see hvdscale.record.timing).
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
        x_val=None,
        y_val=None,
        xla: bool = False,
        loss_scaling: bool = False,
        compile_cache: str | None = None,
        loss: str = "mse",
    ):
        import tensorflow as tf

        self.tf = tf
        self.loss_name = loss  # the workload's loss: mse or cross_entropy
        self.eval_correct = {"val": 0.0, "test": 0.0}  # cross_entropy: correct predictions
        self.model = model
        self.opt = optimizer
        self.worker = worker
        self.batch = int(batch)
        self.device = device
        self.in_device_memory = in_device_memory
        self.bpps = int(backward_passes_per_step)
        self.vars = model.trainable_variables
        # issue 32 (training.compile): the compute phase (forward and backward pass) as one
        # XLA-compiled function inside the step graph; Horovod's allreduce stays outside
        self.xla = bool(xla)
        self._grad_fn = None
        # issue 32: XLA's persistent cache folder (xla_cache.use_xla_cache; None: none) and
        # what the warm-up's compilation did with it (the record's config keys)
        self.compile_cache = compile_cache if self.xla else None
        self.record_config = {"compile_cache_dir": self.compile_cache,
                              "compile_cache_hits": None,
                              "compile_cache_misses": None}  # fmt: skip
        self.n_local = len(x_train)
        hvd = worker.hvd
        self.compression = None
        if hvd is not None:
            self.compression = (
                hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none
            )  # HVD:

        with tf.device(device):
            self._make_state(x_train, y_train, x_test, y_test, x_val, y_val, loss_scaling)
        self._compile()

    def _make_state(self, x_train, y_train, x_test, y_test, x_val, y_val, loss_scaling):
        """The step's variables and data (inside the step's device scope)."""
        tf = self.tf
        self.loss_sum = tf.Variable(0.0, dtype=tf.float64, trainable=False, name="loss_sum")
        # the step's parts: four phases and the noise-scale sums (PhaseClock.record)
        self.timers = tf.Variable(
            tf.zeros([len(STEP_PARTS)], tf.float64), trainable=False, name="phase_timers"
        )
        source = DeviceBatches if self.in_device_memory else HostBatches
        self.source = source(tf, x_train, y_train, self.batch)
        self.x_test = tf.constant(x_test)
        self.y_test = tf.constant(y_test)
        self.has_val = x_val is not None
        self.x_val = tf.constant(x_val) if self.has_val else self.x_test
        self.y_val = tf.constant(y_val) if self.has_val else self.y_test
        # gradient noise scale (issue 16 item 7): sums of |g_local|^2, |g_allreduced|^2
        # and the number of timed multi-worker updates they cover
        self.gsq = tf.Variable(tf.zeros([3], tf.float64), trainable=False, name="grad_sq")
        if self.bpps > 1:
            self.acc = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.vars]
            self.micro = tf.Variable(0, dtype=tf.int64, trainable=False, name="micro_step")
        # issue 32: fp16 (a mixed_float16 model) with dynamic loss scaling; the scale
        # and its counters follow the allreduced gradient, so every rank keeps the same
        self.loss_scaling = bool(loss_scaling)
        self.scaler = DynamicLossScale(tf) if self.loss_scaling else None
        self.loss_scale = self.scaler.scale if self.scaler else None
        self.scale_vars = self.scaler.variables if self.scaler else []

    def _compile(self):
        """The timed and plain step functions of the batch source, and the evaluations."""
        tf = self.tf
        timed, plain = PhaseClock(tf, self.device, self.timers), NoClock(tf)
        self._timed = self.source.compile(lambda n, feed: self._loop(n, feed, timed))
        self._plain = self.source.compile(lambda n, feed: self._loop(n, feed, plain))
        # explicit tf.while_loop, no autograph: converting the step's call tree cost
        # about 2 s of every job's start-up
        self._eval = tf.function(lambda: self._eval_sse(self.x_test, self.y_test), autograph=False)
        self._eval_val = tf.function(
            lambda: self._eval_sse(self.x_val, self.y_val), autograph=False
        )
        self._n_consts: dict[int, object] = {}

    # ------------------------------------------------------------------ graph pieces

    def _allreduce(self, grads):
        """Average the gradients over all ranks in one fused group (Horovod 0.28 API)."""
        if not self.worker.distributed:
            # one worker: nothing to reduce (Horovod itself skips size-1 allreduces)
            return list(grads)
        hvd = self.worker.hvd
        host = host_reduction(self.device)  # HVD: issue 20: mpi/gloo on a GPU reduce on the host
        with self.tf.device("/CPU:0") if host else contextlib.nullcontext():
            return hvd.grouped_allreduce(
                list(grads),
                op=hvd.Average,
                compression=self.compression,  # HVD:
                name="grads",
            )  # HVD: gradient allreduce

    def _noise(self, local, reduced, clock):
        """Timed multi-worker updates: add |g_local|^2 (this rank's gradient, batch =
        per-worker batch) and |g_allreduced|^2 (global batch) to ``gsq``; returns the
        update op (None otherwise). Timed calls only; see _noise_after."""
        if not (clock.timed and self.worker.distributed):
            return None
        tf = self.tf

        def sq(gs):
            return tf.add_n([tf.reduce_sum(tf.square(tf.cast(g, tf.float64))) for g in gs])

        one = tf.constant(1.0, tf.float64)
        return self.gsq.assign_add(tf.stack([sq(local), sq(reduced), one]))

    def _noise_after(self, t3, local, reduced, clock):
        """The noise-scale sums after the sync phase has ended at ``t3``, so that they
        are not sync time (uninstrumented steps do not compute them): returns the time
        they took (``gap`` of PhaseClock.record; zero when there are none)."""
        with clock.after(t3):
            op = self._noise(local, reduced, clock)
        if op is None:
            return t3 - t3
        return clock.stamp(self._phase_end("noise", [op])) - t3

    def _phase_end(self, phase: str, tensors: list) -> list:
        """The tensors that end ``phase`` (a part of hvdscale.record.timing.STEP_PARTS: data,
        compute, sync, update, or noise, the noise-scale sums), unchanged. The phase's end
        timestamp waits for what this returns (timed and plain steps), so an op a subclass
        adds here is that phase's work (docs/timing.md: a known delay here validates it)."""
        return list(tensors)

    def _read_back(self, deps):
        with self.tf.control_dependencies(deps):
            # reading the weights back orders "done" after every variable update
            return [self.tf.reshape(v, [-1])[0] for v in self.vars]

    def _apply(self, grads):
        def update():
            return self.opt.apply_gradients(zip(grads, self.vars))

        if not self.loss_scaling:
            return self._read_back([update()])
        return self.scaler.apply(update, grads, self._read_back)

    def loss_scale_state(self) -> dict | None:
        """fp16 runs: the record's ``loss_scale`` block (``DynamicLossScale.state``); None
        without loss scaling (fp32, bf16)."""
        return self.scaler.state() if self.loss_scaling else None

    def _one_step(self, j, feed, t_prev, clock):
        tf = self.tf
        with clock.after(t_prev):
            x, y = self.source.fetch(j, feed)
        x, y = self._phase_end("data", [x, y])
        t1 = clock.stamp([x, y])
        with clock.after(t1):
            x = tf.identity(x)
        loss, grads = self._loss_and_grads(x, y)
        self.loss_sum.assign_add(tf.cast(loss, tf.float64))
        if self.bpps == 1:
            t2, t3, t4, gap = self._sync_and_update(grads, loss, clock)
        else:
            t2, t3, t4, gap = self._accumulate(grads, loss, clock)
        return clock.record(t_prev, t1, t2, t3, t4, gap)

    def _loss_and_grads(self, x, y):
        """Forward and backward pass (the compute phase), XLA-compiled with ``xla``; a
        subclass may replace it (benchmarks). The prediction is cast to float32 (a
        mixed-precision model computes in bfloat16, training.precision bf16)."""
        if not self.xla:
            return self._forward_backward(x, y)
        if self._grad_fn is None:
            self._grad_fn = self.tf.function(self._forward_backward, jit_compile=True)
        loss, grads = self._grad_fn(x, y)
        return loss, list(grads)

    def _forward_backward(self, x, y):
        tf = self.tf
        with tf.GradientTape() as tape:
            pred = tf.cast(self.model(x, training=True), tf.float32)
            loss = self._batch_loss(pred, y)
            scaled = loss * self.loss_scale if self.loss_scaling else loss
        grads = tape.gradient(scaled, self.vars)
        if self.loss_scaling:  # the float32 gradient of the loss itself
            inv = 1.0 / self.loss_scale
            grads = [g * inv for g in grads]
        return loss, grads

    def _sync_and_update(self, grads, loss, clock):
        """Allreduce and apply every step: the compute, sync and update boundaries."""
        tf = self.tf
        *grads, loss = self._phase_end("compute", [*grads, loss])
        t2 = clock.stamp([*grads, loss])
        with clock.after(t2):
            grads = [tf.identity(g) for g in grads]
        local = grads
        grads = self._allreduce(grads)  # HVD: synchronisation phase
        grads = self._phase_end("sync", grads)
        t3 = clock.stamp(grads)
        gap = self._noise_after(t3, local, grads, clock)
        with clock.after(t3 + gap):
            grads = [tf.identity(g) for g in grads]
        done = self._phase_end("update", self._apply(grads))
        t4 = clock.stamp(done)
        return t2, t3, t4, gap

    def _accumulate(self, grads, loss, clock):
        """backward_passes_per_step: accumulate locally, allreduce + apply every bpps-th pass."""
        tf = self.tf
        acc_ops = [a.assign_add(g) for a, g in zip(self.acc, grads)]
        m = self.micro.assign_add(1)
        t2 = clock.stamp(self._phase_end("compute", acc_ops + [loss]))

        def sync_and_apply():
            with clock.after(t2):
                avg = [a.read_value() / float(self.bpps) for a in self.acc]
            red = self._allreduce(avg)  # HVD: synchronisation phase
            red = self._phase_end("sync", red)
            t3 = clock.stamp(red)
            gap = self._noise_after(t3, avg, red, clock)
            with clock.after(t3 + gap):
                red = [tf.identity(g) for g in red]
            done = self._apply(red)
            with tf.control_dependencies(done):
                resets = [a.assign(tf.zeros_like(a)) for a in self.acc]
            t4 = clock.stamp(self._phase_end("update", done + resets))
            return t3, t4, gap

        def skip():
            return t2, t2, t2 - t2

        t3, t4, gap = tf.cond(tf.equal(m % self.bpps, 0), sync_and_apply, skip)
        return t2, t3, t4, gap

    def _loop(self, n, feed, clock):
        tf = self.tf

        def body(j, t_prev):
            return j + 1, self._one_step(j, feed, t_prev, clock)

        # one iteration at a time: steps are sequential anyway, and fewer in-flight
        # iteration frames make a call cheaper to start and finish
        start = (tf.constant(0), clock.start())
        return tf.while_loop(lambda j, _: j < n, body, start, parallel_iterations=1)[1]

    def _batch_loss(self, pred, y):
        """The workload's training loss of a batch: the mean squared error, or the mean
        cross-entropy of the logits ``pred`` against class indices ``y``."""
        tf = self.tf
        if self.loss_name == "cross_entropy":
            return tf.reduce_mean(
                tf.keras.losses.sparse_categorical_crossentropy(y, pred, from_logits=True)
            )
        return tf.reduce_mean(tf.square(pred - y))

    def _eval_ce(self, xs, ys):
        """[sum of the cross-entropies, correct predictions] over the rows (classifiers)."""
        tf = self.tf
        n = tf.shape(xs)[0]

        def body(a, loss_sum, correct):
            logits = tf.cast(self.model(xs[a : a + EVAL_BATCH], training=False), tf.float32)
            y = ys[a : a + EVAL_BATCH]
            ce = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            hit = tf.equal(tf.argmax(logits, axis=1, output_type=y.dtype), y)
            return (a + EVAL_BATCH, loss_sum + tf.reduce_sum(tf.cast(ce, tf.float64)),
                    correct + tf.reduce_sum(tf.cast(hit, tf.float64)))  # fmt: skip

        zero = tf.constant(0.0, tf.float64)
        _, loss_sum, correct = tf.while_loop(
            lambda a, *_: a < n, body, (tf.constant(0), zero, zero)
        )
        return tf.stack([loss_sum, correct])

    def _eval_sse(self, xs, ys):
        if self.loss_name == "cross_entropy":
            return self._eval_ce(xs, ys)
        tf = self.tf
        n = tf.shape(xs)[0]

        def body(a, sse):
            pred = tf.cast(self.model(xs[a : a + EVAL_BATCH], training=False), tf.float32)
            err = tf.square(pred - ys[a : a + EVAL_BATCH])
            return a + EVAL_BATCH, sse + tf.reduce_sum(tf.cast(err, tf.float64))

        start = (tf.constant(0), tf.constant(0.0, tf.float64))
        return tf.while_loop(lambda a, _: a < n, body, start)[1]

    # ------------------------------------------------------------------ host side

    def _n(self, n: int):
        if n not in self._n_consts:
            self._n_consts[n] = self.tf.constant(n, self.tf.int32)
        return self._n_consts[n]

    def warm_up(self, spe: int) -> None:
        """Trace and instantiate every function without changing any state (0 steps);
        with ``xla`` also compile the XLA cluster (``_compile_xla``), counting the cache
        entries it stored and loaded (``xla_cache.CacheWatch``) when there is a cache."""
        watch = CacheWatch(self.compile_cache) if self.compile_cache else None
        zero = self._n(0)
        self._n(spe)
        empty = self.source.empty_feed()
        self._timed(*empty, zero)
        self._plain(*empty, zero)
        self._eval()
        self._eval_val()
        if self.xla:
            self._compile_xla()
        if watch is not None:
            self.record_config.update(watch.record())

    def _compile_xla(self) -> None:
        """XLA compiles a cluster when it first runs, and a 0-step call runs none: run one
        timed and one plain step, then put back every variable they changed (weights,
        optimizer state, accumulators, counters), so the compilation is in the warm-up and
        not in the first epoch, and training starts where it would have. Every rank runs
        it (the steps' allreduces pair up)."""
        tf = self.tf
        opt_vars = self.opt.variables  # a property in Keras 2.11+, a method before
        keep = list(self.model.variables) + list(opt_vars() if callable(opt_vars) else opt_vars)
        keep += [v for v in (getattr(self, "micro", None),) if v is not None]
        keep += list(getattr(self, "acc", [])) + self.scale_vars
        saved = [v.read_value() for v in keep]
        self.source.start_epoch(np.arange(self.n_local))
        for fn in (self._timed, self._plain):
            feed, _ = self.source.feed(0, 1)
            fn(*feed, self._n(1))
        for v, value in zip(keep, saved, strict=True):
            v.assign(value)
        self.loss_sum.assign(0.0)
        self.timers.assign(tf.zeros([len(STEP_PARTS)], tf.float64))
        self.gsq.assign(tf.zeros([3], tf.float64))

    def start_epoch(self, perm: np.ndarray) -> None:
        self.loss_sum.assign(0.0)
        self.timers.assign(self.tf.zeros([len(STEP_PARTS)], self.tf.float64))
        self.gsq.assign(self.tf.zeros([3], self.tf.float64))
        self.source.start_epoch(perm)

    def run_steps(self, start: int, n: int, timed: bool) -> float:
        """Run steps start..start+n-1 of the epoch; returns the host-side data time
        (host path: gathering and converting the batch rows; 0 on the device path)."""
        fn = self._timed if timed else self._plain
        feed, host_data = self.source.feed(start, n)
        fn(*feed, self._n(n))
        return host_data

    def epoch_results(self) -> tuple[float, np.ndarray]:
        """The epoch's loss sum and the timed steps' in-graph time: the four phases and
        the noise-scale sums (in no phase)."""
        return float(self.loss_sum.numpy()), np.asarray(self.timers.numpy(), dtype=np.float64)

    def grad_sq(self) -> tuple[float, float, int]:
        """This epoch's sums of |g_local|^2 and |g_allreduced|^2 and the updates they
        cover (timed calls of multi-worker runs; zeros otherwise)."""
        a, b, n = (float(v) for v in self.gsq.numpy())
        return a, b, int(round(n))

    def _losses(self, split: str, out, ys) -> tuple[float, int]:
        """(loss sum, values) of an evaluation; a classifier's correct predictions go to
        ``eval_correct[split]``."""
        v = out.numpy()
        if self.loss_name == "cross_entropy":
            self.eval_correct[split] = float(v[1])
            return float(v[0]), int(ys.shape[0])
        return float(v), int(ys.shape[0]) * int(np.prod(tuple(ys.shape[1:])))

    def test_sse(self) -> tuple[float, int]:
        """Sum of squared errors (a classifier: of cross-entropies) over this rank's test
        rows, and the number of values."""
        return self._losses("test", self._eval(), self.y_test)

    def val_sse(self) -> tuple[float, int]:
        """Sum of squared errors (a classifier: of cross-entropies) over this rank's
        validation rows, and the number of values."""
        if not self.has_val:
            raise ValueError("StepProgram: built without a validation split (x_val)")
        return self._losses("val", self._eval_val(), self.y_val)


def build_step_program(
    model,
    optimizer,
    worker: WorkerInfo,
    training: dict,
    *,
    train: tuple,
    test: tuple,
    batch: int,
    device: str,
    val: tuple = (None, None),
    in_device_memory: bool | None = None,
    program: type[StepProgram] = StepProgram,
    compile_cache: str | None = None,
    loss: str = "mse",
) -> StepProgram:
    """The ``StepProgram`` of a rank with the settings of the config's training section
    (data in device memory, Horovod compression, backward passes per step), as
    ``hvdscale train`` and the benchmarks build it. ``train``/``test``/``val``: (x, y);
    ``in_device_memory`` overrides the config (a benchmark's variant); ``program``: a
    StepProgram subclass (a benchmark's variant of the step); ``compile_cache``: XLA's
    persistent cache folder in use (``xla_cache.use_xla_cache``), counted in the warm-up."""
    if in_device_memory is None:
        in_device_memory = training["data_in_device_memory"]
    return program(
        model=model,
        optimizer=optimizer,
        worker=worker,
        x_train=train[0],
        y_train=train[1],
        x_test=test[0],
        y_test=test[1],
        x_val=val[0],
        y_val=val[1],
        batch=batch,
        device=device,
        in_device_memory=in_device_memory,
        compression=training["horovod"]["compression"],
        backward_passes_per_step=training["horovod"]["backward_passes_per_step"],
        xla=training.get("compile", "off") != "off",
        loss_scaling=training.get("precision", "fp32") == "fp16",
        compile_cache=compile_cache,
        loss=loss,
    )
