"""Start one training run (or an allreduce measurement) as N Horovod ranks.

Pure Python (no TensorFlow): runs from the workflow env and starts the ranks in the
train env through the configured launcher:

  horovodrun  horovodrun -np N -H host:slots[,...] --gloo|--mpi PYTHON -m hvdscale.cli ...
  mpirun      mpirun -np N --bind-to none --map-by slot -x HOROVOD_... PYTHON -m hvdscale.cli ...
  srun        srun --mpi=pmix -n N --kill-on-bad-exit=1 PYTHON -m hvdscale.cli ...
              (inside a SLURM allocation: nodes and tasks per node come from it)

The collective backend of the run (from its run_id) selects the Horovod environment:
gloo -> HOROVOD_CPU_OPERATIONS=gloo with horovodrun's Gloo controller (Gloo needs
horovodrun's rendezvous, so gloo runs start with horovodrun --gloo whatever the
launcher; inside SLURM with the allocation's hosts); mpi ->
HOROVOD_CPU_OPERATIONS=mpi with the MPI controller; nccl -> HOROVOD_GPU_OPERATIONS=NCCL.
training.horovod.cycle_time_ms / fusion_threshold_mb become HOROVOD_CYCLE_TIME /
HOROVOD_FUSION_THRESHOLD, training.horovod.mpi_yield_when_idle (mpi backend)
OMPI_MCA_mpi_yield_when_idle=1, training.timeline HOROVOD_TIMELINE=OUT_DIR/timeline.json.

The ranks' output streams to this command's stdout/stderr. Exit status 0 when the run
completed with a valid record, and also when it stopped with a valid record of status
nan_loss (a diverged configuration is a result; an ERROR line says so). Otherwise the
status is non-zero and OUT_DIR/failure.json (measure-allreduce: OUT.failure.json)
records run_id, status "failed", the exit status, the tail of the output and the time.

Examples:
  hvdscale launch --config results/runs/local_gloo_n1_w2_b75_lrnone_r0/config.json \\
      --run-id local_gloo_n1_w2_b75_lrnone_r0 --data-dir results/data \\
      --out-dir results/runs/local_gloo_n1_w2_b75_lrnone_r0 --dry-run
  hvdscale launch --program measure-allreduce \\
      --config results/config/allreduce/local_mpi_n1_w2.json \\
      --allreduce-id local_mpi_n1_w2 --out results/allreduce/local_mpi_n1_w2.csv
"""

from __future__ import annotations

import collections
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from hvdscale import gloo_slurm, site_settings, timelimit
from hvdscale.common import EXIT_NAN
from hvdscale.config import PROJECT_ROOT, find_run, load_config
from hvdscale.errors import UserError
from hvdscale.jobspec import JobSpec
from hvdscale.ranks import hosts_argument, rank_exit_codes

LAUNCHERS = ("horovodrun", "mpirun", "srun")
PROGRAMS = ("train", "measure-allreduce")
# environment passed to every rank (besides HOROVOD_*)
PASS_ENV = (
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "HOME",
    "TF_CPP_MIN_LOG_LEVEL",
    "PYTHONUNBUFFERED",
    "HVDSCALE_LAUNCHER",
    "OMP_NUM_THREADS",
    "HVDSCALE_ORPHAN_WATCHDOG",
    "HVDSCALE_FAULT_DELAY",  # test-only delay in one phase of the step (docs/timing.md)
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "CUDA_VISIBLE_DEVICES",
)


# the former name of JobSpec (same positional fields), kept for existing callers
Job = JobSpec


@dataclass
class LaunchSpec:
    argv: list[str]
    env: dict[str, str]  # variables set for the launcher (and passed on to the ranks)
    controller: str  # gloo | mpi
    launcher: str
    notes: list[str] = field(default_factory=list)

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return f"{env} {shlex.join(self.argv)}".strip()


# =========================================================================== pure functions


