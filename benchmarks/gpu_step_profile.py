"""Where a torch-ddp step's time goes on one GPU (issue 32/33): the host's cost of each part
of a plain step against the GPU's busy time, eager and compiled, batch 75 and 1000.

The reference study found GPU utilisation "very low" with this network at batch 75 and
blamed the CPU-GPU overhead. This script measures that claim on the trainer's own step
program (``hvdscale.trainer.torch_ddp.step.TorchStepProgram``, one rank, world size 1,
nccl on ``cuda:0``; random data, as timing does not depend on the values): per variant
(``COMPILE/PRECISION``, as in gpu_batch_sweep.py) and batch size, after the warm-up,

  wall_us         wall time per plain step: ``--steps`` steps, one synchronize at the end
  gpu_busy_us     GPU kernel time per step (torch.profiler, CUDA activity; the sum of
                  the kernels' durations) and gpu_busy_share = gpu_busy_us / wall_us
  kernels         CUDA kernels launched per step
  host_us.PART    host time per step of each part of the step, without synchronising
                  (what the Python thread spends issuing it): data (the batch gather),
                  forward_ddp (DDP's forward with the loss, as the trainer runs it),
                  forward_plain (the same network without the DDP wrapper: DDP's own
                  host cost is the difference), backward, update (KerasAdam, LR, zero_grad)

When host_us summed is close to wall_us and gpu_busy_share is low, the step is bound by
the host issuing work, not by the GPU computing it. Writes
benchmarks/results/gpu_step_profile.csv (one row per variant, batch and part; provenance
and load columns of benchmarks/_results.py).

  PYTHONPATH=src python3 benchmarks/gpu_step_profile.py [--batches 75,1000]
      [--variants off/fp32,max/fp32] [--steps 200] [--out CSV] [--commit SHA]
  --device cpu: the same on the CPU with gloo (a smoke test; no GPU columns)

Needs numpy, torch (CUDA build, a GPU unless --device cpu), PyYAML and jsonschema.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _results import (  # noqa: E402
    Measured,
    add_quiet_args,
    configure_quiet,
    machine,
    quiet_main,
    write_csv,
)
from gpu_batch_sweep import check_cuda, parse_variant  # noqa: E402  (the sweep's checks)

PARTS = ["data", "forward_ddp", "forward_plain", "backward", "update"]


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="75,1000", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--variants", default="off/fp32,max/fp32", type=lambda s: s.split(","))
    ap.add_argument("--steps", type=int, default=200, help="timed plain steps per case")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--out", type=Path, default=None, help="CSV (default: benchmarks/results)")
    ap.add_argument("--commit", default=None, help="the commit column (a tree without .git)")
    add_quiet_args(ap)
    return ap.parse_args(argv)


def program_for(cfg: dict, worker, device, batch: int, n_rows: int):
    import numpy as np

    from hvdscale.trainer.torch_ddp.net import TorchOptimisation
    from hvdscale.trainer.torch_ddp.step import TorchStepProgram

    rng = np.random.default_rng(0)
    x = rng.normal(size=(n_rows, cfg["data"]["n_points"], 3)).astype(np.float32)
    y = rng.normal(size=(n_rows, 2)).astype(np.float32) * 0.1
    optim = TorchOptimisation.build(cfg, "none", 1, steps=n_rows // batch, seed=0, device=device)
    program = TorchStepProgram(optim, worker, cfg["training"], train=(x, y), test=(x, y),
                               val=(x, y), batch=batch)  # fmt: skip
    program.start_epoch(np.arange(n_rows))
    return program


def host_parts(program, steps: int) -> dict:
    """Median host time per part of a plain step (no synchronisation inside the step)."""
    import torch

    from hvdscale.trainer.torch_ddp.speed import autocast
    from hvdscale.trainer.torch_ddp.step import mse

    samples = {p: [] for p in PARTS}
    n_batches = program.n_local // program.batch
    for i in range(steps):
        j = i % n_batches
        t0 = time.perf_counter()
        x, y = program._batch(j)
        t1 = time.perf_counter()
        with torch.no_grad(), autocast(program.precision, program.device):
            mse(program.model(x), y)  # the network without DDP's wrapper
        t2 = time.perf_counter()
        loss = program._loss(x, y)
        t3 = time.perf_counter()
        program._backward(loss)
        t4 = time.perf_counter()
        program.loss_sum += loss.detach().double()
        program._update()
        t5 = time.perf_counter()
        for p, dt in zip(PARTS, (t1 - t0, t3 - t2, t2 - t1, t4 - t3, t5 - t4)):
            samples[p].append(dt * 1e6)
    program.sync()
    return {p: statistics.median(v) for p, v in samples.items()}


def gpu_time(program, steps: int, cuda: bool) -> tuple[float, float, int]:
    """(wall_us, gpu_busy_us, kernels) per plain step over ``steps`` steps."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    n_batches = program.n_local // program.batch
    program.sync()
    t0 = time.perf_counter()
    for i in range(steps):
        program._plain_step(i % n_batches)
    program.sync()
    wall = (time.perf_counter() - t0) / steps * 1e6
    if not cuda:
        return wall, float("nan"), 0
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            program._plain_step(i % n_batches)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy = sum(e.time_range.elapsed_us() for e in kernels)
    return wall, busy / steps, round(len(kernels) / steps)


