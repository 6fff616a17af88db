"""The allreduce sweep of ``hvdscale measure-allreduce`` (``run``, at the end of this
module): Horovod allreduce of float32 tensors over a range of message sizes, timed on one rank.

For every size: warm-up iterations (not timed), then timed iterations; before each one
the ranks meet in a barrier, and an iteration's time is the slowest rank's time of one
``hvd.allreduce`` (Sum) call, completed (a host read of one element). Rank 0 writes the
CSV (atomically), one row per size (``COLUMNS``), with algbw = bytes / time_s and busbw =
algbw * 2 (p - 1) / p (bytes/s, as nccl-tests define them for allreduce), the input of
the ring-allreduce cost model.
"""

from __future__ import annotations

import csv
import io
import os
import re
import sys
import time
from dataclasses import dataclass

import numpy as np

from hvdscale.errors import UserError
from hvdscale.io import write_text_atomic
from hvdscale.trainer.worker import WorkerInfo

COLUMNS = [
    "partition",
    "backend",
    "workers",
    "nodes",
    "bytes",
    "time_s",
    "p10",
    "p90",
    "algbw",
    "busbw",
    "iterations",
]
_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "ki": 1024,
    "m": 1000**2,
    "mi": 1024**2,
    "g": 1000**3,
    "gi": 1024**3,
}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?[iI]?)[bB]?\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise UserError(f"size {text!r}: expected a byte count such as 8, 64Ki, 128Mi")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_sizes(spec: str) -> list[int]:
    """``MIN:MAX[:xSTEP]`` (STEP 2 or 4; default x2) -> sizes in bytes, multiples of 4."""
    parts = spec.split(":")
    if len(parts) not in (2, 3):
        raise UserError(f"--sizes {spec!r}: expected MIN:MAX or MIN:MAX:xSTEP, e.g. 8:128Mi:x2")
    lo, hi = parse_size(parts[0]), parse_size(parts[1])
    step = 2
    if len(parts) == 3:
        m = re.fullmatch(r"x?([24])", parts[2].strip())
        if not m:
            raise UserError(f"--sizes {spec!r}: step must be x2 or x4")
        step = int(m.group(1))
    if lo < 4 or hi < lo:
        raise UserError(f"--sizes {spec!r}: need 4 <= MIN <= MAX")
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s - s % 4)
        s *= step
    return sizes


def bus_bandwidth(algbw: float, p: int) -> float:
    return algbw * 2 * (p - 1) / p if p > 1 else algbw


@dataclass(frozen=True)
class Sweep:
    """What to measure and what the CSV says about it."""

    out: str  # the CSV (rank 0 writes it)
    partition: str
    backend: str | None  # None: from HOROVOD_CPU_OPERATIONS (else the controller)
    nodes: int | None  # None: the distinct host names
    sizes: list[int]  # message sizes in bytes (parse_sizes)
    iterations: int  # timed, per size
    warmup_iterations: int  # untimed, per size


def measure(sweep: Sweep) -> int:
    """Time the allreduce of every size of ``sweep`` on this rank; rank 0 writes the CSV.
    Exit status."""
    if sweep.iterations < 1 or sweep.warmup_iterations < 0:
        raise UserError("--iterations must be >= 1 and --warmup-iterations >= 0")
    worker = WorkerInfo.init()  # HVD: hvd.init() first
    import tensorflow as tf  # reason: TensorFlow lives in the train env only

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.set_visible_devices(
            gpus[worker.local_rank % len(gpus)], "GPU"
        )  # HVD: one GPU per local rank
    if worker.hvd is None:
        raise UserError("measure-allreduce needs Horovod (train env)")
    backend = sweep.backend or os.environ.get("HOROVOD_CPU_OPERATIONS", worker.controller).lower()
    hosts = worker.allgather_object(worker.hostname, name="ar_hosts")  # HVD:
    nodes = sweep.nodes or len(set(hosts))
    device = "/GPU:0" if gpus else "/CPU:0"
    rows = []
    for nbytes in sweep.sizes:
        n, slowest = time_allreduce(tf, worker, device, nbytes, sweep)
        rows.append(_size_row(sweep, backend, worker.size, nodes, n, slowest))
        if worker.is_root:
            print(
                f"[measure-allreduce] {4 * n:>10d} B  {rows[-1]['time_s'] * 1e6:10.1f} us  "
                f"busbw {rows[-1]['busbw'] / 1e9:8.3f} GB/s",
                flush=True,
            )
    worker.barrier(name="ar_end")
    if worker.is_root:
        _write_rows(sweep.out, rows)
        print(
            f"[measure-allreduce] wrote {sweep.out} ({len(rows)} sizes, {worker.size} workers)",
            file=sys.stderr,
        )
    return 0