def horovod_env(training: dict, backend: str, timeline_path: str | None = None) -> dict[str, str]:
    """HOROVOD_* variables for a run from the config's training section and backend."""
    env: dict[str, str] = {}
    if backend == "gloo":
        env["HOROVOD_CPU_OPERATIONS"] = "gloo"
    elif backend == "mpi":
        env["HOROVOD_CPU_OPERATIONS"] = "mpi"
    elif backend == "nccl":
        env["HOROVOD_GPU_OPERATIONS"] = "NCCL"
    else:
        raise UserError(f"backend {backend!r}: expected nccl, mpi or gloo")
    hv = training.get("horovod", {})
    if hv.get("cycle_time_ms") is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{float(hv['cycle_time_ms']):g}"
    if hv.get("fusion_threshold_mb") is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(
            int(round(float(hv["fusion_threshold_mb"]) * 1024 * 1024))
        )
    if backend == "mpi" and hv.get("mpi_yield_when_idle", True):
        # Open MPI busy-polls while it waits; with a rank's threads bound to its own core
        # the polling of Horovod's background thread takes the core from TensorFlow's
        # compute (measured +40 % compute time at batch 1000 on 2 cores). Yield instead.
        env["OMPI_MCA_mpi_yield_when_idle"] = "1"
    if timeline_path:
        env["HOROVOD_TIMELINE"] = str(timeline_path)
    return env


def effective_launcher(launcher: str, backend: str) -> str:
    """The launcher that can run ``backend``: Gloo collectives need horovodrun's Gloo
    rendezvous (under mpirun/srun Horovod's controller is MPI, and
    HOROVOD_CPU_OPERATIONS=gloo crashes), so gloo runs always start with horovodrun
    --gloo; inside a SLURM allocation its hosts come from the allocation."""
    if backend == "gloo" and launcher == "srun":  # srun + our own rendezvous, no ssh
        return "srun"
    return "horovodrun" if backend == "gloo" else launcher


def controller_for(launcher: str, backend: str) -> str:
    """The Horovod controller a launcher/backend pair uses."""
    if backend == "gloo":
        if launcher == "srun":  # hvdscale.gloo_slurm
            return "gloo"
        if launcher != "horovodrun":
            raise UserError(f"backend 'gloo' needs launcher horovodrun (got {launcher!r})")
        return "gloo"
    if backend == "nccl" and launcher == "horovodrun":
        return "gloo"  # NCCL does the GPU collectives; the controller only coordinates
    return "mpi"


def build_launch(
    *,
    launcher: str,
    job: JobSpec,
    program_argv: list[str],
    training: dict,
    out_dir: str | Path | None = None,
    hosts: list[str] | None = None,
    horovodrun: str = "horovodrun",
    mpirun: str = "mpirun",
    srun: str = "srun",
    timeline: bool | None = None,
    is_root_user: bool | None = None,
    cpu_count: int | None = None,
) -> LaunchSpec:
    """The one place that turns (launcher, backend, workers, nodes, workers_per_node)
    into the launcher's argv and the ranks' environment."""
    if launcher not in LAUNCHERS:
        raise UserError(f"launcher {launcher!r}: expected one of {', '.join(LAUNCHERS)}")
    notes = []
    if effective_launcher(launcher, job.backend) != launcher:
        notes.append(
            f"backend gloo needs horovodrun's Gloo rendezvous: starting with horovodrun --gloo "
            f"instead of {launcher}"
            + (" (remote ranks via ssh to the allocation's nodes)" if job.nodes > 1 else "")
        )
        launcher = effective_launcher(launcher, job.backend)
    controller = controller_for(launcher, job.backend)
    timeline = training.get("timeline", False) if timeline is None else timeline
    tl_path = str(Path(out_dir).resolve() / "timeline.json") if (timeline and out_dir) else None
    env = horovod_env(training, job.backend, tl_path)
    env.update(
        {
            "HVDSCALE_LAUNCHER": launcher,
            "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1"),
            "OMP_NUM_THREADS": str(training.get("threads_per_worker", 1)),
        }
    )
    # the allocation's node list for the run record (HVDSCALE_SLURM_NODELIST: the plugin's
    # job step strips SLURM_JOB_NODELIST)
    env.update(gloo_slurm.rank_env_from_slurm())
    env.update(site_settings.nccl_env(training))  # NCCL_* from training.nccl, every launcher
    # SIGUSR1 from the launcher before the time limit (hvdscale.timelimit)
    env.update(timelimit.launch_env(training, out_dir, job.workers))
    if launcher == "srun" and job.backend == "gloo":  # Gloo across nodes without ssh
        return gloo_slurm.build_gloo_srun(
            job=job, program_argv=list(program_argv), env=env, hosts=hosts, srun=srun
        )
    is_root_user = (os.geteuid() == 0) if is_root_user is None else is_root_user
    cpu_count = os.cpu_count() or 1 if cpu_count is None else cpu_count
    N = job.workers
    if launcher == "horovodrun":
        argv = [horovodrun, "-np", str(N), "-H", hosts_argument(job, hosts), f"--{controller}"]
        if controller == "mpi" and is_root_user:
            env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    elif launcher == "mpirun":
        argv = [mpirun, "-np", str(N), "--bind-to", "none", "--map-by", "slot"]
        if job.nodes > 1 or hosts:
            argv += ["-H", hosts_argument(job, hosts)]
        if job.nodes == 1 and N > cpu_count:
            argv.append("--oversubscribe")
            notes.append(f"{N} ranks on {cpu_count} cores: --oversubscribe")
        if is_root_user:
            env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
        passed = sorted(set(env) | {k for k in PASS_ENV if k in os.environ})
        for k in passed:
            if k.startswith("OMPI_"):
                continue
            argv += ["-x", k]
    else:  # srun inside an allocation; the environment is exported by default
        # counts, CPUs and --overlap for 1 worker: from the job's layout (JobSpec)
        argv = job.srun_args(srun, mpi=training.get("srun_mpi"))
        if job.gpus_per_node:
            notes.append(
                "GPU binding: one GPU per local rank (tf.config.set_visible_devices on local_rank)"
            )
    return LaunchSpec(
        argv=argv + list(program_argv),
        env=env,
        controller=controller,
        launcher=launcher,
        notes=notes,
    )


