"""Fair 1 vs 2 worker benchmark: hvdscale against Keras ``model.fit`` and TensorFlow's
MultiWorkerMirroredStrategy (MWMS), with the machine's own ceiling as a control
(workflow env; starts real processes in the train env).

Same for every arm: a dataset built with the real pipeline (write-config, generate-shard,
validate-shard, split-dataset), the thesis network (153,441 parameters), the same rows
per rank, the same per-worker batch, 1 intra-op and 1 inter-op thread per worker, and

  pinning     rank r runs on core r, 1-worker runs on core 0: ``taskset -c r`` for the
              Keras/MWMS/hvdstep processes and 1-worker hvdscale runs, hvdscale's own
              ``cpu_binding: auto`` (rank r -> core r, before any thread) for 2-worker
              hvdscale runs. The only exception is a declared MWMS candidate ``pin0``.
  timer       the per-epoch step-loop clock on rank 0: the epoch's permutation is drawn
              (numpy) before the clock starts, the gather of every batch by it is inside,
              evaluation is outside (see benchmarks/_scaling_worker.py); epoch 0 is
              warm-up and excluded; throughput = median over the other epochs of
              samples of all ranks / epoch clock.

Phase 1, tuning (``--tune-repeats``, interleaved): every arm's candidate settings,
1-worker (hvdscale with its config defaults; Keras and MWMS at steps_per_execution 64,
Keras with jit_compile off and on) and 2-worker (MWMS at steps_per_execution 64: RING,
AUTO, RING with jit_compile). Each arm keeps its fastest candidate. ``--full-tuning``
adds steps_per_execution 1 (Keras, MWMS), jit_compile for the other MWMS candidates,
unpinned MWMS, hvdscale with 2 workers and ``hvdstep`` (hvdscale's step code run by the
benchmark worker).

Phase 2, paired repeats (``--repeats``): every repeat runs, back to back, each arm's
best 1-worker configuration, hvdscale with 2 workers, the best MWMS with 2 workers and
the "independent" control (two 1-worker hvdstep runs at once, one per core, no
communication, every epoch started behind a file barrier: the most any 2-worker run can
reach on this machine); odd repeats run in reverse order. The baseline is the 1-worker
arm with the highest median; per repeat

  efficiency            = thr(hvdscale 2w) / (2 x thr(baseline))
  efficiency vs ceiling = thr(hvdscale 2w) / thr(independent)
  ceiling               = thr(independent) / (2 x thr(baseline))

and the ratios hvdscale / best MWMS (2 workers) and hvdscale / best Keras (1 worker);
medians with percentile-bootstrap 95 % intervals over the repeats (none below 3).
The 1-minute load average is recorded before and after every run (warning above 1.0).

Writes benchmarks/results/bench_scaling.csv (summary, what docs/performance.md shows)
and benchmarks/results/bench_scaling_runs.csv (every run).

  .venv/bin/python benchmarks/bench_scaling.py [--repeats 3] [--tune-repeats 1]
      [--samples 60000] [--epochs 6] [--batches 75,1000] [--quick] [--out-dir DIR]
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
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import (  # noqa: E402
    RESULTS,
    ROOT,
    Measured,
    load_avg,
    median_ci,
    wait_for_load,
    warn_load,
    write_csv,
)

TRAIN_PY = ROOT / ".venv-train" / "bin" / "python"
MPIRUN = shutil.which("mpirun") or "mpirun"
WORKER = ROOT / "benchmarks" / "_scaling_worker.py"
HVD = [sys.executable, "-m", "hvdscale.cli"]


@dataclass(frozen=True)
class Arm:
    kind: str  # hvdscale | hvdstep | keras | mwms | independent
    workers: int
    spe: int = 64
    jit: int = 0
    impl: str = "ring"
    pin: int = 1
    extra: tuple = field(default=())

    @property
    def label(self) -> str:
        if self.kind in ("hvdscale", "hvdstep", "independent"):
            return self.kind
        s = f"{self.kind} spe{self.spe} jit{self.jit}"
        if self.kind == "mwms" and self.workers > 1:
            s = f"mwms {self.impl} spe{self.spe} jit{self.jit}"
        return s + ("" if self.pin else " unpinned")

    @property
    def family(self) -> str:
        return {"hvdstep": "hvdscale"}.get(self.kind, self.kind)


def candidates(quick: bool, full: bool = False) -> tuple[list[Arm], list[Arm]]:
    if quick:
        one = [Arm("hvdscale", 1), Arm("keras", 1)]
        two = [Arm("hvdscale", 2), Arm("mwms", 2)]
        return one, two
    one = [Arm("hvdscale", 1), Arm("keras", 1), Arm("keras", 1, jit=1), Arm("mwms", 1)]
    two = [Arm("mwms", 2), Arm("mwms", 2, impl="auto"), Arm("mwms", 2, jit=1)]
    if full:
        one += [Arm("keras", 1, spe=1, jit=j) for j in (0, 1)]
        one += [Arm("hvdstep", 1), Arm("mwms", 1, jit=1)] + [Arm("mwms", 1, spe=1)]
        two += [Arm("hvdscale", 2), Arm("mwms", 2, spe=1), Arm("mwms", 2, pin=0)]
        two += [Arm("mwms", 2, impl="auto", jit=1), Arm("mwms", 2, impl="auto", pin=0)]
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
            "max_epochs": epochs,
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
        from hvdscale.config import load_config
        from hvdscale.launch import horovod_env

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

    def worker_argv(self, mode, batch, out, extra=()):
        scale = 2.0 if self.lr_rule_2w == "linear" else 1.0
        workers = int(dict(zip(extra[::2], extra[1::2])).get("--workers", 1)) if extra else 1
        return [
            TRAIN_PY,
            WORKER,
            "--mode",
            mode,
            "--config",
            self.cfg_path,
            "--data-dir",
            self.data,
            "--batch",
            batch,
            "--epochs",
            self.a.epochs,
            "--out",
            out / "w",
            "--lr-scale",
            scale if workers > 1 else 1.0,
            *extra,
        ]

    def mpirun1(self, argv) -> list:
        x = []
        for k in sorted(self.hvd_env):
            x += ["-x", f"{k}={self.hvd_env[k]}"]
        return [MPIRUN, "-np", 1, "--bind-to", "none", *x, *argv]

    def run_worker(self, arm: Arm, batch: int, out: Path) -> dict:
        if arm.kind == "hvdstep":
            p = start(self.mpirun1(self.worker_argv("hvdstep", batch, out)), "0", self.hvd_env)
            wait_all([p], arm.label)
        else:
            self.port += 4
            procs = []
            for r in range(arm.workers):
                extra = ["--spe", arm.spe, "--jit", arm.jit]
                if arm.kind == "mwms":
                    extra += ["--workers", arm.workers, "--rank", r, "--impl", arm.impl]
                    extra += ["--port", self.port]
                cores = str(r) if arm.pin else None
                procs.append(start(self.worker_argv(arm.kind, batch, out, extra), cores))
            wait_all(procs, arm.label)
        r0 = json.loads((out / "w.rank0.json").read_text())
        thr = epoch_thr(r0["samples_per_epoch"], r0["epoch_times"])
        ph = [sum(e[i] for e in r0["phases"][1:]) for i in range(4)] if r0["phases"] else None
        return {
            "throughput": statistics.median(thr),
            "epoch_throughputs": thr,
            "data_share": ph[0] / sum(ph) if ph else None,
            "affinity": r0["affinity"],
        }

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
        ph = {k: sum(e[f"time_{k}_s"] for e in eps) for k in ("data", "compute", "sync", "update")}
        return {
            "throughput": statistics.median(e["throughput"] for e in eps),
            "epoch_throughputs": [e["throughput"] for e in eps],
            "data_share": ph["data"] / sum(ph.values()),
            "test_loss": rec["epochs"][-1]["test_loss"],
            "affinity": rec["config"].get("cpu_binding"),
        }

    def run_independent(self, batch: int, out: Path) -> dict:
        bar = out / "barrier"
        procs = []
        for i in range(2):
            d = out / f"p{i}"
            d.mkdir()
            extra = ["--barrier", bar, "--barrier-n", 2, "--barrier-id", i]
            argv = self.worker_argv("hvdstep", batch, d, extra)
            procs.append(start(self.mpirun1(argv), str(i), self.hvd_env))
        wait_all(procs, "independent")
        rs = [json.loads((out / f"p{i}" / "w.rank0.json").read_text()) for i in range(2)]
        per = [epoch_thr(r["samples_per_epoch"], r["epoch_times"]) for r in rs]
        thr = [a + b for a, b in zip(*per)]  # the epochs overlap (barrier): add them
        return {
            "throughput": statistics.median(thr),
            "epoch_throughputs": thr,
            "data_share": None,
            "affinity": [r["affinity"] for r in rs],
        }


# --------------------------------------------------------------------------- main


def measure(runner: Runner, arm: Arm, batch: int, phase: str, rep: int, rows: list) -> dict | None:
    t0 = time.time()
    with Measured(f"{arm.label} w{arm.workers} b{batch}") as m:
        try:
            r = runner.run(arm, batch)
        except Exception as exc:  # one failed candidate is reported, not fatal
            r = {"error": str(exc)[-1500:]}
    row = {
        "phase": phase,
        "repeat": rep,
        "batch": batch,
        "arm": arm.label,
        "family": arm.family,
        "workers": arm.workers,
        "spe": arm.spe if arm.kind in ("keras", "mwms") else None,
        "jit": arm.jit if arm.kind in ("keras", "mwms") else None,
        "impl": arm.impl if arm.kind == "mwms" and arm.workers > 1 else None,
        "pinned": arm.pin,
        "throughput": r.get("throughput"),
        "epoch_throughputs": " ".join(f"{t:.0f}" for t in r.get("epoch_throughputs", [])),
        "data_share": r.get("data_share"),
        "status": "failed" if "error" in r else "ok",
        "wall_s": round(time.time() - t0, 1),
        **m.fields(),
    }
    rows.append(row)
    if "error" in r:
        print(f"  {phase} r{rep} b{batch:5d} {arm.label:28s} w{arm.workers}: FAILED", flush=True)
        print("    " + r["error"].strip().replace("\n", "\n    ")[-1500:], flush=True)
        return None
    print(
        f"  {phase} r{rep} b{batch:5d} {arm.label:28s} w{arm.workers}: "
        f"{r['throughput']:9.0f} samples/s  ({row['wall_s']:.0f} s, load "
        f"{m.before:.2f} -> {m.after:.2f})",
        flush=True,
    )
    return r


def summarise(batches, paired, best, epochs, n_rep) -> list[dict]:
    rows = []

    def add(batch, metric, vals, arm="", workers="", note="", loads=()):
        if not vals:
            return  # an arm that was not paired (or failed every repeat)
        med, lo, hi = median_ci(vals)
        rows.append(
            {
                "batch": batch,
                "metric": metric,
                "arm": arm,
                "workers": workers,
                "median": med,
                "ci_low": lo,
                "ci_high": hi,
                "n": len(vals),
                "note": note,
                # the runs behind the figure: lowest and highest load seen around them
                "load": max(loads) if loads else None,
                "load_before": min(loads) if loads else None,
                "load_after": max(loads) if loads else None,
                "load_min": min(loads) if loads else None,
                "load_max": max(loads) if loads else None,
            }
        )

    for batch in batches:
        P = paired.get(batch, {})
        loads = [x for reps in P.values() for r in reps.values() for x in r["loads"]]

        def thr(key, P=P):
            return {rep: r["throughput"] for rep, r in P.get(key, {}).items()}

        one = {k: thr(k) for k in P if k[1] == 1}
        for (label, w), _ in sorted(P.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            add(batch, "throughput", list(thr((label, w)).values()), label, w, loads=loads)
        if not one:
            continue
        base_key = max(one, key=lambda k: statistics.median(one[k].values()))
        base = one[base_key]
        note_base = f"baseline: {base_key[0]}"

        def ratio(num_key, den, factor=1.0):
            n = thr(num_key)
            return [n[r] / (factor * den[r]) for r in n if r in den]

        hv2 = ("hvdscale", 2)
        ind = ("independent", 2)
        add(batch, "efficiency", ratio(hv2, base, 2.0), "hvdscale", 2, note_base, loads)
        add(batch, "efficiency_vs_ceiling", ratio(hv2, thr(ind)), "hvdscale", 2, "", loads)
        add(batch, "ceiling", ratio(ind, base, 2.0), "independent", 2, note_base, loads)
        mw2 = best.get((batch, "mwms", 2))
        if mw2:
            add(batch, "efficiency", ratio((mw2, 2), base, 2.0), mw2, 2, note_base, loads)
            add(
                batch,
                "ratio_hvdscale_vs_mwms",
                ratio(hv2, thr((mw2, 2))),
                "hvdscale",
                2,
                mw2,
                loads,
            )
        for fam in ("keras", "mwms"):
            b1 = best.get((batch, fam, 1))
            if b1:
                add(
                    batch,
                    f"ratio_hvdscale_vs_{fam}",
                    ratio(("hvdscale", 1), thr((b1, 1))),
                    "hvdscale",
                    1,
                    b1,
                    loads,
                )
    for r in rows:
        r["epochs"] = epochs
        r["repeats"] = n_rep
    return rows


def save(a, batches, paired, best, rows) -> list[dict]:
    """Write both CSVs from what has been measured so far; returns the summary rows."""
    done = len({rep for P in paired.values() for reps in P.values() for rep in reps})
    summary = summarise(batches, paired, best, a.epochs, done)
    for r in summary:
        r.update({"samples": a.samples, "lr_rule_2w": a.lr_rule_2w, "quick": int(a.quick)})
    out = Path(a.out_dir)
    write_csv("bench_scaling_runs", rows, out / "bench_scaling_runs.csv")
    write_csv("bench_scaling", summary, out / "bench_scaling.csv")
    return summary


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--repeats", type=int, default=3, help="paired repeats (default 3)")
    ap.add_argument("--tune-repeats", type=int, default=1, help="runs per tuning candidate")
    ap.add_argument("--samples", type=int, default=60000, help="curves (75 %% train)")
    ap.add_argument("--epochs", type=int, default=6, help="epochs per run, the first is warm-up")
    ap.add_argument("--batches", default="75,1000", help="per-worker batch sizes")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 8,000 curves, 3 epochs, a few candidates, 1 repeat, batch 75",
    )
    ap.add_argument(
        "--lr-rule-2w",
        choices=["none", "linear"],
        default="linear",
        help="learning-rate rule of every 2-worker run (all arms alike; no effect on speed)",
    )
    ap.add_argument(
        "--tuning-from",
        help="skip the tuning phase: take its rows (phase tune) from this runs CSV",
    )
    ap.add_argument("--full-tuning", action="store_true", help="more tuning candidates")
    ap.add_argument(
        "--paired-1w",
        default="hvdscale",
        help="1-worker arms (their best settings) in every paired repeat (add mwms)",
    )
    ap.add_argument(
        "--max-load",
        type=float,
        default=2.0,
        help="before every paired block wait (up to --max-wait s) for the load to drop below this",
    )
    ap.add_argument("--max-wait", type=float, default=60.0)
    ap.add_argument("--out-dir", default=str(RESULTS), help="where the two CSVs go")
    ap.add_argument("--work", default=str(ROOT / "benchmarks" / "out" / "scaling"))
    a = ap.parse_args(argv)
    if a.quick:
        a.repeats, a.tune_repeats, a.samples, a.epochs = 1, 1, 8000, 3
        if a.batches == "75,1000":
            a.batches = "75"
    batches = [int(b) for b in a.batches.split(",")]
    work = Path(a.work)
    cfg = base_config(a.samples, a.epochs, batches)
    data = build_data(work / f"data{a.samples}", cfg)
    cfg_path = work / f"config{a.samples}_e{a.epochs}.json"
    hvd("write-config", "--json", json.dumps(cfg), "--out", cfg_path)
    runner = Runner(a, cfg_path, data, work, a.lr_rule_2w)
    one, two = candidates(a.quick, a.full_tuning)
    t_start, load0 = time.time(), load_avg()
    warn_load(load0, "the start of bench_scaling")
    print(
        f"bench_scaling: {a.samples} curves, {a.epochs} epochs (1 warm-up), batches {batches}, "
        f"{a.tune_repeats} tuning + {a.repeats} paired repeat(s), load {load0:.2f}",
        flush=True,
    )
    rows: list[dict] = []

    # phase 1: tuning, interleaved (or taken from an earlier run's runs CSV)
    tune: dict = {}
    if a.tuning_from:
        every = {arm.label: arm for arm in sum(candidates(False, True), [])}
        every.update({arm.label: arm for arm in sum(candidates(True), [])})
        with open(a.tuning_from, newline="") as fh:
            for row in csv.DictReader(fh):
                if row["phase"] != "tune" or int(row["batch"]) not in batches:
                    continue
                arm = every[row["arm"]]
                arm = Arm(**{**arm.__dict__, "workers": int(row["workers"])})
                rows.append({k: v for k, v in row.items() if k not in ("machine",)})
                if row["status"] == "ok":
                    tune.setdefault((int(row["batch"]), arm), []).append(float(row["throughput"]))
        one = [arm for (_b, arm) in tune if arm.workers == 1]
        two = [arm for (_b, arm) in tune if arm.workers == 2]
        one, two = list(dict.fromkeys(one)), list(dict.fromkeys(two))
    for rep in range(0 if a.tuning_from else a.tune_repeats):
        for batch in batches:
            for arm in one + two:
                r = measure(runner, arm, batch, "tune", rep, rows)
                if r:
                    tune.setdefault((batch, arm), []).append(r["throughput"])
    best: dict = {}  # (batch, family, workers) -> label of the fastest candidate
    arms_by_label = {arm.label: arm for arm in one + two}
    for batch in batches:
        for arm in one + two:
            if (batch, arm) not in tune or arm.kind == "hvdstep":
                continue
            key = (batch, arm.family, arm.workers)
            med = statistics.median(tune[(batch, arm)])
            if key not in best or med > statistics.median(tune[(batch, arms_by_label[best[key]])]):
                best[key] = arm.label
        mine = [(k[1], k[2], v) for k, v in best.items() if k[0] == batch]
        print(f"  batch {batch}: best per arm: {mine}")

    # phase 2: paired repeats
    paired: dict = {}
    for rep in range(a.repeats):
        for batch in batches:
            plan = []
            fams = a.paired_1w.split(",")
            # the family of the fastest 1-worker tuning candidate is always paired too
            t1 = [(statistics.median(v), arm.family) for (b, arm), v in tune.items()]
            t1 = [x for x, (b, arm) in zip(t1, tune) if b == batch and arm.workers == 1]
            if t1 and max(t1)[1] not in fams:
                fams.append(max(t1)[1])
            for fam in fams:
                if (batch, fam, 1) in best:
                    plan.append((arms_by_label[best[(batch, fam, 1)]], 1))
            plan.append((Arm("hvdscale", 2), 2))
            plan.append((Arm("independent", 2), 2))
            if (batch, "mwms", 2) in best:
                plan.append((arms_by_label[best[(batch, "mwms", 2)]], 2))
            if rep % 2:
                plan.reverse()
            wait_for_load(a.max_load, a.max_wait)
            for arm, w in plan:
                arm = Arm(**{**arm.__dict__, "workers": w}) if arm.workers != w else arm
                r = measure(runner, arm, batch, "paired", rep, rows)
                if r:
                    r["loads"] = (rows[-1]["load_before"], rows[-1]["load_after"])
                    paired.setdefault(batch, {}).setdefault((arm.label, w), {})[rep] = r
            save(a, batches, paired, best, rows)  # after every block: a stopped run keeps it

    summary = save(a, batches, paired, best, rows)
    print(f"\n{'batch':>5} {'metric':28s} {'arm':28s} {'w':>2} {'median':>10} {'95 % CI':>22}")
    for r in summary:
        ci = f"({r['ci_low']:.3g}-{r['ci_high']:.3g})" if r["ci_low"] is not None else "(n<3)"
        print(
            f"{r['batch']:5d} {r['metric']:28s} {r['arm']:28s} {r['workers']!s:>2} "
            f"{r['median']:10.4g} {ci:>22} {r['note']}"
        )
    print(f"\nload {load0:.2f} -> {load_avg():.2f}; {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
