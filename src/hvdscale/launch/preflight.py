"""``hvdscale preflight``: prove, on a compute node of a partition, with the study's own train
env and launcher, that the partition's training runs can run there, before any of them
is submitted (rule preflight_partition; every train_run and allreduce sweep of the
partition waits for its JSON).

Checks, in order (each: name, ok, detail, seconds; a failed one also its fix):

- ``modules``: environment.deployment env-modules: every module of environment.modules
  is in LOADEDMODULES;
- ``data``: the data directory's manifest.json and every shard it lists are readable
  from the node, with the size the manifest records;
- ``train-env``: the train env's interpreter imports each framework the partition's
  runs use (TensorFlow + horovod.tensorflow, torch + torch.distributed), on every rank;
- ``gpus``: the GPUs the ranks see match scaling.partitions.<name>.gpus_per_node and
  gpu_model (NVML's or the framework's names; the node's SLURM record, Gres=gpu:TYPE:N;
  on a partition with emulated_gpus: the GPU ids SLURM bound, CUDA_VISIBLE_DEVICES);
- ``allreduce <framework> <backend>``: every (framework, backend) pair the partition's
  runs and allreduce sweeps use completes a 2-rank allreduce of the gradient's size
  (153,441 float32), across 2 nodes when the runs span nodes.

The ranks are started exactly as a training run's (``launch.launchspec.build_launch``
with the preflight's ``JobSpec``); each runs ``hvdscale preflight-rank``
(hvdscale.trainer.preflight).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hvdscale import native
from hvdscale.config.load import load_config
from hvdscale.errors import UserError
from hvdscale.io import write_json_atomic
from hvdscale.launch.launchspec import (
    LAUNCHERS,
    build_launch,
    default_train_python,
    rank_path_env,
)
from hvdscale.launch.runner import companion, describe_failure, run_spec, train_python_problem
from hvdscale.slurm import rendezvous
from hvdscale.slurm.deployment import module_load_problem
from hvdscale.slurm.preflight import GRADIENT_ELEMENTS, Preflight, node_gpus, preflights
from hvdscale.trainer.placement import GPU_FIX

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
RANK_TIMEOUT_S = 600


class Check:
    """One check's outcome, timed."""

    def __init__(self, name: str):
        self.name, self.ok, self.detail, self.fix = name, True, "", ""
        self.t0 = time.perf_counter()

    def done(self, ok: bool, detail: str, fix: str = "") -> Check:
        self.ok, self.detail, self.fix = ok, detail, "" if ok else fix
        self.seconds = round(time.perf_counter() - self.t0, 3)
        return self

    def as_dict(self) -> dict:
        d = {"name": self.name, "ok": self.ok, "detail": self.detail, "seconds": self.seconds}
        return {**d, "fix": self.fix} if not self.ok else d


# --------------------------------------------------------------------------- checks


def check_modules(cfg: dict, environ=None) -> Check:
    c = Check("modules")
    envc = cfg.get("environment") or {}
    if envc.get("deployment") != "env-modules":
        return c.done(True, f"deployment {envc.get('deployment', 'venv')}: no modules to load")
    environ = os.environ if environ is None else environ
    problem = module_load_problem(envc.get("modules", []), environ.get("LOADEDMODULES"))
    if problem:
        return c.done(False, problem, "fix environment.modules (module spider NAME on a node)")
    return c.done(True, "loaded: " + ", ".join(envc.get("modules", [])))