def default_train_python(cfg: dict) -> str:
    """The train env's interpreter: environment.venv/bin/python, or `python` (modules/conda)."""
    envc = cfg.get("environment", {})
    if envc.get("deployment", "venv") == "venv":
        return str(PROJECT_ROOT / envc.get("venv", ".venv-train") / "bin" / "python")
    return "python"


def companion(python: str, tool: str) -> str:
    """``tool`` next to the train python (its venv's bin), else from PATH."""
    p = Path(python)
    if p.parent != Path("."):
        cand = p.parent / tool
        if cand.exists():
            return str(cand)
    return shutil.which(tool) or tool


# =========================================================================== running


def _reader(stream, sink, tail: collections.deque):
    for line in iter(stream.readline, ""):
        sink.write(line)
        sink.flush()
        tail.append(line)
    stream.close()


def run_spec(spec: LaunchSpec, timeout_s: float | None = None) -> tuple[int, str]:
    """Start the launcher in its own process group; stream its output; return (status, tail).

    SIGTERM/SIGINT to this process are forwarded to the launcher's group.
    """
    env = dict(os.environ)
    env.update(spec.env)
    tail_out: collections.deque = collections.deque(maxlen=200)
    tail_err: collections.deque = collections.deque(maxlen=200)
    proc = subprocess.Popen(
        spec.argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        bufsize=1,
        errors="replace",
    )
    timelimit.watch(proc, spec.env)  # SIGUSR1 to the ranks before the time limit
    threads = [
        threading.Thread(target=_reader, args=(proc.stdout, sys.stdout, tail_out), daemon=True),
        threading.Thread(target=_reader, args=(proc.stderr, sys.stderr, tail_err), daemon=True),
    ]
    for t in threads:
        t.start()

    def forward(signum, _frame):
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        status = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            status = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            status = proc.wait()
        tail_err.append(f"hvdscale launch: timed out after {timeout_s} s\n")
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    for t in threads:
        t.join(timeout=10)
    tail = "".join(list(tail_out)[-60:]) + "".join(list(tail_err)[-100:])
    return status, tail


_FIRST_FAILED = (
    re.compile(
        r"The first process to do so was:\s*Process name:\s*(\d+)\s*Exit code:\s*(-?\d+)"
    ),  # horovodrun
    re.compile(
        r"mpirun noticed that process rank (\d+) with PID \S+ on node \S+ exited on signal (\d+)"
    ),
    re.compile(r"Process (\d+) exit with status code (-?\d+)"),  # horovodrun, per process
    re.compile(
        r"srun: error: \S+: task (\d+): (?:Exited with exit code|Killed|Terminated)\s*(\d*)"
    ),
)


