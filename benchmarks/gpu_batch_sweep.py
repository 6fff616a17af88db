"""Epoch time against batch size, compilation and precision on one GPU: the torch-ddp
trainer with NCCL, for a machine with a CUDA GPU (docs/performance.md, "One GPU").

Each (variant, batch size) is one ordinary training run of ``python -m hvdscale.cli
train`` (world size 1, nccl on ``cuda:0``) with its run id
``gpu_torch-ddp_nccl_n1_w1_b{B}_lrnone[_SETTING]_r0`` of a small config and its record;
a row holds the median over the non-warm-up epochs of the headline ``wall_s`` and of the
throughput, the mean GPU utilisation, the device, the compilation's ``warm_up_s`` and
``epoch_ratio_75_to_1000`` of its variant. The first ``COMPILE/PRECISION`` variant runs at
every batch size, the others at ``--variant-batches``. A failed run is a row with status
``failed`` and its error; ``--budget-s``: no run starts after that many seconds; the CSV
is written after every run. Writes benchmarks/results/gpu_batch_sweep.csv (``machine``
adds the GPU name); a machine without CUDA stops it before anything runs (exit 2).

The data come from the real pipeline, which needs the workflow env (pandera). The GPU
machine needs only PyTorch, h5py, PyYAML and jsonschema (psutil for CPU utilisation), so
prepare the data on the CPU machine and carry it (benchmarks/out/ is not tracked):

  .venv/bin/python benchmarks/gpu_batch_sweep.py --prepare-only      # CPU machine
  PYTHONPATH=src python3 benchmarks/gpu_batch_sweep.py               # GPU machine
      [--batches 75,150,300,600,1000,2000,5000] [--epochs 4] [--samples 16000]
      [--variants off/fp32,off/tf32,off/bf16,default/fp32,max/fp32,max/bf16]
      [--variant-batches 75,1000] [--budget-s 420] [--records DIR]
      [--commit SHA]  (the tree copied to the GPU machine may have no .git)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from _results import (  # noqa: E402
    ROOT,
    Measured,
    add_quiet_args,
    configure_quiet,
    machine,
    quiet_main,
    write_csv,
)

BATCHES = [75, 150, 300, 600, 1000, 2000, 5000]
#: COMPILE/PRECISION pairs; the first is the full sweep, the others run at VARIANT_BATCHES
VARIANTS = ["off/fp32", "off/tf32", "off/bf16", "default/fp32", "max/fp32", "max/bf16"]
VARIANT_BATCHES = [75, 1000]
WORK = ROOT / "benchmarks" / "out" / "gpu_batch_sweep"
PARTITION = "gpu"
#: what ``python -m hvdscale.cli train`` imports for a torch-ddp run (top level or while
#: it runs)
TRAINER_MODULES = ["numpy", "torch", "h5py", "yaml", "jsonschema"]


class Unfit(SystemExit):
    """This machine cannot run the sweep, or the step profile that imports it (exit status
    2, the message on stderr after the running script's name)."""

    def __init__(self, msg: str):
        print(f"{Path(sys.argv[0]).stem or 'gpu_batch_sweep'}: {msg}", file=sys.stderr, flush=True)
        super().__init__(2)


def missing_modules(names=TRAINER_MODULES) -> list[str]:
    return [n for n in names if importlib.util.find_spec(n) is None]


def check_cuda() -> str:
    """The GPU's name, or Unfit naming the torch build and the GPU count found."""
    if importlib.util.find_spec("torch") is None:
        raise Unfit("needs PyTorch with CUDA and a GPU; torch is not installed")
    import torch

    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n < 1:
        raise Unfit(
            f"needs a CUDA build of torch and a GPU (backend nccl); found torch "
            f"{torch.__version__} (CUDA {torch.version.cuda or 'none'}), {n} GPUs"
        )
    return torch.cuda.get_device_name(0)


def parse_variant(v: str) -> tuple[str, str]:
    """``COMPILE/PRECISION`` -> (compile, precision), checked against the config schema."""
    comp, _, prec = v.partition("/")
    if comp not in ("off", "default", "max") or prec not in ("fp32", "tf32", "bf16", "fp16"):
        raise SystemExit(
            f"gpu_batch_sweep: variant {v!r}; expected COMPILE/PRECISION with COMPILE off, "
            f"default or max and PRECISION fp32, tf32, bf16 or fp16"
        )
    return comp, prec


def variant_name(v: str) -> str:
    return v.replace("/", "-")


def plan(a) -> list[tuple[str, int]]:
    """(variant, batch) in run order: the first variant at every batch, then the others
    at the variant batches (those of them in --batches)."""
    runs = [(a.variants[0], b) for b in a.batches]
    for v in a.variants[1:]:
        runs += [(v, b) for b in a.variant_batches]
    return runs


def sweep_config(a, variant: str | None = None) -> dict:
    """A small study: partition ``gpu`` (1 GPU per node), torch-ddp over nccl, 1 worker,
    every batch size, no LR scaling, exactly ``epochs`` epochs, no checkpoints
    (``--backend gloo``: partition ``cpu`` without GPUs, for a smoke test on a CPU)."""
    gpus = 1 if a.backend == "nccl" else 0
    comp, prec = parse_variant(variant or a.variants[0])
    return {
        "seed": 20240601,
        "data": {
            "n_samples": a.samples,
            "n_shards": 2,
            "split_shards": {"train": 4, "test": 2},
            "chunk_samples": 1024,
        },
        "model": {"hidden_units": [192, 175, 24], "expected_parameters": 153441},
        "training": {
            "max_epochs": a.epochs,
            "stop_at_target": False,
            "target": {"mode": "absolute", "value": 0.05},
            "warmup_epochs": 1,
            "learning_rate": 4.7331e-4,
            "threads_per_worker": 1,
            "checkpoint": False,
            "instrument_every": 10,
            "precision": prec,
            "compile": comp,
        },
        "scaling": {
            "partitions": {
                partition(a.backend): {
                    "gpus_per_node": gpus,
                    "cores_per_node": 16,
                    "mem_mb_per_node": 64000,
                    "runtime_min": 30,
                }
            },
            "sweeps": [
                {
                    "name": "gpu-batch",
                    "partitions": [partition(a.backend)],
                    "workers": [1],
                    "backends": [a.backend],
                    "frameworks": ["torch-ddp"],
                    "batch_sizes": sorted(set(a.batches) | set(a.variant_batches)),
                    "lr_rules": ["none"],
                }
            ],
        },
    }


def partition(backend: str) -> str:
    return PARTITION if backend == "nccl" else "cpu"


def run_id(batch: int, backend: str = "nccl", variant: str = "off/fp32") -> str:
    """The run id of one batch of a variant: the id names a step setting other than fp32
    and off after the LR rule (``..._lrnone_bf16_cmax_r0``)."""
    from hvdscale.matrix.runid import step_setting_suffix

    comp, prec = parse_variant(variant)
    tag = step_setting_suffix(prec, comp)
    return f"{partition(backend)}_torch-ddp_{backend}_n1_w1_b{batch}_lrnone{tag}_r0"


def env() -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + e.get("PYTHONPATH", "")
    return e


def cli(*args) -> None:
    argv = [sys.executable, "-m", "hvdscale.cli", *map(str, args)]
    r = subprocess.run(argv, capture_output=True, text=True, env=env())
    if r.returncode:
        raise SystemExit(f"hvdscale {' '.join(map(str, args[:1]))} failed:\n{r.stderr[-2000:]}")


def prepare(a, work: Path) -> tuple[dict, Path]:
    """The validated config of every variant (config-VARIANT.json; {variant: path}) and the
    data (data/, cached) in ``work``."""
    from hvdscale.config.load import validate_config
    from hvdscale.matrix.runtable import find_run

    work.mkdir(parents=True, exist_ok=True)
    paths = {}
    for v in a.variants:
        cfg = validate_config(sweep_config(a, v))
        for b in set(a.batches) | set(a.variant_batches):
            find_run(cfg, run_id(b, a.backend, v))  # the ids exist in the matrix
        paths[v] = work / f"config-{variant_name(v)}.json"
        paths[v].write_text(json.dumps(cfg, indent=1))
    data = work / f"data{a.samples}"
    if (data / "manifest.json").is_file():
        return paths, data
    if importlib.util.find_spec("pandera") is None:
        raise Unfit(
            f"no data in {data} and no pandera here to validate new shards: run "
            f"`.venv/bin/python benchmarks/gpu_batch_sweep.py --prepare-only --samples "
            f"{a.samples} --work {work}` on the CPU machine and bring that folder along"
        )
    dcfg = work / "data.json"
    dcfg.write_text(json.dumps({"seed": cfg["seed"], "data": cfg["data"]}))
    raw, shards, vals = work / "raw", [], []
    for k in range(cfg["data"]["n_shards"]):
        sh, va = raw / f"shard-{k:04d}.h5", raw / f"shard-{k:04d}.validation.json"
        cli("generate-shard", "--config", dcfg, "--shard", k, "--out", sh)
        cli("validate-shard", "--config", dcfg, "--shard", sh, "--out", va)
        shards.append(sh)
        vals.append(va)
    cli("split-dataset", "--config", dcfg, "--shards", *shards, "--validations", *vals,
        "--outdir", data)  # fmt: skip
    return paths, data


def run_one(a, cfg_path: Path, data: Path, batch: int, variant: str) -> dict:
    """One training run (one rank on cuda:0); its record."""
    rid = run_id(batch, a.backend, variant)
    out = a.work / "runs" / variant_name(variant) / rid
    argv = [sys.executable, "-m", "hvdscale.cli", "train", "--config", cfg_path,
            "--run-id", rid, "--data-dir", data, "--out-dir", out]  # fmt: skip
    r = subprocess.run(list(map(str, argv)), capture_output=True, text=True, env=env(),
                       timeout=a.run_timeout)  # fmt: skip
    if r.returncode:
        raise RuntimeError(f"{rid}: exit {r.returncode}\n{(r.stdout + r.stderr)[-2000:]}")
    return json.loads((out / "metrics.json").read_text())


def row_of(batch: int, rec: dict, variant: str) -> dict:
    eps = [e for e in rec["epochs"] if not e["warmup"]] or rec["epochs"]
    util = [e["utilisation_mean"] for e in eps if e.get("utilisation_mean") is not None]
    comp, prec = parse_variant(variant)
    return {
        "variant": variant,
        "compile": comp,
        "precision": prec,
        "compile_mode": rec["config"].get("compile_mode"),
        "warm_up_s": rec.get("timing", {}).get("warm_up_s"),
        "batch": batch,
        "run_id": rec["run_id"],
        "status": rec["status"],
        "epochs": len(eps),
        "steps_per_epoch": rec["config"].get("steps_per_epoch"),
        "epoch_s": statistics.median(e["wall_s"] for e in eps),
        "throughput": statistics.median(e["throughput"] for e in eps),
        "gpu_util_mean": statistics.fmean(util) if util else None,
        "utilisation_kind": rec["utilisation"]["kind"],
        "device": rec["environment"]["devices"][0],
        "torch": rec["environment"].get("torch"),
        "nccl_version": (rec.get("label_proof") or {}).get("nccl_version"),
        "final_val_loss": rec["summary"].get("final_val_loss"),
    }


def failed_row(batch: int, variant: str, error: str) -> dict:
    comp, prec = parse_variant(variant)
    last = error.strip().splitlines()[-1][:300] if error.strip() else ""
    return {"variant": variant, "compile": comp, "precision": prec, "batch": batch,
            "status": "failed", "error": last}  # fmt: skip


def add_ratio(rows: list[dict]) -> dict:
    """epoch_s(75) / epoch_s(1000) per variant on each of its rows (None when either is
    missing); returns {variant: ratio}."""
    ratios = {}
    for v in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == v]
        by = {r["batch"]: r.get("epoch_s") for r in mine}
        ratios[v] = by[75] / by[1000] if by.get(75) and by.get(1000) else None
        for r in mine:
            r["epoch_ratio_75_to_1000"] = ratios[v]
    return ratios


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)),
                    type=lambda s: [int(x) for x in s.split(",")])  # fmt: skip
    ap.add_argument("--epochs", type=int, default=4, help="per run; epoch 0 is warm-up")
    ap.add_argument("--samples", type=int, default=16000, help="dataset size (all splits)")
    ap.add_argument("--work", type=Path, default=WORK, help="config, data and runs")
    ap.add_argument("--out", type=Path, default=None, help="CSV (default: benchmarks/results)")
    ap.add_argument("--run-timeout", type=float, default=300, help="seconds per run")
    ap.add_argument("--variants", default=",".join(VARIANTS), type=lambda s: s.split(","),
                    help="COMPILE/PRECISION pairs; the first at every batch size")  # fmt: skip
    ap.add_argument("--variant-batches", default=",".join(map(str, VARIANT_BATCHES)),
                    type=lambda s: [int(x) for x in s.split(",")],
                    help="batch sizes of the other variants")  # fmt: skip
    ap.add_argument("--budget-s", type=float, default=None,
                    help="start no run after this many seconds")  # fmt: skip
    ap.add_argument("--records", type=Path, default=None,
                    help="copy every run's record and history here (VARIANT/RUN_ID/)")  # fmt: skip
    ap.add_argument("--prepare-only", action="store_true",
                    help="build config and data (workflow env, no GPU) and stop")  # fmt: skip
    ap.add_argument("--commit", default=None,
                    help="the commit column (a copied tree without .git)")  # fmt: skip
    ap.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                    help="gloo: the same sweep on the CPU (a smoke test)")  # fmt: skip
    add_quiet_args(ap)
    return ap.parse_args(argv)