def check_data(data_dir: str | Path) -> Check:
    """manifest.json and every shard it lists: readable, an HDF5 file of the recorded size."""
    c = Check("data")
    data_dir = Path(data_dir)
    fix = (
        f"make {data_dir} readable from the partition's compute nodes (a file system the "
        "nodes mount, read permission for the job's user), or rebuild it: snakemake "
        "--forcerun split_dataset"
    )
    manifest = data_dir / "manifest.json"
    try:
        shards = json.loads(manifest.read_text())["shards"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return c.done(False, f"{manifest} is not readable from {node()}: {exc}", fix)
    n, total = 0, 0
    for _split, entries in sorted(shards.items()):
        for entry in entries:
            path = data_dir / entry["file"]
            try:
                with open(path, "rb") as fh:
                    head = fh.read(len(HDF5_SIGNATURE))
                size = path.stat().st_size
            except OSError as exc:
                return c.done(False, f"shard {path} is not readable from {node()}: {exc}", fix)
            if head != HDF5_SIGNATURE or size != entry.get("bytes", size):
                sig = "ok" if head == HDF5_SIGNATURE else "missing"
                return c.done(
                    False,
                    f"shard {path} read from {node()} is not the manifest's ({size} bytes, "
                    f"manifest {entry.get('bytes')}; HDF5 signature {sig})",
                    fix,
                )
            n, total = n + 1, total + size
    return c.done(True, f"{manifest} and {n} shards ({total / 1e6:.1f} MB) readable from {node()}")


def node() -> str:
    return os.environ.get("SLURMD_NODENAME") or os.uname().nodename


def _ids(cvd: str | None) -> list[str]:
    return [x for x in (cvd or "").split(",") if x.strip()]


def _norm(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def model_matches(model: str, name: str) -> bool:
    """Whether a GPU's name (NVML's 'NVIDIA A100-SXM4-40GB', a gres type 'a100') names
    gpu_model ('A100')."""
    m, n = _norm(model), _norm(name)
    return bool(m) and (m in n or n in m) and bool(n)


def check_gpus(
    pf: Preflight,
    part: dict,
    reports: list[dict],
    declared: Callable[[str], tuple[int, str] | None] = node_gpus,
) -> Check:
    """The GPUs every rank sees against the partition's gpus_per_node and gpu_model."""
    c = Check("gpus")
    name, want, model = pf.partition, int(part.get("gpus_per_node", 0)), part.get("gpu_model", "")
    seen = "; ".join(
        f"rank {r['rank']} on {r['node']}: CUDA_VISIBLE_DEVICES={r.get('cuda_visible_devices')}, "
        f"framework lists {len(r.get('gpus_listed', []))}"
        for r in reports
    )
    if want == 0:
        return c.done(True, f"CPU partition: no GPU expected ({seen})")
    key = f"scaling.partitions.{name}"
    per_rank = 1 if pf.job.gpu_bind in ("per-task", "single") else pf.job.gpus
    emulated = bool(part.get("emulated_gpus"))
    facts = []
    for node_name in sorted({r["node"] for r in reports}):
        decl = declared(node_name)
        if decl is None:
            facts.append(f"{node_name}: no SLURM node record (scontrol)")
            continue
        count, kind = decl
        facts.append(f"{node_name} declares gpu{':' + kind if kind else ''}:{count}")
        if count != want:
            return c.done(
                False,
                f"node {node_name} declares {count} GPUs (scontrol show node: Gres), "
                f"{key}.gpus_per_node says {want}",
                f"set {key}.gpus_per_node to {count}, or run on the partition you meant",
            )
        if model and kind and not model_matches(model, kind):
            return c.done(
                False,
                f"node {node_name} declares GPUs of type {kind} (scontrol show node: Gres), "
                f"{key}.gpu_model says {model}",
                f"set {key}.gpu_model to the nodes' GPU ({kind.upper()}), or run the sweeps "
                f"on the partition whose nodes have {model}",
            )
    for r in reports:
        where = f"rank {r['rank']} on {r['node']}"
        if emulated:
            got = len(_ids(r.get("cuda_visible_devices")))
            what = f"CUDA_VISIBLE_DEVICES={r.get('cuda_visible_devices')}"
        else:
            got = len(r.get("gpus_listed", []))
            listed = ", ".join(r.get("gpus_listed", [])) or "none"
            what = f"the framework lists {got} GPU(s) ({listed})"
        if got != per_rank:
            return c.done(
                False,
                f"{where}: {what}, expected {per_rank} (gpu_bind {pf.job.gpu_bind})",
                GPU_FIX.format(partition=name)
                if got == 0
                else f"check {key}.gpu_bind against how your site binds GPUs to tasks",
            )
        names = (r.get("nvml") or {}).get("names") or r.get("gpus_listed", [])
        if model and not emulated and names and not any(model_matches(model, n) for n in names):
            return c.done(
                False,
                f"{where}: GPUs {', '.join(names)}, {key}.gpu_model says {model}",
                f"set {key}.gpu_model to the nodes' GPU, or run on the partition that has {model}",
            )
    label = "emulated GPUs (CPU): SLURM-bound ids only" if emulated else "GPUs"
    return c.done(True, f"{label}; {per_rank} per rank as bound; {'; '.join(facts + [seen])}")


# --------------------------------------------------------------------------- ranks


def run_ranks(cfg, pf: Preflight, framework, backend, launcher, python, work: Path) -> tuple:
    """Start the 2 ranks of one (framework, backend) pair; (reports, failure text or None)."""
    work = work / f"{framework}-{backend}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    prog = [
        *(python, "-m", "hvdscale.cli", "preflight-rank"),
        *("--framework", framework, "--backend", backend, "--out-dir", str(work.resolve())),
    ]
    job = pf.layout(framework, backend)
    spec = build_launch(
        launcher=launcher,
        job=job,
        program_argv=prog,
        training=cfg["training"],
        horovodrun=companion(python, "horovodrun"),
        started_at=time.time(),
        environment=cfg.get("environment"),
    )
    try:
        native.check_built(spec.env)
    except UserError as exc:
        return [], str(exc)
    print(f"hvdscale preflight: {framework} {backend}: {spec.shell()}", file=sys.stderr, flush=True)
    try:
        with rendezvous.rendezvous_for(spec, python):
            status, tail = run_spec(spec, timeout_s=RANK_TIMEOUT_S)
    except OSError as exc:  # the launcher itself is missing
        return [], f"cannot start {spec.argv[0]}: {exc}"
    reports = [json.loads(f.read_text()) for f in sorted(work.glob("rank-*.json"))]
    if status != 0 or len(reports) < job.workers:
        why = describe_failure(tail, status, None, job.workers)
        errors = [r["import_error"] for r in reports if r.get("import_error")]
        return reports, "; ".join(errors) or f"{why}; output: {tail.strip()[-800:]}"
    return reports, None


def preflight(cfg: dict, partition: str, data_dir, launcher: str, python: str, work: Path):
    """Every check of ``partition`` (a list of Check; the run stops a framework's checks
    at its first failure)."""
    pfs = preflights(cfg)
    if partition not in pfs:
        raise UserError(
            f"--partition {partition!r}: no run of the config is on it "
            f"(partitions with runs: {', '.join(pfs) or 'none'})"
        )
    pf, part = pfs[partition], cfg["scaling"]["partitions"][partition]
    checks = [check_modules(cfg), check_data(data_dir)]
    if not all(c.ok for c in checks):  # no rank started on a node that lacks these
        return pf, checks
    env_check = Check("train-env")
    envc = cfg.get("environment") or {}
    if envc.get("deployment", "venv") != "venv":  # can the ranks' python import hvdscale?
        # in the ranks' environment: the project's src ahead of the modules' PYTHONPATH,
        # as build_launch gives the preflight's and the training runs' ranks
        problem = train_python_problem(python, {**os.environ, **rank_path_env(envc)})
        if problem:
            checks.append(env_check.done(False, problem, "see the message"))
            return pf, checks
    imported, gpus, allreduce = [], None, []
    for framework, backend in pf.checks:
        c = Check(f"allreduce {framework} {backend}")
        reports, failure = run_ranks(cfg, pf, framework, backend, launcher, python, work)
        import_errors = [r for r in reports if r.get("import_error")]
        if import_errors:
            r = import_errors[0]
            checks.append(
                env_check.done(
                    False,
                    f"the train env's {r['python']} on {r['node']}: {r['import_error']}",
                    f"install {framework}'s stack in the train env: `make setup` (venv), the "
                    "modules of environment.modules, or environment.conda_env; "
                    "`horovodrun --check-build` must list TensorFlow and the backend",
                )
            )
            return pf, checks + allreduce
        if reports and gpus is None:
            gpus = check_gpus(pf, part, reports)
        if failure:
            allreduce.append(
                c.done(False, failure, f"fix the {backend} backend of {framework} on {partition}")
            )
            continue
        secs = max(r["allreduce"].get("seconds", 0) for r in reports)
        nodes = len({r["node"] for r in reports})
        versions = ", ".join(f"{k} {v}" for k, v in reports[0].get("versions", {}).items())
        if not any(i.startswith(f"{framework} ") for i in imported):
            imported.append(f"{framework} ({versions})")
        allreduce.append(
            c.done(
                True,
                f"{len(reports)} ranks on {nodes} node(s): {GRADIENT_ELEMENTS:,} float32 "
                f"in {secs * 1e3:.2f} ms",
            )
        )
    checks.append(env_check.done(bool(imported), "imports: " + "; ".join(imported) or "none"))
    if gpus is not None:
        checks.append(gpus)
    return pf, checks + allreduce


# -------------------------------------------------- the command: hvdscale preflight


def add_arguments(p):
    p.add_argument("--config", required=True, help="config (YAML file, or a JSON snapshot)")
    p.add_argument("--partition", required=True, help="the partition to check")
    p.add_argument("--data-dir", required=True, help="data directory with manifest.json")
    p.add_argument("--out", required=True, help="output JSON, e.g. results/preflight/alpha.json")
    p.add_argument("--launcher", choices=LAUNCHERS, help="default: training.launcher")
    p.add_argument("--train-python", help="the train env's interpreter (as hvdscale launch)")


def run(args) -> int:
    """Check a partition before its training runs: env, GPUs, backends and data.

    Runs on a compute node of the partition (rule preflight_partition; every train_run
    and allreduce sweep of the partition waits for it) and starts 2 ranks with the
    study's launcher and train env, across 2 nodes when the partition's runs span nodes.
    Checks: modules (env-modules: LOADEDMODULES), data (manifest.json and every shard
    readable from the node), train-env (the framework and Horovod / torch.distributed
    import on every rank), gpus (what the ranks see against gpus_per_node and gpu_model;
    emulated GPUs: the ids SLURM bound), and one 2-rank allreduce of the gradient's size
    (153,441 float32) per framework and backend the partition's runs use.

    Writes OUT (each check: name, ok, detail, seconds) atomically, also when a check
    fails; then exits 1 with one line naming the failed check and its fix.

    Example:
      hvdscale preflight --config config/config.yaml --partition local \
      --data-dir results/data --out results/preflight/local.json
    """
    t0 = time.perf_counter()
    cfg = load_config(args.config)
    launcher = args.launcher or cfg["training"]["launcher"]
    python = args.train_python or default_train_python(cfg)
    out = Path(args.out)
    work = out.parent / f".{args.partition}.ranks"
    try:
        pf, checks = preflight(cfg, args.partition, args.data_dir, launcher, python, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failed = [c for c in checks if not c.ok]
    write_json_atomic(
        out,
        {
            "partition": args.partition,
            "ok": not failed,
            "node": node(),
            "nodes": pf.nodes,
            "launcher": launcher,
            "train_python": python,
            "emulated_gpus": bool(
                cfg["scaling"]["partitions"][args.partition].get("emulated_gpus")
            ),
            "checks": [c.as_dict() for c in checks],
            "seconds": round(time.perf_counter() - t0, 3),
        },
    )
    for c in checks:
        print(f"preflight {args.partition}: {c.name}: {'ok' if c.ok else 'FAILED'}: {c.detail}")
    if failed:
        c = failed[0]
        print(
            f"ERROR: preflight of partition {args.partition} failed at check {c.name!r}: "
            f"{c.detail}. Fix: {c.fix}. No training run of {args.partition} starts until "
            f"this passes ({out})",
            file=sys.stderr,
        )
        return 1
    return 0
