"""Would several steps per call pay for the torch-ddp trainer on the CPU? (issue 32)

The Horovod-TF trainer runs 64 steps per ``tf.function`` call; the torch-ddp trainer calls
its step once per batch from Python. Several steps per call can only remove what a step
spends outside the operators' kernels: the Python of the step, the module calls, the
autograd engine's bookkeeping and the dispatcher between operators. This script measures
that share on the trainer's own step program (``TorchStepProgram``, one rank, world size 1,
gloo, one thread, random data), per variant (``COMPILE/PRECISION``) and batch size:

  wall_us          wall time per plain step (``--steps`` steps, no profiler)
  prof_wall_us     the same under torch.profiler (CPU activity)
  aten_us          time per step inside ATen operators: the sum of the ``aten::`` events'
                   self CPU time under the profiler (the kernels, with each operator's
                   own dispatch)
  outside_us       prof_wall_us - aten_us: what no operator accounts for (Python, module
                   calls, the autograd engine, DDP's hooks), and the profiler's own
                   recording between operators, so an upper bound; outside_share its
                   fraction of prof_wall_us
  outside_plain_us wall_us - aten_us: the same against the step without the profiler (a
                   lower estimate where the profiler inflates the operators' own times)
  bound_speedup    prof_wall_us / aten_us: the most any number of steps per call could
                   give if it removed all of the outside time and nothing else changed
  host_us.PART     host time per part of the step (gpu_step_profile.host_parts)

``--mkl intel`` runs the cases with torch's MKL on its Intel code path
(``training.mkl_code_path: intel``: the script restarts itself with hvdscale.native's
mkl_intel_path.so in LD_PRELOAD); every row says its ``mkl_code_path``. ``--add`` keeps
the rows of other (variant, MKL path) pairs already in the CSV.

A small outside_share means the torch step is bound by its kernels (the fp32 GEMM that MKL
runs on this CPU, issue 32's table), and several steps per call cannot close the gap to
Horovod-TF. Writes benchmarks/results/torch_step_overhead.csv (one row per variant, batch
and part; provenance and load columns of benchmarks/_results.py).

  PYTHONPATH=src taskset -c 1 .venv-train/bin/python benchmarks/torch_step_overhead.py
      [--batches 75,1000] [--variants off/fp32,default/fp32,off/bf16] [--steps 200]
      [--mkl vendor|intel] [--add]
"""

from __future__ import annotations

import argparse
import os
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
from gpu_batch_sweep import parse_variant  # noqa: E402
from gpu_step_profile import PARTS, host_parts, program_for  # noqa: E402


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="75,1000", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument(
        "--variants", default="off/fp32,default/fp32,off/bf16", type=lambda s: s.split(",")
    )
    ap.add_argument("--steps", type=int, default=200, help="timed plain steps per case")
    ap.add_argument("--out", type=Path, default=None, help="CSV (default: benchmarks/results)")
    ap.add_argument("--mkl", choices=["vendor", "intel"], default="vendor",
                    help="torch's MKL code path (training.mkl_code_path)")  # fmt: skip
    ap.add_argument("--add", action="store_true",
                    help="keep the CSV's rows of other variants and MKL paths")  # fmt: skip
    add_quiet_args(ap)
    return ap.parse_args(argv)


def op_time(program, steps: int) -> tuple[float, float, float]:
    """(wall_us, prof_wall_us, aten_us) per plain step."""
    from torch.profiler import ProfilerActivity, profile

    n_batches = program.n_local // program.batch
    t0 = time.perf_counter()
    for i in range(steps):
        program._plain_step(i % n_batches)
    program.sync()
    wall = (time.perf_counter() - t0) / steps * 1e6
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for i in range(steps):
            program._plain_step(i % n_batches)
        program.sync()
        prof_wall = (time.perf_counter() - t0) / steps * 1e6
    aten = sum(e.self_cpu_time_total for e in prof.events() if e.name.startswith("aten::"))
    return wall, prof_wall, aten / steps


