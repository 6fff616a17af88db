"""The training steps and evaluation of one torch-ddp rank, behind the host interface of a
step program (``hvdscale.trainer.protocols.Steps``: ``start_epoch``, ``run_steps``,
``epoch_results``, ``grad_sq``, ``val_sse``, ``test_sse``, ``warm_up``, ``n_local``), so
that the epoch loop of ``hvdscale.trainer.loop`` drives it as it drives the Horovod one.

Plain steps (the headline time) are ordinary DDP steps: the gradient allreduce of each
bucket starts during the backward pass and overlaps it (gloo on the CPU). Timed steps
(every ``training.instrument_every``-th call) separate the phases as the Horovod step does:
data (gather the batch rows), compute (forward and backward without DDP's hooks,
``no_sync``), sync (one allreduce of all gradients, then / world size: DDP's average),
update (KerasAdam). So ``time_sync_s`` is the allreduce *without* overlap, the Horovod
definition. With ``backward_passes_per_step`` k > 1, k micro-batches accumulate their
gradients (loss / k, without communication) and the k-th one synchronises and updates.

Synchronisation as DDP overlaps it (issue 19 item 2; the record's ``timing.sync``, built by
``hvdscale.record.timing.sync_block`` from two per-epoch fields of this rank, rank 0's in the
record):

* ``comm_hook_step_s``: time inside DDP's communication hook per plain step, the sum over
  the step's gradient buckets. With more than one rank DDP runs ``CommHookTimer.hook``, a
  wrapper of its default hook (``default_hooks.allreduce_hook``, or
  ``fp16_compress_hook`` with ``horovod.compression: fp16``): from the moment the reducer
  calls the hook with a ready bucket (``perf_counter`` before the inner hook starts its
  asynchronous allreduce) to the moment the allreduce's future completes (a ``then()``
  callback on the inner hook's future takes the second ``perf_counter``; for the fp16
  hook after its decompression). DDP waits for the callback's future at the end of the
  backward pass, so every bucket's time is in before ``backward()`` returns. The time
  includes waiting for the slower rank. On a GPU (nccl) the two clock reads are CUDA
  events instead, read at the end of the block (``CommHookTimer``: NCCL's future
  completes when the allreduce is enqueued, not when it has run). The wrapper is a
  Python hook on every plain step (DDP allows one hook per model, for the whole run),
  in place of DDP's built-in C++ allreduce: the same allreduce and division, plus two
  clock reads and a callback per bucket. The epoch field is the median over the epoch's
  plain steps that synchronise (with ``backward_passes_per_step`` k > 1, every k-th).
* ``step_s_no_comm``: the same step without any communication, per timed step: its
  data + compute + update phases, i.e. the timed step without its sync phase. The
  timed step *is* a DDP step under ``no_sync`` (forward and backward with no
  allreduce), followed by an explicit allreduce and the update, so this sample costs no
  extra step and leaves the training result unchanged (the weights after a timed step
  equal those after a plain one, tests/test_torch_ddp.py). The epoch field is the median
  over the epoch's timed steps.

``exposed_s`` = median plain step time (``timing.instrumentation.uninstrumented_step_s``)
minus the median ``step_s_no_comm``: the part of the step that communication leaves
exposed after DDP's overlap (noise can make it slightly negative when nothing is
exposed). One rank: no hook, no samples (the block says 0 / null).

On a GPU (backend nccl, ``device.choose_device``) the model, the rank's training and
evaluation arrays (one copy per rank, as the Horovod trainer's ``data_in_device_memory``)
and the batch gather live on ``cuda:LOCAL_RANK``; the losses are summed on the device and
read once per epoch. CUDA ops return before the GPU has run them, so the times wait for
the device: a timed step calls ``torch.cuda.synchronize`` before its first clock read and
at every phase boundary (data, compute, sync, update each contain their GPU work), and a
block of plain steps (one ``run_steps`` call, the loop's measured unit) synchronises once
at its end, so the headline step time includes the GPU work without a per-step stall. On
the CPU the synchronisation is a no-op.
"""

from __future__ import annotations