def profile_case(cfg: dict, worker, device, variant: str, batch: int, steps: int) -> list[dict]:
    from hvdscale.matrix.config import validate_config

    comp, prec = parse_variant(variant)
    c = validate_config({**cfg, "training": {**cfg["training"], "compile": comp,
                                             "precision": prec}})  # fmt: skip
    n_rows = batch * max(8, min(64, 20000 // batch))
    program = program_for(c, worker, device, batch, n_rows)
    t = time.perf_counter()
    program.warm_up(1)
    warm = time.perf_counter() - t
    for i in range(10):  # settle (allocator, CUDA graph replay)
        program._plain_step(i % (n_rows // batch))
    program.sync()
    with Measured(f"step profile {variant} b{batch}") as m:  # load and foreign CPU
        host = host_parts(program, steps)
        wall, busy, kernels = gpu_time(program, steps, device.type == "cuda")
    program.close()
    base = {"variant": variant, "compile": comp, "precision": prec, "batch": batch,
            "steps": steps, "warm_up_s": round(warm, 3), "wall_us": wall,
            "gpu_busy_us": busy if busy == busy else None,
            "gpu_busy_share": busy / wall if busy == busy else None,
            "kernels": kernels if device.type == "cuda" else None,
            "host_us_sum": sum(v for p, v in host.items() if p != "forward_plain"),
            **m.fields()}  # fmt: skip
    return [{**base, "part": p, "host_us": host[p]} for p in PARTS]


@quiet_main
def main(argv=None) -> int:
    a = parse_args(argv)
    gpu = check_cuda() if a.device == "cuda" else "none (CPU)"  # Unfit (exit 2) without one
    import torch

    from hvdscale.matrix.config import validate_config
    from hvdscale.trainer.torch_ddp.dist import TorchWorker

    configure_quiet(a)
    device = torch.device("cuda:0" if a.device == "cuda" else "cpu")
    os.environ.pop("RANK", None)  # a private one-rank group
    worker = TorchWorker.init("nccl" if a.device == "cuda" else "gloo", device)
    part = "gpu" if a.device == "cuda" else "cpu"
    cfg = validate_config({
        "model": {"hidden_units": [192, 175, 24], "expected_parameters": 153441},
        "training": {"learning_rate": 4.7331e-4},
        "scaling": {"partitions": {part: {"gpus_per_node": int(a.device == "cuda"),
                                          "cores_per_node": 16, "mem_mb_per_node": 64000}},
                    "sweeps": [{"partitions": [part], "workers": [1], "frameworks": ["torch-ddp"],
                                "backends": ["nccl" if a.device == "cuda" else "gloo"],
                                "batch_sizes": a.batches, "lr_rules": ["none"]}]},
    })  # fmt: skip
    rows = []
    for v in a.variants:
        for b in a.batches:
            case = profile_case(cfg, worker, device, v, b, a.steps)
            r = case[0]
            parts = ", ".join(f"{x['part']} {x['host_us']:.0f}" for x in case)
            print(f"  {v:10s} b{b:5d}: wall {r['wall_us']:8.1f} us/step, GPU busy "
                  f"{r['gpu_busy_us']} us ({r['gpu_busy_share']}), {r['kernels']} kernels, "
                  f"host {parts}", flush=True)  # fmt: skip
            rows += case
    common = {"machine": f"{machine()}, GPU {gpu}", **({"commit": a.commit} if a.commit else {})}
    write_csv("gpu_step_profile", [{**common, **r} for r in rows], a.out)
    worker.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