def time_allreduce(tf, worker, device: str, nbytes: int, sweep: Sweep) -> tuple[int, list]:
    """(float32 elements, slowest rank's seconds per timed iteration) for one message size."""
    hvd, p = worker.hvd, worker.size
    n = max(1, nbytes // 4)
    with tf.device(device):
        x = tf.ones([n], tf.float32)
    times = []
    for it in range(sweep.warmup_iterations + sweep.iterations):
        worker.barrier(name="ar_barrier")
        t0 = time.perf_counter()
        y = hvd.allreduce(x, op=hvd.Sum, name=f"ar_{nbytes}")  # HVD: the measured collective
        _ = y[0].numpy()  # completion
        dt = time.perf_counter() - t0
        if it >= sweep.warmup_iterations:
            times.append(dt)
    if abs(float(y[0].numpy()) - p) > 1e-3 * p:
        raise RuntimeError(
            f"allreduce of {nbytes} bytes returned {float(y[0].numpy())}, expected {p}"
        )
    slowest = worker.allreduce(
        times, op="max", name=f"ar_times_{nbytes}"
    )  # HVD: slowest rank per iteration
    return n, slowest


def _size_row(sweep: Sweep, backend: str, p: int, nodes: int, n: int, slowest) -> dict:
    """One CSV row: median and percentiles of the slowest rank's time, bandwidths."""
    med = float(np.median(slowest))
    algbw = (4 * n) / med if med > 0 else 0.0
    return {
        "partition": sweep.partition,
        "backend": backend,
        "workers": p,
        "nodes": nodes,
        "bytes": 4 * n,
        "time_s": med,
        "p10": float(np.percentile(slowest, 10)),
        "p90": float(np.percentile(slowest, 90)),
        "algbw": algbw,
        "busbw": bus_bandwidth(algbw, p),
        "iterations": sweep.iterations,
    }


def _write_rows(path, rows: list[dict]) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: (f"{v:.9g}" if isinstance(v, float) else v) for k, v in r.items()})
    write_text_atomic(path, buf.getvalue())


# -------------------------------------------------- the command: hvdscale measure-allreduce


def add_arguments(p):
    p.add_argument("--out", required=True, help="output CSV (rank 0 writes it atomically)")
    p.add_argument("--partition", default="local", help="partition name for the CSV")
    p.add_argument(
        "--backend",
        default=None,
        help="backend name for the CSV (default: from HOROVOD_CPU_OPERATIONS)",
    )
    p.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="node count for the CSV (default: distinct host names)",
    )
    p.add_argument(
        "--sizes",
        default="8:128Mi:x2",
        help="MIN:MAX[:xSTEP] message sizes in bytes (default 8:128Mi:x2)",
    )
    p.add_argument(
        "--iterations", type=int, default=20, help="timed iterations per size (default 20)"
    )
    p.add_argument(
        "--warmup-iterations", type=int, default=3, help="untimed iterations per size (default 3)"
    )


def run(args) -> int:
    """Time Horovod allreduce of float32 tensors over a range of message sizes (one rank).

    Started as N ranks like a training run: `hvdscale launch --program measure-allreduce
    --allreduce-id {partition}_{backend}_n{nodes}_w{workers} --out results/allreduce/ID.csv`.
    For every size: warm-up iterations (not timed), then timed iterations; before each one
    the ranks meet in a barrier, and an iteration's time is the slowest rank's time of one
    ``hvd.allreduce`` (Sum) call, completed (a host read of one element). The CSV (written
    by rank 0, atomically) has one row per size:

      partition, backend, workers, nodes, bytes, time_s (median), p10, p90, algbw, busbw,
      iterations

    with algbw = bytes / time_s and busbw = algbw * 2 (p - 1) / p (bytes/s, as nccl-tests
    define them for allreduce), the input of the ring-allreduce cost model.

    Example (as one rank, without a launcher):
      hvdscale measure-allreduce --out /tmp/ar.csv --partition local --backend gloo --sizes 8:1Mi:x4
    """
    sweep = Sweep(
        out=args.out,
        partition=args.partition,
        backend=args.backend,
        nodes=args.nodes,
        sizes=parse_sizes(args.sizes),
        iterations=args.iterations,
        warmup_iterations=args.warmup_iterations,
    )
    return measure(sweep)
