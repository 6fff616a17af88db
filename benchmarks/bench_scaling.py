"""1 worker vs 2 workers: naive Horovod, hvdscale's training path and TensorFlow's
MultiWorkerMirroredStrategy, side by side (workflow env; starts real processes in the
train env).

Same data (a dataset built with the real pipeline: write-config, generate-shard,
validate-shard, split-dataset; train shards divisible by 2), same model (the thesis
network, 153,441 parameters), same per-worker batch, 1 intra-op and 1 inter-op thread
per worker everywhere, the same learning rate (no LR scaling), the same number of epochs
(= the same total samples for 1 and 2 workers). The first epoch of every run is warm-up
and excluded from throughput. Configurations are interleaved (every repeat runs all of
them once, in turn), so a change of the machine's load hits all of them.

  naive-gloo / naive-mpi  horovodrun -np N --gloo|--mpi, Keras model.fit with
                          hvd.DistributedOptimizer, Horovod's defaults (Horovod's Keras example)
  hvdscale-mpi / -gloo    hvdscale launch (hvdscale train) with the config defaults
                          (the tuned path: see docs/performance.md)
  mwms-ring / mwms-auto   2 processes with TF_CONFIG on 127.0.0.1, model.fit under
                          MultiWorkerMirroredStrategy (CPU collectives RING / AUTO),
                          steps_per_execution 64 like hvdscale

Efficiency = throughput(2 workers) / (2 x throughput of the BEST 1-worker configuration
at that batch), medians over the repeats, spread min-max (of the efficiencies computed
per repeat against the median baseline). Time to target test loss: hvdscale runs, target
= 1.05 x the best 1-worker configuration's median final test loss; elapsed training time
(run record elapsed_s: epochs incl. evaluation, warm-up epoch included, start-up not).
The data-loading share comes from the hvdscale run records (time_data_s over the four phases).

  .venv/bin/python benchmarks/bench_scaling.py [--repeats 3] [--samples 60000]
      [--epochs 4] [--batches 75,1000] [--quick] [--csv benchmarks/out/scaling.csv]

Run it on a quiet machine (uptime 1-min load below ~0.7); the load is printed and saved.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN_PY = ROOT / ".venv-train" / "bin" / "python"
HOROVODRUN = ROOT / ".venv-train" / "bin" / "horovodrun"
WORKER = ROOT / "benchmarks" / "_scaling_worker.py"
HVD = [sys.executable, "-m", "hvdscale.cli"]

ONE = [
    "naive-gloo",
    "hvdscale-mpi",
    "mwms",
]  # 1-worker configurations (the controller does not matter)
TWO = [
    "naive-gloo",
    "naive-mpi",
    "hvdscale-mpi",
    "hvdscale-gloo",
    "mwms-ring",
    "mwms-auto",
    "independent",
]
# "independent": two 1-worker hvdscale runs at the same time, one per core (taskset), no
# communication at all: the most any 2-worker configuration can reach on this machine.


def env() -> dict:
    e = dict(os.environ)
    e["TF_CPP_MIN_LOG_LEVEL"] = "2"
    e.pop("HOROVOD_TIMELINE", None)
    if os.geteuid() == 0:
        e.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    return e


def hvd(*args) -> None:
    r = subprocess.run([*HVD, *map(str, args)], capture_output=True, text=True, env=env())
    if r.returncode:
        raise SystemExit(f"hvdscale {' '.join(map(str, args))} failed:\n{r.stdout}\n{r.stderr}")


def base_config(samples: int, epochs: int, batches: list[int]) -> dict:
    return {
        "seed": 20240601,
        "data": {
            "n_samples": samples,
            "n_shards": 2,
            "split_shards": {"train": 4, "test": 2},
            "chunk_samples": 1024,
        },
        "model": {"hidden_units": [192, 175, 24], "expected_parameters": 153441},
        "training": {
            "epochs": epochs,
            "warmup_epochs": 1,
            "learning_rate": 4.7331e-4,
            "threads_per_worker": 1,
            "checkpoint": False,
            "target_test_loss": 0.05,
        },
        "scaling": {
            "partitions": {
                "local": {
                    "gpus_per_node": 0,
                    "cores_per_node": 2,
                    "mem_mb_per_node": 8000,
                    "workers_per_node": 2,
                    "runtime_min": 30,
                }
            },
            "sweeps": [
                {
                    "name": "bench",
                    "partitions": ["local"],
                    "workers": [1, 2],
                    "backends": ["gloo", "mpi"],
                    "batch_sizes": batches,
                    "lr_rules": ["none", "linear"],
                }
            ],
        },
    }


def build_data(work: Path, cfg: dict) -> Path:
    """The real pipeline through the CLI (cached per sample count)."""
    data = work / "data"
    if (data / "manifest.json").is_file():
        return data
    work.mkdir(parents=True, exist_ok=True)
    dcfg = work / "data.json"
    hvd("write-config", "--json", json.dumps(cfg), "--section", "data", "--out", dcfg)
    shards, vals = [], []
    for k in range(cfg["data"]["n_shards"]):
        sh, va = work / "raw" / f"shard-{k:04d}.h5", work / "raw" / f"shard-{k:04d}.validation.json"
        hvd("generate-shard", "--config", dcfg, "--shard", k, "--out", sh)
        hvd("validate-shard", "--config", dcfg, "--shard", sh, "--out", va)
        shards.append(sh)
        vals.append(va)
    hvd(
        "split-dataset",
        "--config",
        dcfg,
        "--shards",
        *shards,
        "--validations",
        *vals,
        "--outdir",
        data,
    )
    return data


def run_cmd(argv, timeout=600, **kw) -> None:
    r = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=kw.pop("env", env()), **kw
    )
    if r.returncode:
        raise RuntimeError(
            f"{' '.join(map(str, argv[:6]))} ... failed ({r.returncode}):\n{r.stdout[-3000:]}\n"
            f"{r.stderr[-3000:]}"
        )


def run_hvdscale(
    cfg_path: Path,
    data: Path,
    out: Path,
    backend: str,
    workers: int,
    batch: int,
    lr_rule: str = "none",
) -> dict:
    rid = f"local_{backend}_n1_w{workers}_b{batch}_lr{lr_rule}_r0"
    if out.exists():
        shutil.rmtree(out)
    run_cmd(
        [
            *HVD,
            "launch",
            "--config",
            cfg_path,
            "--run-id",
            rid,
            "--data-dir",
            data,
            "--out-dir",
            out,
            "--train-python",
            TRAIN_PY,
        ]
    )
    rec = json.loads((out / "metrics.json").read_text())
    eps = [e for e in rec["epochs"] if not e["warmup"]]
    phases = {k: sum(e[f"time_{k}_s"] for e in eps) for k in ("data", "compute", "sync", "update")}
    tot = sum(phases.values())
    return {
        "throughput": statistics.median(e["throughput"] for e in eps),
        "test_loss": rec["epochs"][-1]["test_loss"],
        "curve": [(e["elapsed_s"], e["test_loss"]) for e in rec["epochs"]],
        "data_share": phases["data"] / tot,
        "sync_share": phases["sync"] / tot,
        "samples": sum(e["samples"] for e in rec["epochs"]),
    }


def run_independent(cfg_path: Path, data: Path, out: Path, batch: int) -> dict:
    """Two 1-worker hvdscale runs at once, pinned to core 0 and core 1 (the compute ceiling)."""
    rid = f"local_mpi_n1_w1_b{batch}_lrnone_r0"
    outs = [out.with_name(out.name + f"_{i}") for i in range(2)]
    procs = []
    for i, o in enumerate(outs):
        if o.exists():
            shutil.rmtree(o)
        procs.append(
            subprocess.Popen(
                [
                    "taskset",
                    "-c",
                    str(i),
                    *map(
                        str,
                        [
                            *HVD,
                            "launch",
                            "--config",
                            cfg_path,
                            "--run-id",
                            rid,
                            "--data-dir",
                            data,
                            "--out-dir",
                            o,
                            "--train-python",
                            TRAIN_PY,
                        ],
                    ),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env(),
            )
        )
    logs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError("independent runs failed:\n" + "\n".join(x[-2000:] for x in logs))
    recs = [json.loads((o / "metrics.json").read_text()) for o in outs]
    thr = [statistics.median(e["throughput"] for e in r["epochs"] if not e["warmup"]) for r in recs]
    return {
        "throughput": sum(thr),
        "test_loss": recs[0]["epochs"][-1]["test_loss"],
        "samples": sum(e["samples"] for e in recs[0]["epochs"]),
    }


def run_worker(
    mode: str,
    cfg_path: Path,
    data: Path,
    out: Path,
    workers: int,
    batch: int,
    epochs: int,
    controller: str = "gloo",
    impl: str = "ring",
    port: int = 23456,
    lr_scale: float = 1.0,
) -> dict:
    common = [
        "--config",
        cfg_path,
        "--data-dir",
        data,
        "--batch",
        batch,
        "--epochs",
        epochs,
        "--out",
        out,
        "--lr-scale",
        lr_scale,
    ]
    for f in out.parent.glob(out.name + ".rank*.json"):
        f.unlink()
    if mode == "naive":
        argv = [
            HOROVODRUN,
            "-np",
            workers,
            "-H",
            f"localhost:{workers}",
            f"--{controller}",
            TRAIN_PY,
            WORKER,
            "--mode",
            "naive",
            *common,
        ]
        run_cmd(list(map(str, argv)))
    else:
        procs = [
            subprocess.Popen(
                list(
                    map(
                        str,
                        [
                            TRAIN_PY,
                            WORKER,
                            "--mode",
                            "mwms",
                            "--workers",
                            workers,
                            "--rank",
                            r,
                            "--impl",
                            impl,
                            "--port",
                            port,
                            *common,
                        ],
                    )
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env=env(),
            )
            for r in range(workers)
        ]
        outs = [p.communicate(timeout=600)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError("mwms failed:\n" + "\n".join(o[-3000:] for o in outs))
    ranks = [json.loads(f.read_text()) for f in sorted(out.parent.glob(out.name + ".rank*.json"))]
    r0 = ranks[0]
    ts = r0["epoch_times"][1:]  # epoch 0 is warm-up (tracing, first collectives)
    return {
        "throughput": statistics.median(r0["samples_per_epoch"] / t for t in ts),
        "test_loss": sum(r["test_sse"] for r in ranks) / sum(r["test_values"] for r in ranks),
        "samples": r0["samples_per_epoch"] * len(r0["epoch_times"]),
    }


def run_one(
    name: str, workers: int, batch: int, a, cfg_path: Path, data: Path, work: Path, port: int
) -> dict:
    out = work / "runs" / f"{name}_w{workers}_b{batch}"
    out.parent.mkdir(parents=True, exist_ok=True)
    rule = a.lr_rule_2w if workers > 1 else "none"
    scale = {"none": 1.0, "linear": float(workers)}[rule]
    if name == "independent":
        return run_independent(cfg_path, data, out, batch)
    if name.startswith("hvdscale"):
        backend = name.split("-")[1]
        return run_hvdscale(cfg_path, data, out, backend, workers, batch, rule)
    if name.startswith("naive"):
        return run_worker(
            "naive",
            cfg_path,
            data,
            out,
            workers,
            batch,
            a.epochs,
            controller=name.split("-")[1],
            lr_scale=scale,
        )
    impl = name.split("-")[1] if "-" in name else "ring"
    return run_worker(
        "mwms", cfg_path, data, out, workers, batch, a.epochs, impl=impl, port=port, lr_scale=scale
    )


def spread(vals):
    return (min(vals), max(vals)) if vals else (float("nan"), float("nan"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--samples", type=int, default=60000, help="curves in the dataset (75 %% train)"
    )
    ap.add_argument("--epochs", type=int, default=4, help="epochs per run, the first is warm-up")
    ap.add_argument("--batches", default="75,1000", help="per-worker batch sizes")
    ap.add_argument(
        "--quick", action="store_true", help="1 repeat, 20,000 curves, 3 epochs (a smoke test)"
    )
    ap.add_argument(
        "--lr-rule-2w",
        choices=["none", "linear"],
        default="linear",
        help="learning-rate rule of every 2-worker run (all variants alike): "
        "linear = 2 x the base LR for the 2x global batch "
        "(changes the optimisation; declared in the output), none = base LR",
    )
    ap.add_argument(
        "--only", default="", help="comma list of configuration names to run (default: all)"
    )
    ap.add_argument("--csv", default=str(ROOT / "benchmarks" / "out" / "scaling.csv"))
    a = ap.parse_args(argv)
    if a.quick:
        a.repeats, a.samples, a.epochs = 1, 20000, 3
    batches = [int(b) for b in a.batches.split(",")]
    only = set(filter(None, a.only.split(",")))
    work = ROOT / "benchmarks" / "out" / "scaling"
    cfg = base_config(a.samples, a.epochs, batches)
    data = build_data(work / f"data{a.samples}", cfg)
    cfg_path = work / "config.json"
    hvd("write-config", "--json", json.dumps(cfg), "--out", cfg_path)
    plan = [(n, 1) for n in ONE] + [(n, 2) for n in TWO]
    plan = [(n, w) for n, w in plan if not only or n in only]
    t_start, loads = time.time(), [os.getloadavg()[0]]
    print(
        f"bench_scaling: {a.samples} curves, {a.epochs} epochs (1 warm-up), batches {batches}, "
        f"2-worker LR rule {a.lr_rule_2w}, "
        f"{a.repeats} repeat(s), load {loads[0]:.2f}",
        flush=True,
    )
    results: dict = {}
    port = 23456
    for rep in range(a.repeats):
        for batch in batches:
            for name, w in plan:
                port += 10
                t0 = time.time()
                try:
                    r = run_one(name, w, batch, a, cfg_path, data, work, port)
                except Exception as exc:  # one failed run is reported, not fatal
                    print(f"  r{rep} b{batch} {name} w{w}: FAILED {str(exc)[:2000]}", flush=True)
                    continue
                results.setdefault((name, w, batch), []).append(r)
                print(
                    f"  r{rep} b{batch:5d} {name:14s} w{w}: {r['throughput']:9.0f} samples/s, "
                    f"test loss {r['test_loss']:.5f} "
                    f"({time.time() - t0:.0f} s, load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
            loads.append(os.getloadavg()[0])

    rows = []
    for batch in batches:
        one = {
            n: statistics.median(r["throughput"] for r in results.get((n, 1, batch), []))
            for n in ONE
            if results.get((n, 1, batch))
        }
        if not one:
            continue
        best1 = max(one, key=one.get)
        base = one[best1]
        tl1 = statistics.median(r["test_loss"] for r in results[(best1, 1, batch)])
        for (name, w, b), rs in sorted(results.items()):
            if b != batch:
                continue
            thr = [r["throughput"] for r in rs]
            row = {
                "batch": batch,
                "config": name,
                "workers": w,
                "lr_rule": a.lr_rule_2w if w > 1 and name != "independent" else "none",
                "repeats": len(rs),
                "epochs": a.epochs,
                "load_min": round(min(loads), 2),
                "load_max": round(max(loads), 2),
                "throughput_median": round(statistics.median(thr)),
                "throughput_min": round(min(thr)),
                "throughput_max": round(max(thr)),
                "test_loss_median": statistics.median(r["test_loss"] for r in rs),
                "samples_total": rs[0]["samples"],
            }
            if w == 2:
                eff = [t / (2 * base) for t in thr]
                own = one.get(
                    {
                        "naive": "naive-gloo",
                        "hvdscale": "hvdscale-mpi",
                        "mwms": "mwms",
                        "independent": "hvdscale-mpi",
                    }[name.split("-")[0]]
                )
                row.update(
                    {
                        "baseline_1w": best1,
                        "baseline_1w_throughput": round(base),
                        "efficiency": round(statistics.median(eff), 3),
                        "efficiency_min": round(min(eff), 3),
                        "efficiency_max": round(max(eff), 3),
                        "efficiency_vs_own_1w": round(statistics.median(thr) / (2 * own), 3)
                        if own
                        else None,
                        "test_loss_vs_best_1w": round(row["test_loss_median"] / tl1 - 1, 4),
                    }
                )
            if name.startswith("hvdscale"):
                row["data_share_median"] = round(statistics.median(r["data_share"] for r in rs), 4)
                row["sync_share_median"] = round(statistics.median(r["sync_share"] for r in rs), 4)
                target = (
                    1.05
                    * statistics.median(r["test_loss"] for r in results[("hvdscale-mpi", 1, batch)])
                    if results.get(("hvdscale-mpi", 1, batch))
                    else None
                )
                if target:
                    ttt = []
                    for r in rs:
                        hit = [el for el, tl in r["curve"] if tl is not None and tl <= target]
                        ttt.append(hit[0] if hit else float("nan"))
                    row["target_test_loss"] = round(target, 6)
                    row["time_to_target_s_median"] = round(statistics.median(ttt), 3)
                    row["time_to_target_s_min"], row["time_to_target_s_max"] = (
                        round(v, 3) for v in spread(ttt)
                    )
            rows.append(row)
        hv2 = [
            r
            for r in rows
            if r["batch"] == batch and r["workers"] == 2 and r["config"] == "hvdscale-mpi"
        ]
        mw2 = [
            r
            for r in rows
            if r["batch"] == batch and r["workers"] == 2 and r["config"].startswith("mwms")
        ]
        if hv2 and mw2:
            best_mw = max(mw2, key=lambda r: r["throughput_median"])
            hv2[0]["ratio_vs_best_mwms"] = round(
                hv2[0]["throughput_median"] / best_mw["throughput_median"], 3
            )

    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    Path(a.csv).parent.mkdir(parents=True, exist_ok=True)
    with open(a.csv, "w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=keys)
        wr.writeheader()
        wr.writerows(rows)
    print(
        f"\n{'batch':>5} {'config':14s} {'w':>1} {'samples/s (min-max)':>26} {'eff (min-max)':>20} "
        f"{'test loss':>10} {'vs 1w':>7} {'t->target s':>11} {'data':>6} {'hvd/mwms':>8}"
    )
    for r in rows:
        eff = (
            f"{r['efficiency']:.2f} ({r['efficiency_min']:.2f}-{r['efficiency_max']:.2f})"
            if "efficiency" in r
            else ""
        )
        print(
            f"{r['batch']:5d} {r['config']:14s} {r['workers']:1d} {r['throughput_median']:9d} "
            f"({r['throughput_min']:7d}-{r['throughput_max']:7d}) {eff:>20} "
            f"{r['test_loss_median']:10.6f} "
            f"{r.get('test_loss_vs_best_1w', float('nan')):+7.2%} "
            f"{r.get('time_to_target_s_median', float('nan')):11.2f} "
            f"{r.get('data_share_median', float('nan')):6.2%} {r.get('ratio_vs_best_mwms', ''):>8}"
        )
    print(
        "\nbaseline per batch = best 1-worker configuration; "
        f"load {min(loads):.2f}-{max(loads):.2f}; "
        f"{time.time() - t_start:.0f} s; CSV: {a.csv}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
