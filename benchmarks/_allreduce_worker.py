"""One rank of bench_allreduce_bare.py (train env): a bare allreduce of a float32 tensor
in a loop, nothing else. Not a user command.

  --framework horovod  hvd.allreduce (Sum) inside a tf.function, as hvdscale's step
                       reduces its gradients (``--tensors N``: N equal parts through
                       hvd.grouped_allreduce, like a model's gradient list); started by
                       horovodrun (--mpi or --gloo)
  --framework torch    torch.distributed.all_reduce with the gloo backend (a reference;
                       started by bench_allreduce_bare.py with RANK/WORLD_SIZE/MASTER_*)
  --framework tfcall   the same tf.function call without any collective (a multiply of
                       the tensor): what a call costs by itself (started like torch)

``--bind 1`` pins rank r to core r before any thread starts (hvdscale's cpu_binding
core). Every call is timed on the host (perf_counter around the call, which on the CPU
returns when the reduction is done); ``--warmup`` calls first, not timed. Writes
OUT.rankR.json: the per-call times in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def bind(enabled: int) -> list[int] | None:
    if not enabled:
        return None
    from hvdscale.trainer.placement import bind_cpus

    return bind_cpus("core")


def horovod_times(a) -> tuple[int, list[float]]:
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import horovod.tensorflow as hvd

    hvd.init()  # HVD:
    n = a.params // a.tensors
    sizes = [n] * (a.tensors - 1) + [a.params - n * (a.tensors - 1)]
    xs = [tf.random.stateless_normal([k], seed=[1, i]) for i, k in enumerate(sizes)]

    if a.tensors == 1:

        @tf.function
        def step(x):
            return hvd.allreduce(x[0], op=hvd.Sum)  # HVD:

    else:

        @tf.function
        def step(x):
            return hvd.grouped_allreduce(x, op=hvd.Sum)  # HVD:

    times = []
    for i in range(a.warmup + a.iters):
        t0 = time.perf_counter()
        step(xs)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    rank = hvd.rank()
    hvd.shutdown()  # HVD:
    return rank, times


def tfcall_times(a) -> tuple[int, list[float]]:
    """The same loop and tf.function call without Horovod: the call's own cost (a
    multiply makes a new tensor of the gradient's size, as the allreduce's output is)."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    xs = [tf.random.stateless_normal([a.params], seed=[1, 0])]
    one = tf.constant(1.0)

    @tf.function
    def step(x, s):
        return x[0] * s

    times = []
    for i in range(a.warmup + a.iters):
        t0 = time.perf_counter()
        step(xs, one)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    return int(os.environ.get("RANK", "0")), times


def torch_times(a) -> tuple[int, list[float]]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # RANK, WORLD_SIZE, MASTER_ADDR/PORT from the env
    x = torch.randn(a.params)
    times = []
    for i in range(a.warmup + a.iters):
        t0 = time.perf_counter()
        dist.all_reduce(x)
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    rank = dist.get_rank()
    dist.destroy_process_group()
    return rank, times


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--framework", choices=["horovod", "torch", "tfcall"], default="horovod")
    ap.add_argument("--params", type=int, default=153441, help="float32 elements")
    ap.add_argument("--tensors", type=int, default=1, help="split into this many tensors")
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--bind", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    cores = bind(a.bind)
    fns = {"horovod": horovod_times, "torch": torch_times, "tfcall": tfcall_times}
    rank, times = fns[a.framework](a)
    affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    Path(f"{a.out}.rank{rank}.json").write_text(
        json.dumps({"rank": rank, "times": times, "bound": cores, "affinity": affinity})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