def case(cfg: dict, worker, device, variant: str, batch: int, steps: int) -> list[dict]:
    from hvdscale.matrix.config import validate_config

    comp, prec = parse_variant(variant)
    c = validate_config({**cfg, "training": {**cfg["training"], "compile": comp,
                                             "precision": prec}})  # fmt: skip
    n_rows = batch * max(8, min(64, 20000 // batch))
    program = program_for(c, worker, device, batch, n_rows)
    program.warm_up(1)
    for i in range(10):
        program._plain_step(i % (n_rows // batch))
    with Measured(f"step overhead {variant} b{batch}") as m:  # load and foreign CPU
        host = host_parts(program, steps)
        wall, prof_wall, aten = op_time(program, steps)
    program.close()
    outside = prof_wall - aten
    base = {"variant": variant, "compile": comp, "precision": prec, "batch": batch,
            "steps": steps, "wall_us": wall, "prof_wall_us": prof_wall, "aten_us": aten,
            "outside_us": outside, "outside_share": outside / prof_wall,
            "outside_plain_us": wall - aten,
            "bound_speedup": prof_wall / aten if aten > 0 else None, **m.fields()}  # fmt: skip
    return [{**base, "part": p, "host_us": host[p]} for p in PARTS]


def with_mkl_path(a, argv) -> None:
    """Restart this script with the MKL library preloaded when ``--mkl intel`` asks for it
    and it is not loaded yet (LD_PRELOAD is read when a process starts)."""
    from hvdscale import native

    if a.mkl != "intel" or native.mkl_code_path() == "intel":
        return
    if not native.MKL_LIBRARY.is_file():
        raise SystemExit(f"torch_step_overhead: {native.MKL_LIBRARY} is not built: run "
                         "`python -m hvdscale.native build`")  # fmt: skip
    env = {**os.environ, "LD_PRELOAD": native.preload_value(native.MKL_LIBRARY)}
    args = sys.argv[1:] if argv is None else list(argv)
    os.execve(sys.executable, [sys.executable, __file__, *args], env)


def kept_rows(path: Path | None, done: set) -> list[dict]:
    """``--add``: the rows of the CSV at ``path`` (default: benchmarks/results) whose
    (variant, mkl_code_path) this run did not measure, as they are."""
    import csv

    from _results import RESULTS

    path = path or RESULTS / "torch_step_overhead.csv"
    if not path.is_file():
        return []
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return [r for r in rows if (r["variant"], r.get("mkl_code_path") or "vendor") not in done]


@quiet_main
def main(argv=None) -> int:
    a = parse_args(argv)
    with_mkl_path(a, argv)
    import torch

    from hvdscale import native
    from hvdscale.matrix.config import validate_config
    from hvdscale.trainer.torch_ddp.dist import TorchWorker

    configure_quiet(a)
    torch.set_num_threads(1)  # one rank's one thread, as in the frameworks bench
    device = torch.device("cpu")
    os.environ.pop("RANK", None)  # a private one-rank group
    worker = TorchWorker.init("gloo", device)
    cfg = validate_config({
        "model": {"hidden_units": [192, 175, 24], "expected_parameters": 153441},
        "training": {"learning_rate": 4.7331e-4},
        "scaling": {"partitions": {"cpu": {"gpus_per_node": 0, "cores_per_node": 2,
                                           "mem_mb_per_node": 8000}},
                    "sweeps": [{"partitions": ["cpu"], "workers": [1],
                                "frameworks": ["torch-ddp"], "backends": ["gloo"],
                                "batch_sizes": a.batches, "lr_rules": ["none"]}]},
    })  # fmt: skip
    rows = []
    for v in a.variants:
        for b in a.batches:
            rs = case(cfg, worker, device, v, b, a.steps)
            r = rs[0]
            print(f"  {v:13s} b{b:5d}: wall {r['wall_us']:8.1f} us/step, in ATen "
                  f"{r['aten_us']:8.1f} of {r['prof_wall_us']:8.1f} profiled, outside "
                  f"{100 * r['outside_share']:4.1f} %", flush=True)  # fmt: skip
            rows += rs
    mkl = native.mkl_code_path()
    rows = [{"machine": machine(), "mkl_code_path": mkl, **r} for r in rows]
    if a.add:
        rows = kept_rows(a.out, {(v, mkl) for v in a.variants}) + rows
    write_csv("torch_step_overhead", rows, a.out)
    worker.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