def describe_failure(tail: str, status: int, out_dir: Path | None, workers: int) -> str:
    """One line naming the rank that failed first (from the launcher's own report) and
    the ranks that left no exit marker (killed or crashed hard)."""
    parts = [f"launcher exit status {status}"]
    first = None
    for pat in _FIRST_FAILED:
        m = pat.search(tail)
        if m:
            first = (int(m.group(1)), m.group(2))
            break
    if first is not None:
        r, code = first
        how = ""
        if code and code.lstrip("-").isdigit():
            c = int(code)
            if pat is _FIRST_FAILED[1]:
                how = f" (signal {c})"
            elif c > 128 or c < 0:
                how = f" (exit code {c}: signal {c - 128 if c > 128 else -c})"
            else:
                how = f" (exit code {c})"
        parts.append(f"rank {r} failed first{how}")
    if out_dir is not None:
        codes = rank_exit_codes(out_dir, workers)
        started = [r for r in range(workers) if (out_dir / ".pids" / f"rank-{r}.pid").is_file()]
        lost = [r for r in started if r not in codes]
        if lost:
            parts.append(
                "no exit marker (killed or crashed) from rank(s) " + ", ".join(map(str, lost))
            )
        bad = {r: c for r, c in codes.items() if c not in ("0", str(EXIT_NAN))}
        if bad:
            parts.append(
                "exit status by rank: "
                + ", ".join(f"rank {r}: {c}" for r, c in sorted(bad.items()))
            )
    return "; ".join(parts)


# =========================================================================== command


def add_arguments(p):
    p.add_argument(
        "--config",
        required=True,
        help="validated config snapshot (JSON from hvdscale write-config, or a YAML config file)",
    )
    p.add_argument(
        "--program", choices=PROGRAMS, default="train", help="what the ranks run (default: train)"
    )
    p.add_argument(
        "--run-id", help="run of the scaling matrix (train), e.g. local_gloo_n1_w2_b75_lrnone_r0"
    )
    p.add_argument(
        "--allreduce-id", help="measure-allreduce: {partition}_{backend}_n{nodes}_w{workers}"
    )
    p.add_argument("--data-dir", help="train: data directory with manifest.json")
    p.add_argument(
        "--out-dir",
        help="train: run directory (metrics.json, history.csv, checkpoint/, failure.json)",
    )
    p.add_argument("--out", help="measure-allreduce: output CSV")
    p.add_argument(
        "--sizes",
        help="measure-allreduce: MIN:MAX[:xSTEP] message sizes in bytes (default 8:128Mi:x2)",
    )
    p.add_argument("--iterations", type=int, help="measure-allreduce: timed iterations per size")
    p.add_argument(
        "--warmup-iterations", type=int, help="measure-allreduce: untimed iterations per size"
    )
    p.add_argument("--launcher", choices=LAUNCHERS, help="default: training.launcher of the config")
    p.add_argument(
        "--train-python",
        help="interpreter of the train env (default: environment.venv/bin/python "
        "for venv deployments, `python` for env-modules/conda)",
    )
    p.add_argument(
        "--hosts", help="comma-separated host[:slots] list for multi-node runs outside SLURM"
    )
    p.add_argument(
        "--timeout", type=float, default=None, help="kill the job after this many seconds"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the command and environment; start nothing"
    )


def job_for(
    cfg: dict, program: str, run_id: str | None, allreduce_id: str | None
) -> tuple[JobSpec, str]:
    """The job layout and identifier of a training run or an allreduce sweep."""
    if program == "train" or (run_id and not allreduce_id):
        if not run_id:
            raise UserError("--run-id is required")
        r = find_run(cfg, run_id)
        return JobSpec.for_run(cfg, r), r.run_id
    if not allreduce_id:
        raise UserError("measure-allreduce needs --allreduce-id (or --run-id)")
    return JobSpec.for_allreduce_id(cfg, allreduce_id), allreduce_id


