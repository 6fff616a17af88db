"""A bare allreduce of hvdscale's gradient at 2 ranks: what Horovod itself costs, without
training (train env). One float32 tensor of the network's size allreduced in a loop
inside a ``tf.function`` (benchmarks/_allreduce_worker.py), started by ``horovodrun``
with MPI and with Gloo, every arm with hvdscale's rank environment of the config
defaults unless the arm changes it (``ARMS``: the arm's ``settings``); a run's figure is
rank 0's median time per call. Paired repeats behind the quiet guard; the method and
what the arms show are in docs/performance.md ("A bare allreduce of the gradient").
Writes benchmarks/results/bench_allreduce_bare.csv: one ``run`` row per run and one
``summary`` row per arm (median over repeats, bootstrap 95 % interval, ratio to ``mpi``).

  .venv-train/bin/python benchmarks/bench_allreduce_bare.py [--repeats 3] [--iters 2000]
      [--arms mpi,gloo,...] [--csv FILE]
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
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import (  # noqa: E402
    ROOT,
    Measured,
    add_quiet_args,
    configure_quiet,
    merge_fields,
    paired_order,
    quiet_main,
    write_csv,
)

from hvdscale.analysis.stats import median_interval  # noqa: E402

WORKER = ROOT / "benchmarks" / "_allreduce_worker.py"
PARAMS = 153441


@dataclass(frozen=True)
class BareArm:
    name: str
    controller: str  # mpi | gloo | torch
    env: tuple = ()  # (key, value) pairs over hvdscale's Horovod environment
    bind: int = 1
    tensors: int = 1
    launcher_args: tuple = ()
    settings: str = "defaults"


NO_LIB = (("LD_PRELOAD", ""),)  # without hvdscale.native's epoll_wait library
# fmt: off
ARMS = {
    arm.name: arm
    for c in ("mpi", "gloo")
    for arm in (
        BareArm(c, c),  # the defaults (cycle time auto, each rank bound to its own core)
        BareArm(f"{c} cycle1", c, (("HOROVOD_CYCLE_TIME", "1"),), settings="cycle time 1 ms"),
        BareArm(f"{c} cycle0.1", c, (("HOROVOD_CYCLE_TIME", "0.1"),),
                settings="cycle time 0.1 ms (the former default)"),
        BareArm(f"{c} fusion0", c, (("HOROVOD_FUSION_THRESHOLD", "0"),),
                settings="no tensor fusion"),
        BareArm(f"{c} unbound", c, bind=0, settings="no CPU binding"),
        BareArm(f"{c} tensors8", c, tensors=8, settings="8 tensors, grouped allreduce"),
    )
}
for arm in (
    BareArm("gloo lo", "gloo", (("HOROVOD_GLOO_IFACE", "lo"),),
            launcher_args=("--network-interfaces", "lo"), settings="loopback interface"),
    BareArm("gloo spin", "gloo", NO_LIB,
            settings="without hvdscale.native (Gloo's loop thread spins)"),
    # a reference, only where torch is importable in the train env (not installed by hvdscale)
    BareArm("torch gloo", "torch",
            settings="torch.distributed gloo, as hvdscale's torch-ddp runs it"),
    BareArm("torch gloo spin", "torch", NO_LIB,
            settings="torch.distributed gloo without hvdscale.native"),
    # the same call without a collective: what a call costs by itself
    BareArm("tf call", "tfcall", settings="tf.function call, no allreduce"),
):
    ARMS[arm.name] = arm
# fmt: on


def horovod_env(controller: str, bound: bool = True) -> dict:
    """hvdscale's rank variables of the config defaults for this controller (Horovod's,
    and the Gloo library's), as the launcher sets them for 2 ranks on one node (bound:
    each on a core of its own); torch: those of a torch-ddp gloo run."""
    from hvdscale.config.load import validate_config
    from hvdscale.launch.launchspec import gloo_env
    from hvdscale.launch.launchspec import horovod_env as hv_env

    training = validate_config({})["training"]
    if controller == "torch":
        return gloo_env(training, "gloo", "torch-ddp")
    env = hv_env(training, controller, workers=2, bound=bound)
    return {**env, **gloo_env(training, controller)}


def base_env() -> dict:
    e = dict(os.environ)
    e["TF_CPP_MIN_LOG_LEVEL"] = "2"
    e["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + e.get("PYTHONPATH", "")
    for k in [k for k in e if k.startswith("HOROVOD_")]:
        e.pop(k)
    if os.geteuid() == 0:
        e.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    return e


def run_arm(arm: BareArm, a, out: Path) -> list[float]:
    """Start one run of ``arm``; rank 0's per-call times."""
    py = Path(sys.executable)
    common = ["--params", a.params, "--tensors", arm.tensors, "--iters", a.iters]
    common += ["--warmup", a.warmup, "--bind", arm.bind, "--out", out / "w"]
    env = base_env()
    if arm.controller != "tfcall":  # hvdscale's rank variables for the arm's collectives
        env.update(horovod_env(arm.controller, bool(arm.bind)))
    env.update(dict(arm.env))

    def popen(argv, env, **kw):
        return subprocess.Popen(list(map(str, argv)), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, **kw)  # fmt: skip

    if arm.controller in ("torch", "tfcall"):
        env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(29500 + os.getpid() % 500)})
        env["WORLD_SIZE"] = "2"
        argv = [py, WORKER, "--framework", arm.controller, *common]
        procs = []
        for r in range(2):
            renv = {**env, "RANK": str(r), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2"}
            if arm.bind:  # bound to core r as hvdscale's ranks (bind_cpus reads HOROVOD_LOCAL_*)
                renv.update(HOROVOD_LOCAL_RANK=str(r), HOROVOD_LOCAL_SIZE="2")
            procs.append(popen(argv, renv))
    else:
        horovodrun = shutil.which("horovodrun", path=str(py.parent)) or "horovodrun"
        argv = [horovodrun, "-np", 2, "-H", "localhost:2", f"--{arm.controller}"]
        argv += [*arm.launcher_args, py, WORKER, *common]
        procs = [popen(argv, env, start_new_session=True)]
    outs = [p.communicate(timeout=a.timeout)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{arm.name} failed:\n" + "\n".join(o[-3000:] for o in outs))
    return json.loads((out / "w.rank0.json").read_text())["times"]


def run_row(arm: BareArm, rep: int, times: list[float] | None, fields: dict, err="") -> dict:
    return {
        "row": "run",
        "arm": arm.name,
        "controller": arm.controller,
        "settings": arm.settings,
        "repeat": rep,
        "median_us": 1e6 * statistics.median(times) if times else None,
        "p10_us": 1e6 * sorted(times)[len(times) // 10] if times else None,
        "p90_us": 1e6 * sorted(times)[(9 * len(times)) // 10] if times else None,
        "calls": len(times) if times else 0,
        "status": "ok" if times else "failed",
        "error": err[-300:].replace("\n", " "),
        **fields,
    }


def summary_rows(arms: list[BareArm], runs: list[dict], a) -> list[dict]:
    ok = [r for r in runs if r["status"] == "ok" and r["valid"] == "true"]
    per = {
        arm.name: {r["repeat"]: r["median_us"] for r in ok if r["arm"] == arm.name} for arm in arms
    }
    rows = []
    for arm in arms:
        vals = per[arm.name]
        if not vals:
            continue
        m, lo, hi = median_interval(list(vals.values()), name="benchmark")
        ref = per.get("mpi", {})
        ratio = [vals[k] / ref[k] for k in vals if k in ref]
        parts = [r for r in ok if r["arm"] == arm.name]
        rows.append(
            {
                "row": "summary",
                "arm": arm.name,
                "controller": arm.controller,
                "settings": arm.settings,
                "median_us": m,
                "ci_low_us": lo,
                "ci_high_us": hi,
                "ratio_vs_mpi": statistics.median(ratio) if ratio else None,
                "repeats": len(vals),
                "runs_left_out": sum(1 for r in runs if r["arm"] == arm.name) - len(parts),
                "params": a.params,
                "bytes": 4 * a.params,
                "iters": a.iters,
                **merge_fields(parts),
            }
        )
    return rows


@quiet_main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--arms", default=",".join(ARMS), help="comma-separated arm names")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--iters", type=int, default=2000, help="timed calls per run")
    ap.add_argument("--warmup", type=int, default=200, help="untimed calls first")
    ap.add_argument("--params", type=int, default=PARAMS, help="float32 elements")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per run")
    ap.add_argument("--csv", help="default: benchmarks/results/bench_allreduce_bare.csv")
    add_quiet_args(ap)
    a = ap.parse_args(argv)
    configure_quiet(a)
    arms = [ARMS[n.strip()] for n in a.arms.split(",") if n.strip()]
    notes = []
    if any(arm.controller == "torch" for arm in arms) and not importlib.util.find_spec("torch"):
        arms = [arm for arm in arms if arm.controller != "torch"]
        notes.append("torch gloo reference not run: torch is not installed in the train env")
    runs: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench_allreduce_bare.") as tmp:
        for rep in range(a.repeats):
            for arm in paired_order(arms, rep):
                out = Path(tmp) / f"{arm.name.replace(' ', '_')}_r{rep}"
                out.mkdir()
                m = Measured(f"allreduce {arm.name} r{rep}")
                times, err = None, ""
                with m:
                    try:
                        times = run_arm(arm, a, out)
                    except (RuntimeError, subprocess.TimeoutExpired) as exc:
                        err = str(exc)
                runs.append(run_row(arm, rep, times, m.fields(), err))
                r = runs[-1]
                fig = f"{r['median_us']:8.1f} us/call" if times else "FAILED " + err[-500:]
                print(
                    f"  r{rep} {arm.name:16s} {fig}  (load {m.before:.2f}, foreign "
                    f"CPU {m.foreign}{'' if r['valid'] == 'true' else ', INVALID'})",
                    flush=True,
                )
    rows = runs + summary_rows(arms, runs, a)
    for r in rows:
        r["note"] = "; ".join(notes)
    write_csv("bench_allreduce_bare", rows, a.csv)
    for r in rows:
        if r["row"] == "summary":
            ratio = r["ratio_vs_mpi"]
            print(
                f"{r['arm']:16s} {r['median_us']:8.1f} us/call  x{ratio:.2f} of mpi"
                if ratio
                else f"{r['arm']:16s} {r['median_us']:8.1f} us/call"
            )
    return 0 if all(r["status"] == "ok" for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