@quiet_main
def main(argv=None) -> int:
    a = parse_args(argv)
    gpu = "none (gloo on the CPU)"
    if not a.prepare_only and a.backend == "nccl":
        gpu = check_cuda()
    if not a.prepare_only and missing_modules():
        raise Unfit(f"the torch trainer needs the modules {missing_modules()} (missing)")
    for v in a.variants:
        parse_variant(v)
    cfg_paths, data = prepare(a, a.work)
    if a.prepare_only:
        print(f"prepared {', '.join(map(str, cfg_paths.values()))} and {data}", flush=True)
        return 0
    configure_quiet(a)
    print(f"gpu_batch_sweep on {gpu}: batches {a.batches}, variants {a.variants}, "
          f"{a.epochs} epochs", flush=True)  # fmt: skip
    common = {"machine": f"{machine()}, GPU {gpu}", **({"commit": a.commit} if a.commit else {})}
    out = a.out or (a.work / "gpu_batch_sweep_gloo.csv" if a.backend == "gloo" else None)
    rows, started = [], time.time()
    for v, b in plan(a):
        if a.budget_s is not None and time.time() - started > a.budget_s:
            print(f"  budget of {a.budget_s:.0f} s spent: {v} b{b} and later not run", flush=True)
            break
        t0 = time.time()
        try:
            with Measured(f"torch-ddp {a.backend} {v} b{b}") as m:
                rec = run_one(a, cfg_paths[v], data, b, v)
            row = {**row_of(b, rec, v), **m.fields()}
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            row = failed_row(b, v, str(exc))
        row["wall_s"] = round(time.time() - t0, 1)
        rows.append(row)
        if row["status"] == "failed":
            print(f"  {v:13s} b{b:5d}: FAILED {row['error']}", flush=True)
        else:
            print(f"  {v:13s} b{b:5d}: epoch {row['epoch_s']:.4f} s, "
                  f"{row['throughput']:9.0f} samples/s, util {row['gpu_util_mean']}, "
                  f"warm-up {row['warm_up_s']} s", flush=True)  # fmt: skip
        copy_records(a, v, b)
        add_ratio(rows)
        write_csv("gpu_batch_sweep", [{**common, **r} for r in rows], out)  # after every run
    for v, ratio in add_ratio(rows).items():
        print(f"epoch time ratio 75 -> 1000, {v}: {ratio} (reference study: about 7x)", flush=True)
    return 0


def copy_records(a, variant: str, batch: int) -> None:
    """The run's metrics.json, history.csv and log into --records (for the CPU machine)."""
    if a.records is None:
        return
    src = a.work / "runs" / variant_name(variant) / run_id(batch, a.backend, variant)
    dst = a.records / variant_name(variant) / src.name
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("metrics.json", "history.csv", "train.log", "rank-0.log"):
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)


if __name__ == "__main__":
    sys.exit(main())