import gc
import statistics
import threading
import time

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from hvdscale.record.timing import STEP_PARTS
from hvdscale.trainer.protocols import EVAL_BATCH
from hvdscale.trainer.torch_ddp.device import synchronizer
from hvdscale.trainer.torch_ddp.net import TorchOptimisation
from hvdscale.trainer.torch_ddp.precision_compile import (
    autocast,
    cache_counts,
    compile_cache_facts,
    compile_mode,
    compiled,
    grad_scaler,
    set_matmul_precision,
)

#: forward/backward passes ``warm_up`` runs through a compiled model (CUDA graph trees
#: record on the second and replay from the third)
WARM_UP_PASSES = 3


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A classifier's training loss: the mean cross-entropy of the logits against the
    class indices (Keras' sparse_categorical_crossentropy with from_logits)."""
    return torch.nn.functional.cross_entropy(logits.float(), y)


#: the workload's loss (hvdscale.workload) -> the training loss of a batch
LOSSES = {"mse": None, "cross_entropy": cross_entropy}


def mse(pred: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The training loss: the mean over the batch and both labels of the squared error
    (``tf.reduce_mean(tf.square(pred - y))``)."""
    return torch.mean(torch.square(pred - y))


def _median(xs: list[float]) -> float | None:
    return round(statistics.median(xs), 9) if xs else None


class CommHookTimer:
    """DDP's default communication hook (``inner``), timed: ``hook`` is what DDP calls per
    ready bucket; ``end_step()`` after a step's backward pass adds the step's sum over
    buckets to ``samples`` (see the module docstring for what is timed).

    On the CPU (gloo) the clocks are host clocks: the allreduce runs on gloo's threads and
    the future completes when the reduced bucket is in memory. On a GPU (nccl, ``cuda``)
    host clocks would measure nothing useful: ProcessGroupNCCL marks a collective's future
    complete as soon as the allreduce is *enqueued* on NCCL's stream (the future carries
    CUDA events; ``then()`` callbacks run at once, on streams that wait for those events),
    so the host sees only the launch cost. There the timer uses CUDA events instead: one
    recorded on the compute stream when DDP calls the hook (it fires when the bucket's
    gradients are computed), one recorded in the ``then()`` callback (it fires when the
    allreduce and the hook's division have run on the GPU). A bucket's time is the GPU
    time between them: the allreduce including waiting for the slower rank, the GPU-side
    counterpart of the CPU definition. The events are read after the block's
    ``synchronize`` (``flush``), so timing adds no per-step host stall."""

    def __init__(self, inner, cuda: bool = False):
        self.inner = inner
        self.cuda = bool(cuda)
        self.step_s = 0.0
        self.buckets = 0
        self.samples: list[float] = []
        self._events: list = []  # CUDA: this step's (start, end) event pairs
        self._pending: list[list] = []  # CUDA: finished steps' pairs, read by flush()
        self._lock = threading.Lock()  # the callback runs on the backend's thread

    def hook(self, state, bucket):  # DDP checks the name "bucket"; no annotations
        if self.cuda:
            return self._cuda_hook(state, bucket)
        t0 = time.perf_counter()
        fut = self.inner(state, bucket)

        def done(f):
            dt = time.perf_counter() - t0
            with self._lock:
                self.step_s += dt
                self.buckets += 1
            return f.value()

        return fut.then(done)

    def _cuda_hook(self, state, bucket):
        start = torch.cuda.Event(enable_timing=True)
        start.record()  # the compute stream: fires when the bucket's gradients are done
        fut = self.inner(state, bucket)

        def done(f):
            end = torch.cuda.Event(enable_timing=True)
            end.record()  # this callback's stream waits for the allreduce's events
            with self._lock:
                self._events.append((start, end))
            return f.value()

        return fut.then(done)

    def flush(self) -> None:
        """CUDA: turn the finished steps' event pairs into ``samples`` (seconds, sum over
        buckets); call after ``torch.cuda.synchronize`` (the events have fired)."""
        with self._lock:
            for pairs in self._pending:
                self.samples.append(sum(a.elapsed_time(b) for a, b in pairs) / 1000.0)
            self._pending = []

    def end_step(self) -> None:
        with self._lock:
            if self.cuda:
                if self._events:
                    self._pending.append(self._events)
                self._events = []
                return
            if self.buckets:
                self.samples.append(self.step_s)
            self.step_s, self.buckets = 0.0, 0


def default_hook(compression: str):
    """DDP's own hook for ``horovod.compression``: the allreduce average, or with fp16 the
    same on a float16 copy of the bucket."""
    from torch.distributed.algorithms.ddp_comm_hooks import (  # reason: only with DDP
        default_hooks,
    )

    if compression == "fp16":
        return default_hooks.fp16_compress_hook
    return default_hooks.allreduce_hook


class TorchStepProgram:
    """One rank's DDP model, its data (normalised arrays as tensors on the rank's device:
    ``worker.device``, the CPU when None) and steps."""

    def __init__(self, optim: TorchOptimisation, worker, training: dict, *, train, test,
                 val, batch: int):  # fmt: skip
        self.optim, self.worker = optim, worker
        self.net = optim.net
        self.device = getattr(worker, "device", None) or torch.device("cpu")
        self.sync = synchronizer(self.device)
        ids = [self.device.index] if self.device.type == "cuda" else None
        # issue 32: the step's arithmetic and compilation (torch_ddp.precision_compile); DDP
        # wraps the compiled network (precision_compile says why not the other way round)
        self.precision = training.get("precision", "fp32")
        self.compile = training.get("compile", "off")
        set_matmul_precision(self.precision)
        self.scaler = grad_scaler(self.precision, self.device)
        # fp16: the updates made or skipped, and the skipped ones (loss_scale_state)
        self.updates = self.skipped_updates = 0
        self.model = compiled(self.net, self.compile, self.device)
        # the compile cache's hits and misses: null until warm_up has compiled (eager: null)
        self.record_config = {
            "compile_mode": compile_mode(self.compile, self.device),
            **compile_cache_facts(None),
        }
        self.ddp = DistributedDataParallel(self.model, device_ids=ids)  # no buffers to sync
        self.hook_timer: CommHookTimer | None = None
        if worker.distributed:
            self.hook_timer = CommHookTimer(
                default_hook(training["horovod"]["compression"]),
                cuda=self.device.type == "cuda",
            )
            self.ddp.register_comm_hook(None, self.hook_timer.hook)
        self.bpps = int(training["horovod"]["backward_passes_per_step"])
        self.batch = int(batch)
        self.x, self.y = self._on_device(train[0]), self._on_device(train[1])
        self.x_test, self.y_test = self._on_device(test[0]), self._on_device(test[1])
        self.has_val = val[0] is not None
        self.x_val = self._on_device(val[0]) if self.has_val else self.x_test
        self.y_val = self._on_device(val[1]) if self.has_val else self.y_test
        self.n_local = len(self.x)
        self.params = [p for p in self.net.parameters() if p.requires_grad]
        self.micro = 0
        self.perm = torch.arange(self.n_local, device=self.device)
        self.loss_sum = self._zero()  # float64 on the device: no host read per step
        self.timers = np.zeros(len(STEP_PARTS))  # the four phases and the noise-scale sums
        self.gsq = np.zeros(3)
        self.no_comm_s: list[float] = []  # per timed step: data + compute + update
        self.eval_correct = {"val": 0.0, "test": 0.0}  # cross_entropy: correct predictions
        self.loss_name = getattr(optim, "loss", "mse")  # the workload's loss

    # ------------------------------------------------------------------ the steps

    def _on_device(self, arr: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(arr).to(self.device)

    def _zero(self) -> torch.Tensor:
        return torch.zeros((), dtype=torch.float64, device=self.device)

    def _phase_end(self, phase: str) -> None:
        """Called when the work of ``phase`` (a part of hvdscale.record.timing.STEP_PARTS:
        data, compute, sync, update, or noise, the noise-scale sums) is done and before its
        end is read (timed steps): nothing here. What a subclass does here counts as that
        phase's time (docs/timing.md: how a known delay here validates the attribution)."""

    def _batch(self, j: int):
        idx = self.perm[j * self.batch : (j + 1) * self.batch]
        return self.x[idx], self.y[idx]

    def _loss(self, x, y) -> torch.Tensor:
        with autocast(self.precision, self.device):
            return (LOSSES[self.loss_name] or mse)(self.ddp(x), y)

    def _backward(self, loss: torch.Tensor) -> None:
        (
            loss / self.bpps if self.scaler is None else self.scaler.scale(loss / self.bpps)
        ).backward()

    def _update(self) -> None:
        self.optim.set_lr()
        if self.scaler is None:
            self.optim.optimizer.step()
        else:  # unscale, skip an update with non-finite gradients, adapt the scale
            self.scaler.step(self.optim.optimizer)
            # GradScaler counts no skipped steps: update() halves the scale exactly when
            # step() skipped (non-finite gradients) and otherwise keeps or doubles it. Both
            # reads are after step(), which has already waited for the device
            before = self.scaler.get_scale()
            self.scaler.update()
            self.updates += 1
            self.skipped_updates += int(self.scaler.get_scale() < before)
        self.optim.optimizer.zero_grad(set_to_none=True)

    def _plain_step(self, j: int) -> None:
        x, y = self._batch(j)
        self.micro += 1
        last = self.micro % self.bpps == 0
        if last:
            loss = self._loss(x, y)
            self._backward(loss)  # DDP: the allreduce overlaps this pass
        else:
            with self.ddp.no_sync():
                loss = self._loss(x, y)
                self._backward(loss)
        self.loss_sum += loss.detach().double()
        if last:
            if self.hook_timer is not None:
                self.hook_timer.end_step()
            self._update()

    def _timed_step(self, j: int) -> None:
        self.sync()  # nothing queued before may count as this step's (GPU; CPU no-op)
        t0 = time.perf_counter()
        x, y = self._batch(j)
        self.sync()
        self._phase_end("data")
        t1 = time.perf_counter()
        self.micro += 1
        with self.ddp.no_sync():
            loss = self._loss(x, y)
            self._backward(loss)
        self.loss_sum += loss.detach().double()
        self.sync()
        self._phase_end("compute")
        t2 = time.perf_counter()
        t3 = t4 = t2
        noise = 0.0
        if self.micro % self.bpps == 0:
            noise = self._allreduce_grads()
            self.sync()
            self._phase_end("sync")
            t3 = time.perf_counter()
            self._update()
            self.sync()
            self._phase_end("update")
            t4 = time.perf_counter()
        # the noise-scale sums belong to no phase (plain steps do not compute them)
        self.timers += (t1 - t0, t2 - t1, t3 - t2 - noise, t4 - t3, noise)
        self.no_comm_s.append((t1 - t0) + (t2 - t1) + (t4 - t3))

    def _allreduce_grads(self) -> float:
        """DDP's average by hand, in one flat buffer (timed steps); with more than one
        rank also |g_local|^2 and |g_allreduced|^2 for the gradient noise scale. Returns
        the seconds those sums took (not sync time: the caller takes them out)."""
        if not self.worker.distributed:
            return 0.0
        grads = [p.grad for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        t = time.perf_counter()
        # fp16: the gradients are still scaled here (GradScaler unscales in the update)
        inv2 = 1.0 if self.scaler is None else float(self.scaler.get_scale()) ** -2
        local_sq = float(torch.sum(flat.double() ** 2)) * inv2
        noise = time.perf_counter() - t
        self.worker.dist.all_reduce(flat)
        flat /= self.worker.size
        at = 0
        for g in grads:
            g.copy_(flat[at : at + g.numel()].view_as(g))
            at += g.numel()
        t = time.perf_counter()
        self.gsq += (local_sq, float(torch.sum(flat.double() ** 2)) * inv2, 1.0)
        self._phase_end("noise")
        return noise + time.perf_counter() - t

    # ------------------------------------------------------------------ host side

    def close(self) -> None:
        """Drop the DDP wrapper (its reducer, buckets and hooks) while the process group
        still exists; the plain module stays usable for evaluation."""
        self.ddp = None
        gc.collect()

    def warm_up(self, spe: int) -> None:
        """Compile the model (``training.compile``) before the epoch loop, so no epoch
        time holds compilation: ``WARM_UP_PASSES`` forward and backward passes of the
        first batch rows, synchronised as a plain step synchronises, then the gradients
        are dropped (weights, optimizer state and loss scale stay as they were; every
        rank runs them, so the allreduces pair up). Eager: nothing. The record's config
        gets the compile cache's hits and misses of this compilation and its folder
        (``precision_compile.compile_cache_facts``)."""
        if self.model is self.net:
            return
        before = cache_counts()
        self.net.train()
        x, y = self.x[: self.batch], self.y[: self.batch]
        for _ in range(WARM_UP_PASSES):
            loss = self._loss(x, y)
            self._backward(loss)
            if self.hook_timer is not None:
                self.hook_timer.end_step()
            self.optim.optimizer.zero_grad(set_to_none=True)
        with self.ddp.no_sync():  # the timed steps' path
            self._backward(self._loss(x, y))
        self.optim.optimizer.zero_grad(set_to_none=True)
        self.sync()
        if self.hook_timer is not None:
            self.hook_timer.flush()
            self.hook_timer.samples = []
        self.record_config.update(compile_cache_facts(before))

    def start_epoch(self, perm: np.ndarray) -> None:
        self.perm = torch.from_numpy(np.asarray(perm, dtype=np.int64)).to(self.device)
        self.loss_sum = self._zero()
        self.timers = np.zeros(len(STEP_PARTS))  # the four phases and the noise-scale sums
        self.gsq = np.zeros(3)
        self.no_comm_s = []
        if self.hook_timer is not None:
            self.hook_timer.samples = []

    def run_steps(self, start: int, n: int, timed: bool) -> float:
        """Steps start..start+n-1 of the epoch; 0 host-side data time (the data phase of
        a timed step is in ``timers``). Returns after the device has run them (the
        loop's clock around this call is the headline time)."""
        step = self._timed_step if timed else self._plain_step
        self.net.train()
        for j in range(start, start + n):
            step(j)
        self.sync()
        if self.hook_timer is not None:
            self.hook_timer.flush()  # CUDA: read the comm-hook events (CPU: nothing)
        return 0.0

    def epoch_results(self) -> tuple[float, np.ndarray]:
        return float(self.loss_sum.item()), self.timers.copy()

    def loss_scale_state(self) -> dict | None:
        """fp16 runs: the record's ``loss_scale`` block (issue 32): GradScaler's scale
        now (``final``), the updates skipped for non-finite gradients and all updates
        (made or skipped) since this program was built; None without a scaler."""
        if self.scaler is None:
            return None
        return {"final": float(self.scaler.get_scale()),
                "skipped_updates": self.skipped_updates, "updates": self.updates}  # fmt: skip

    def sync_fields(self) -> dict:
        """This epoch's samples for the record's ``timing.sync`` (module docstring): the
        median per-step time in DDP's communication hook (plain steps) and of the step
        without communication (timed steps); None without samples or with one rank."""
        if not self.worker.distributed:
            return {"comm_hook_step_s": None, "step_s_no_comm": None}
        hook = self.hook_timer.samples if self.hook_timer is not None else []
        return {"comm_hook_step_s": _median(hook), "step_s_no_comm": _median(self.no_comm_s)}

    def grad_sq(self) -> tuple[float, float, int]:
        a, b, n = (float(v) for v in self.gsq)
        return a, b, int(round(n))

    @torch.no_grad()
    def _sse(self, xs: torch.Tensor, ys: torch.Tensor, split: str = "val") -> float:
        self.net.eval()
        if self.loss_name == "cross_entropy":  # a classifier: cross-entropies, correct ones
            loss_sum, correct = self._zero(), self._zero()
            for a in range(0, len(xs), EVAL_BATCH):
                logits, y = self.net(xs[a : a + EVAL_BATCH]).float(), ys[a : a + EVAL_BATCH]
                loss_sum += torch.nn.functional.cross_entropy(logits, y, reduction="sum").double()
                correct += (logits.argmax(dim=1) == y).sum().double()
            self.eval_correct[split] = float(correct.item())
            return float(loss_sum.item())
        sse = self._zero()
        for a in range(0, len(xs), EVAL_BATCH):
            err = torch.square(self.net(xs[a : a + EVAL_BATCH]) - ys[a : a + EVAL_BATCH])
            sse += torch.sum(err.double())
        return float(sse.item())

    def _values(self, ys: torch.Tensor) -> int:
        """Values a loss sum covers: rows (a classifier) or rows x labels."""
        per_row = 1 if self.loss_name == "cross_entropy" else int(np.prod(tuple(ys.shape[1:])))
        return int(ys.shape[0]) * per_row

    def test_sse(self) -> tuple[float, int]:
        return self._sse(self.x_test, self.y_test, "test"), self._values(self.y_test)

    def val_sse(self) -> tuple[float, int]:
        if not self.has_val:
            raise ValueError("TorchStepProgram: built without a validation split")
        return self._sse(self.x_val, self.y_val), self._values(self.y_val)
