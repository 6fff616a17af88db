"""The arms of bench_scaling.py (and bench_frameworks.py's independent arm): candidates,
the dataset, and how each arm is started and read back (``Runner``). The method is in
docs/performance.md ("Scaling: 1 vs 2 workers")."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from _results import ROOT, training_budget

TRAIN_PY = ROOT / ".venv-train" / "bin" / "python"
MPIRUN = shutil.which("mpirun") or "mpirun"
WORKER = ROOT / "benchmarks" / "_scaling_worker.py"
HVD = [sys.executable, "-m", "hvdscale.cli"]


@dataclass(frozen=True)
class Arm:
    kind: str  # hvdscale | keras | mwms | independent
    workers: int
    spe: int = 64
    jit: int = 0
    impl: str = "ring"

    @property
    def label(self) -> str:
        if self.kind in ("hvdscale", "independent"):
            return self.kind
        if self.kind == "mwms" and self.workers > 1:
            return f"mwms {self.impl} spe{self.spe} jit{self.jit}"
        return f"{self.kind} spe{self.spe} jit{self.jit}"


def candidates(quick: bool) -> tuple[list[Arm], list[Arm]]:
    """The tuning candidates (1 worker, 2 workers); every arm is pinned (rank r on core r)."""
    if quick:
        return [Arm("hvdscale", 1), Arm("keras", 1)], [Arm("hvdscale", 2), Arm("mwms", 2)]
    one = [Arm("hvdscale", 1), Arm("keras", 1), Arm("keras", 1, jit=1), Arm("mwms", 1)]
    two = [Arm("mwms", 2), Arm("mwms", 2, impl="auto"), Arm("mwms", 2, jit=1)]
    return one, two


# --------------------------------------------------------------------------- plumbing


def env() -> dict:
    e = dict(os.environ)
    e["TF_CPP_MIN_LOG_LEVEL"] = "2"
    e["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("HOROVOD_TIMELINE", None)
    e.pop("TF_CONFIG", None)
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
            **training_budget(epochs),
            "warmup_epochs": 1,
            "learning_rate": 4.7331e-4,
            "threads_per_worker": 1,
            "checkpoint": False,
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
                    "backends": ["mpi"],
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
    hvd("split-dataset", "--config", dcfg, "--shards", *shards, "--validations", *vals,
        "--outdir", data)  # fmt: skip
    return data


def start(argv, cores: str | None, extra_env: dict | None = None) -> subprocess.Popen:
    argv = [str(a) for a in argv]
    if cores is not None:
        argv = ["taskset", "-c", cores, *argv]
    e = env()
    e.update(extra_env or {})
    # every arm in a session of its own, as horovodrun starts hvdscale's ranks: with the
    # kernel's autogroup scheduling (sched_autogroup_enabled) a session is one scheduling
    # group, so on a shared machine the arms compete for the cores on the same terms
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=e,
        start_new_session=True,
    )


def wait_all(procs: list[subprocess.Popen], what: str, timeout: float = 900) -> None:
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{what} failed:\n" + "\n".join(o[-3000:] for o in outs))


def epoch_thr(samples: int, times: list[float]) -> list[float]:
    return [samples / t for t in times[1:]]  # epoch 0: warm-up


class Runner:
    def __init__(self, a, cfg_path: Path, data: Path, work: Path, lr_rule_2w: str):
        self.a, self.cfg_path, self.data, self.work = a, cfg_path, data, work
        self.lr_rule_2w = lr_rule_2w
        self.port = 30000 + (os.getpid() % 1000) * 20
        from hvdscale.config.load import load_config
        from hvdscale.launch.launchspec import horovod_env

        self.hvd_env = horovod_env(load_config(cfg_path)["training"], "mpi")

    def out(self, arm: Arm, batch: int) -> Path:
        d = self.work / "runs" / f"{arm.label.replace(' ', '_')}_w{arm.workers}_b{batch}"
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        return d

    def run(self, arm: Arm, batch: int) -> dict:
        out = self.out(arm, batch)
        if arm.kind == "hvdscale":
            return self.run_hvdscale(arm, batch, out)
        if arm.kind == "independent":
            return self.run_independent(batch, out)
        return self.run_worker(arm, batch, out)

    def worker_argv(self, mode, batch, out, extra=(), workers=1):
        scale = 2.0 if self.lr_rule_2w == "linear" and workers > 1 else 1.0
        argv = [TRAIN_PY, WORKER, "--mode", mode, "--config", self.cfg_path]
        argv += ["--data-dir", self.data, "--batch", batch, "--epochs", self.a.epochs]
        return [*argv, "--out", out / "w", "--lr-scale", scale, *extra]

    def mpirun1(self, argv) -> list:
        x = []
        for k in sorted(self.hvd_env):
            x += ["-x", f"{k}={self.hvd_env[k]}"]
        return [MPIRUN, "-np", 1, "--bind-to", "none", *x, *argv]

    def run_worker(self, arm: Arm, batch: int, out: Path) -> dict:
        self.port += 4
        procs = []
        for r in range(arm.workers):
            extra = ["--spe", arm.spe, "--jit", arm.jit]
            if arm.kind == "mwms":
                extra += ["--workers", arm.workers, "--rank", r, "--impl", arm.impl]
                extra += ["--port", self.port]
            argv = self.worker_argv(arm.kind, batch, out, extra, arm.workers)
            procs.append(start(argv, str(r)))
        wait_all(procs, arm.label)
        r0 = json.loads((out / "w.rank0.json").read_text())
        thr = epoch_thr(r0["samples_per_epoch"], r0["epoch_times"])
        return {"throughput": statistics.median(thr), "epoch_throughputs": thr, "data_share": None}

    def run_hvdscale(self, arm: Arm, batch: int, out: Path) -> dict:
        rule = self.lr_rule_2w if arm.workers > 1 else "none"
        rid = f"local_mpi_n1_w{arm.workers}_b{batch}_lr{rule}_r0"
        argv = [*HVD, "launch", "--config", self.cfg_path, "--run-id", rid]
        argv += ["--data-dir", self.data, "--out-dir", out, "--train-python", TRAIN_PY]
        # 1 worker: taskset pins it to core 0 (cpu_binding auto leaves 1-rank runs alone);
        # 2 workers: cpu_binding auto binds rank r to core r before any thread starts
        p = start(argv, "0" if arm.workers == 1 else None)
        wait_all([p], "hvdscale launch")
        rec = json.loads((out / "metrics.json").read_text())
        eps = [e for e in rec["epochs"] if not e["warmup"]]
        ph = [sum(e[f"time_{k}_s"] for e in eps) for k in ("data", "compute", "sync", "update")]
        return {
            "throughput": statistics.median(e["throughput"] for e in eps),
            "epoch_throughputs": [e["throughput"] for e in eps],
            # no instrumented step in a tiny run: no phase split
            "data_share": ph[0] / sum(ph) if sum(ph) else None,
        }

    def run_independent(self, batch: int, out: Path) -> dict:
        bar = out / "barrier"
        procs = []
        for i in range(2):
            d = out / f"p{i}"
            d.mkdir()
            extra = ["--barrier", bar, "--barrier-n", 2, "--barrier-id", i]
            extra += ["--instrument-every", 0]  # uninstrumented, as hvdscale's headline
            argv = self.worker_argv("hvdstep", batch, d, extra)
            procs.append(start(self.mpirun1(argv), str(i), self.hvd_env))
        wait_all(procs, "independent")
        rs = [json.loads((out / f"p{i}" / "w.rank0.json").read_text()) for i in range(2)]
        per = [epoch_thr(r["samples_per_epoch"], r["epoch_times"]) for r in rs]
        thr = [a + b for a, b in zip(*per)]  # the epochs overlap (barrier): add them
        return {"throughput": statistics.median(thr), "epoch_throughputs": thr, "data_share": None}