def run(args) -> int:
    cfg = load_config(args.config)
    training = cfg["training"]
    launcher = args.launcher or training["launcher"]
    python = args.train_python or default_train_python(cfg)
    job, ident = job_for(cfg, args.program, args.run_id, args.allreduce_id)

    if args.program == "train":
        if not args.data_dir or not args.out_dir:
            raise UserError("train needs --data-dir and --out-dir")
        out_dir = Path(args.out_dir)
        failure_path = out_dir / "failure.json"
        prog = [
            python,
            "-m",
            "hvdscale.cli",
            "train",
            "--config",
            str(Path(args.config).resolve()),
            "--run-id",
            ident,
            "--data-dir",
            str(Path(args.data_dir).resolve()),
            "--out-dir",
            str(out_dir.resolve()),
        ]
    else:
        if not args.out:
            raise UserError("measure-allreduce needs --out CSV")
        out_dir = Path(args.out_dir) if args.out_dir else Path(args.out).parent
        failure_path = Path(str(args.out) + ".failure.json")
        prog = [
            python,
            "-m",
            "hvdscale.cli",
            "measure-allreduce",
            "--out",
            str(Path(args.out).resolve()),
            "--partition",
            job.partition,
            "--backend",
            job.backend,
            "--nodes",
            str(job.nodes),
        ]
        if args.sizes:
            prog += ["--sizes", args.sizes]
        if args.iterations:
            prog += ["--iterations", str(args.iterations)]
        if args.warmup_iterations:
            prog += ["--warmup-iterations", str(args.warmup_iterations)]
    hosts = [h for h in args.hosts.split(",") if h] if args.hosts else None
    spec = build_launch(
        launcher=launcher,
        job=job,
        program_argv=prog,
        training=training,
        out_dir=out_dir if args.program == "train" else None,
        hosts=hosts,
        horovodrun=companion(python, "horovodrun"),
        mpirun="mpirun",
        srun="srun",
    )
    if args.dry_run:
        print(spec.shell())
        for n in spec.notes:
            print(f"# {n}")
        return 0

    out_dir.mkdir(parents=True, exist_ok=True)
    if failure_path.exists():
        failure_path.unlink()  # stale: from an earlier attempt
    if args.program == "train":
        pids = out_dir / ".pids"
        if pids.is_dir():
            shutil.rmtree(pids, ignore_errors=True)
    print(f"hvdscale launch: {ident}: {spec.shell()}", file=sys.stderr, flush=True)
    for n in spec.notes:
        print(f"hvdscale launch: note: {n}", file=sys.stderr, flush=True)
    t0 = time.time()
    with gloo_slurm.rendezvous_for(spec, python):  # Horovod's Gloo rendezvous (gloo + srun)
        status, tail = run_spec(spec, timeout_s=args.timeout)
    took = time.time() - t0
    if status < 0:  # killed by a signal
        status = 128 - status

    from hvdscale.runrecord import read_record, write_failure

    if args.program == "train":
        record = (
            read_record(out_dir / "metrics.json") if (out_dir / "metrics.json").exists() else None
        )
        fresh = record is not None and (out_dir / "metrics.json").stat().st_mtime >= t0 - 1
        if record is not None and fresh and record["status"] == "completed" and status == 0:
            print(f"hvdscale launch: {ident}: completed in {took:.1f} s", file=sys.stderr)
            return 0
        if record is not None and fresh and record["status"] == "nan_loss":
            print(
                f"ERROR: {ident}: training diverged ({record.get('error')}); the run record "
                f"{out_dir / 'metrics.json'} has status nan_loss and stays for the report",
                file=sys.stderr,
            )
            return 0
        if status == 0:
            status = 1  # a launcher that says 0 without a valid record is a failure too
            msg = "the ranks exited 0 but no valid metrics.json was written"
        else:
            msg = describe_failure(tail, status, out_dir, job.workers)
    else:
        if status == 0 and Path(args.out).is_file():
            print(
                f"hvdscale launch: {ident}: allreduce sweep written to {args.out} in {took:.1f} s",
                file=sys.stderr,
            )
            return 0
        msg = (
            describe_failure(tail, status, None, job.workers) if status else "no output CSV written"
        )
        status = status or 1
    write_failure(
        failure_path,
        run_id=ident,
        exit_status=status,
        error_tail=tail,
        launcher=spec.launcher,
        command=spec.argv,
        program=args.program,
        message=msg,
    )
    print(f"ERROR: {ident}: failed ({msg}); see {failure_path}", file=sys.stderr)
    return status if 0 < status < 256 else 1
