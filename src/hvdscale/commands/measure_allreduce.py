"""Time Horovod allreduce of float32 tensors over a range of message sizes (one rank).

Started as N ranks like a training run: `hvdscale launch --program measure-allreduce
--allreduce-id {partition}_{backend}_n{nodes}_w{workers} --out results/allreduce/ID.csv`.
For every size: warm-up iterations (not timed), then timed iterations; before each one
the ranks meet in a barrier, and an iteration's time is the slowest rank's time of one
``hvd.allreduce`` (Sum) call, completed (a host read of one element). The CSV (written by rank 0,
atomically) has one row per size:

  partition, backend, workers, nodes, bytes, time_s (median), p10, p90, algbw, busbw,
  iterations

with algbw = bytes / time_s and busbw = algbw * 2 (p - 1) / p (bytes/s, as nccl-tests
define them for allreduce), the input of the ring-allreduce cost model.

Example (as one rank, without a launcher):
  hvdscale measure-allreduce --out /tmp/ar.csv --partition local --backend gloo --sizes 8:1Mi:x4
"""

from __future__ import annotations

from hvdscale.trainer.horovod_tf.allreduce import Sweep, measure, parse_sizes


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
