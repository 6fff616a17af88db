"""How a run's ranks are started: the launcher's argv and the ranks' environment.

Pure functions (no process is started): ``build_launch`` turns a launcher, a job layout
(``JobSpec``) and the config's training section into a ``LaunchSpec``; ``hvdscale.launch``
runs it. See ``hvdscale.launch`` for the launchers and the Horovod variables.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from hvdscale import native
from hvdscale.errors import UserError
from hvdscale.matrix import backends
from hvdscale.project import PROJECT_ROOT
from hvdscale.record.startup import stamp_env
from hvdscale.slurm import rendezvous, site, slots, timelimit
from hvdscale.slurm.jobspec import JobSpec
from hvdscale.slurm.threads import threads_for_rank

LAUNCHERS = ("horovodrun", "mpirun", "srun", "torchrun")
#: the interpreter module torchrun is (`python -m torch.distributed.run` = `torchrun`)
TORCHRUN_MODULE = "torch.distributed.run"
#: what the ranks of a training run execute (after PYTHON), whatever the framework:
#: ``hvdscale train`` reads the framework from the run id (trainer.rank.framework_for_run)
TRAIN_PROGRAM = ("-m", "hvdscale.cli", "train")
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
    "SLURM_JOB_ID",
    "SLURM_JOB_NODELIST",
    "CUDA_VISIBLE_DEVICES",
)


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


def default_train_python(cfg: dict, root: str | Path = PROJECT_ROOT) -> str:
    """The train env's interpreter: ROOT/environment.venv/bin/python for a venv
    deployment, else `python` (of the loaded environment modules or conda env)."""
    envc = cfg.get("environment", {})
    if envc.get("deployment", "venv") == "venv":
        return str(Path(root) / envc.get("venv", ".venv-train") / "bin" / "python")
    return "python"


def rank_path_env(
    environment: dict | None,
    root: str | Path = PROJECT_ROOT,
    environ: dict[str, str] | None = None,
) -> dict[str, str]:
    """PYTHONPATH of the ranks: for an env-modules or conda deployment ROOT/src (the
    project's package) ahead of the PYTHONPATH inherited from the loaded modules or the
    conda env, so their `python` (TensorFlow, Horovod, no hvdscale) runs ``-m
    hvdscale.cli``; nothing for a venv deployment (.venv-train has hvdscale installed)."""
    if (environment or {}).get("deployment", "venv") == "venv":
        return {}
    environ = os.environ if environ is None else environ
    src = str(Path(root).resolve() / "src")
    inherited = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != src]
    return {"PYTHONPATH": os.pathsep.join([src, *inherited])}


def gloo_env(training: dict, backend: str, framework: str = backends.DEFAULT_FRAMEWORK) -> dict:
    """LD_PRELOAD of hvdscale.native's library for ranks whose collectives are Gloo's
    (Horovod's Gloo operations, torch.distributed's gloo backend), unless
    training.gloo_yield_when_spinning is false. Gloo's TCP loop thread spins on epoll_wait
    during an allreduce; with a rank's threads bound to its own core the spinner keeps the
    thread that would make progress off the core until its time slice ends (a 2-rank
    allreduce of 614 kB: about 4 ms instead of under 1 ms, docs/performance.md). The
    library makes the spinning thread yield."""
    if not training.get("gloo_yield_when_spinning", True):
        return {}
    entry = backends.get(backend, framework)
    if "gloo" not in (entry.cpu_operations, entry.process_group):
        return {}
    return {"LD_PRELOAD": native.preload_value()}


def mkl_env(training: dict, framework: str, env: dict | None = None) -> dict:
    """LD_PRELOAD of hvdscale.native's MKL library for the ranks of a torch-ddp run when
    training.mkl_code_path is intel, ahead of what ``env`` (the ranks' environment so far:
    gloo_env's library) or else this process already preloads. The MKL in torch takes its
    slow generic code path on a non-Intel CPU (issue 32: a 1000x600 @ 600x192 fp32 GEMM
    2,169 us on the vendor path, 978 us on the Intel path on an AMD EPYC); the library
    answers MKL's vendor check with yes. Horovod-TF ranks ignore the setting (TensorFlow's
    matrix products are oneDNN's and Eigen's, not MKL's)."""
    if framework != "torch-ddp" or training.get("mkl_code_path", "vendor") != "intel":
        return {}
    environ = {**os.environ, **(env or {})}
    return {"LD_PRELOAD": native.preload_value(native.MKL_LIBRARY, environ)}


def horovod_env(
    training: dict,
    backend: str,
    timeline_path: str | None = None,
    framework: str = backends.DEFAULT_FRAMEWORK,
    workers: int = 1,
    bound: bool = False,
) -> dict[str, str]:
    """HOROVOD_* variables for a run of ``workers`` ranks (``bound``: each on cores of its
    own, ranks_bound) from the config's training section and backend (none for a
    framework without Horovod)."""
    env: dict[str, str] = {}
    if framework != backends.DEFAULT_FRAMEWORK:
        return env
    entry = backends.get(backend)  # hvdscale.matrix.backends: which collectives
    if entry.cpu_operations:
        env["HOROVOD_CPU_OPERATIONS"] = entry.cpu_operations
    if entry.gpu_operations:
        env["HOROVOD_GPU_OPERATIONS"] = entry.gpu_operations
    hv = training.get("horovod", {})
    cycle = cycle_time_ms(hv.get("cycle_time_ms"), workers, bound)
    if cycle is not None:
        env["HOROVOD_CYCLE_TIME"] = f"{cycle:g}"
    if hv.get("fusion_threshold_mb") is not None:
        env["HOROVOD_FUSION_THRESHOLD"] = str(
            int(round(float(hv["fusion_threshold_mb"]) * 1024 * 1024))
        )
    if entry.cpu_operations == "mpi" and hv.get("mpi_yield_when_idle", True):
        # Open MPI busy-polls while it waits; with a rank's threads bound to its own core
        # the polling of Horovod's background thread takes the core from TensorFlow's
        # compute (measured +40 % compute time at batch 1000 on 2 cores). Yield instead.
        env["OMPI_MCA_mpi_yield_when_idle"] = "1"
    if timeline_path:
        env["HOROVOD_TIMELINE"] = str(timeline_path)
    return env


# training.horovod.cycle_time_ms: auto (docs/performance-history.md, "Horovod's cycle
# time"). With 2 ranks, each bound to its own core, a short cycle
# hands a gradient to MPI sooner; a rank alone has nothing to coordinate, and every cycle
# wakes Horovod's background thread on the core the compute runs on.
AUTO_CYCLE_MS = {"alone": 1.0, "bound": 0.01, "shared": 0.1}


def cycle_time_ms(setting, workers: int, bound: bool) -> float | None:
    """HOROVOD_CYCLE_TIME (ms) of a run: the config's number, None for Horovod's own
    default (null), and for ``auto``: 1 ms (Horovod's default) for a 1-rank run, 0.01 ms
    when the run has several ranks, each bound to cores of its own (``bound``, see
    ranks_bound), else 0.1 ms (ranks that share cores: a short cycle would poll on them)."""
    if setting != "auto":
        return None if setting is None else float(setting)
    if workers <= 1:
        return AUTO_CYCLE_MS["alone"]
    return AUTO_CYCLE_MS["bound" if bound else "shared"]


def ranks_bound(training: dict, workers_per_node: int, node_cores: int) -> bool:
    """Whether the ranks will run on cores of their own: training.cpu_binding as
    hvdscale.trainer.placement.bind_cpus applies it (auto: core when a node runs 2 or more
    ranks and has a core for each), and no more ranks per node than cores."""
    policy = training.get("cpu_binding", "auto")
    own = 0 < workers_per_node <= node_cores
    return own and (policy == "core" or (policy == "auto" and workers_per_node > 1))


def effective_launcher(
    launcher: str, backend: str, framework: str = backends.DEFAULT_FRAMEWORK
) -> str:
    """The launcher that can run ``backend``: Gloo collectives need horovodrun's Gloo
    rendezvous (under mpirun/srun Horovod's controller is MPI, and
    HOROVOD_CPU_OPERATIONS=gloo crashes), so gloo runs always start with horovodrun
    --gloo; inside a SLURM allocation its hosts come from the allocation. torch-ddp
    runs start with torchrun, or srun."""
    # gloo: horovodrun, or srun + our own; torch-ddp: torchrun or srun
    controllers = backends.get(backend, framework).controllers
    return launcher if launcher in controllers else next(iter(controllers))


def controller_for(launcher: str, backend: str, framework: str = backends.DEFAULT_FRAMEWORK) -> str:
    """The Horovod controller a launcher/backend pair uses (hvdscale.matrix.backends; torch-ddp:
    the torch.distributed backend)."""
    controllers = backends.get(backend, framework).controllers
    if launcher not in controllers:
        raise UserError(
            f"backend {backend!r} needs launcher {next(iter(controllers))} (got {launcher!r})"
        )
    return controllers[launcher]


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
    started_at: float | None = None,
    environment: dict | None = None,
) -> LaunchSpec:
    """The one place that turns (launcher, backend, workers, nodes, workers_per_node)
    into the launcher's argv and the ranks' environment. ``started_at``: the launcher's
    start (time.time()), HVDSCALE_LAUNCH_START for every rank (hvdscale.record.startup:
    the ranks' start-up is measured from it); None: no stamp. ``environment``: the
    config's environment section (env-modules/conda: the project's src on the ranks'
    PYTHONPATH, rank_path_env)."""
    if launcher not in LAUNCHERS:
        raise UserError(f"launcher {launcher!r}: expected one of {', '.join(LAUNCHERS)}")
    notes: list[str] = []
    launcher = _resolve_launcher(launcher, job, notes)
    controller = controller_for(launcher, job.backend, job.framework)
    cpu_count = (os.cpu_count() or 1) if cpu_count is None else cpu_count
    env = _launch_env(training, job, launcher, out_dir, timeline, job.node_cores or cpu_count)
    # the launcher's start, in the launcher's environment: horovodrun passes all of it to
    # the ranks, mpirun through -x (every key of env), srun exports it, torchrun's
    # workers inherit it
    env.update(stamp_env(started_at))
    env.update(rank_path_env(environment))
    if launcher == "srun" and job.in_launcher_step:  # 1 worker: the rank in our own step
        argv, env, note = rendezvous.build_in_step(
            job=job, program_argv=list(program_argv), env=env, hosts=hosts, controller=controller
        )
        return LaunchSpec(argv, env, controller=controller, launcher="srun", notes=[*notes, note])
    if job.framework != backends.DEFAULT_FRAMEWORK:  # torch-ddp: torchrun or srun
        argv, env = _torch_launch(launcher, job, list(program_argv), env, hosts, srun, notes)
        return LaunchSpec(argv, env, controller=controller, launcher=launcher, notes=notes)
    if launcher == "srun" and controller == "gloo":  # Gloo across nodes without ssh
        argv, env, note = rendezvous.build_gloo_srun(
            job=job, program_argv=list(program_argv), env=env, hosts=hosts, srun=srun
        )
        notes = [note, *_gpu_notes(job)]
        return LaunchSpec(argv=argv, env=env, controller="gloo", launcher="srun", notes=notes)
    is_root_user = (os.geteuid() == 0) if is_root_user is None else is_root_user
    if launcher == "horovodrun":
        argv = _horovodrun_argv(horovodrun, job, hosts, controller, env, is_root_user)
    elif launcher == "mpirun":
        argv = _mpirun_argv(mpirun, job, hosts, env, notes, is_root_user, cpu_count)
    else:  # srun inside an allocation; the environment is exported by default
        argv = _srun_argv(srun, job, training, notes)
    return LaunchSpec(
        argv=argv + list(program_argv),
        env=env,
        controller=controller,
        launcher=launcher,
        notes=notes,
    )


def _resolve_launcher(launcher: str, job: JobSpec, notes: list[str]) -> str:
    """The launcher that can run the job's backend; a note when it is not ``launcher``."""
    fallback = effective_launcher(launcher, job.backend, job.framework)
    if fallback != launcher and job.framework != backends.DEFAULT_FRAMEWORK:
        notes.append(f"{job.framework} starts with {fallback} (launcher {launcher} is Horovod's)")
        return fallback
    if fallback != launcher:
        ctrl = controller_for(fallback, job.backend)
        notes.append(
            f"backend {job.backend} needs {fallback}'s {ctrl.capitalize()} rendezvous: "
            f"starting with {fallback} --{ctrl} instead of {launcher}"
            + (" (remote ranks via ssh to the allocation's nodes)" if job.nodes > 1 else "")
        )
        launcher = fallback
    return launcher


def _launch_env(
    training: dict, job: JobSpec, launcher: str, out_dir, timeline: bool | None, node_cores: int
) -> dict[str, str]:
    """The ranks' environment: Horovod, threads, SLURM node list, NCCL, time-limit signal."""
    timeline = training.get("timeline", False) if timeline is None else timeline
    tl_path = str(Path(out_dir).resolve() / "timeline.json") if (timeline and out_dir) else None
    bound = ranks_bound(training, job.workers_per_node, node_cores)
    env = horovod_env(training, job.backend, tl_path, job.framework, job.workers, bound)
    env.update(gloo_env(training, job.backend, job.framework))
    env.update(mkl_env(training, job.framework, env))  # both libraries when both apply
    env.update(
        {
            "HVDSCALE_LAUNCHER": launcher,
            "PYTHONUNBUFFERED": "1",
            "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1"),
            # threads per rank (auto: the launcher's SLURM_CPUS_PER_TASK, else 1)
            "OMP_NUM_THREADS": str(
                threads_for_rank(training.get("threads_per_worker", 1), os.environ)
            ),
        }
    )
    # the allocation's node list for the run record (HVDSCALE_SLURM_NODELIST: the plugin's
    # job step strips SLURM_JOB_NODELIST)
    env.update(slots.rank_env_from_slurm())
    env.update(site.nccl_env(training))  # NCCL_* from training.nccl, every launcher
    # SIGUSR1 from the launcher before the time limit (hvdscale.slurm.timelimit)
    env.update(timelimit.launch_env(training, out_dir, job.workers))
    return env


# Open MPI refuses to run as root without these
_OMPI_AS_ROOT = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _horovodrun_argv(
    horovodrun: str, job: JobSpec, hosts, controller: str, env: dict, is_root_user: bool
) -> list[str]:
    argv = [
        horovodrun,
        "-np",
        str(job.workers),
        "-H",
        hosts_argument(job, hosts),
        f"--{controller}",
    ]
    if controller == "mpi" and is_root_user:
        env.update(_OMPI_AS_ROOT)
    return argv


def _mpirun_argv(
    mpirun: str, job: JobSpec, hosts, env: dict, notes: list, is_root_user: bool, cpu_count: int
) -> list[str]:
    N = job.workers
    argv = [mpirun, "-np", str(N), "--bind-to", "none", "--map-by", "slot"]
    if job.nodes > 1 or hosts:
        argv += ["-H", hosts_argument(job, hosts)]
    if job.nodes == 1 and N > cpu_count:
        argv.append("--oversubscribe")
        notes.append(f"{N} ranks on {cpu_count} cores: --oversubscribe")
    if is_root_user:
        env.update(_OMPI_AS_ROOT)
    passed = sorted(set(env) | {k for k in PASS_ENV if k in os.environ})
    for k in passed:
        if k.startswith("OMPI_"):
            continue
        argv += ["-x", k]
    return argv


def _torch_launch(
    launcher: str, job: JobSpec, program_argv: list[str], env: dict, hosts, srun: str, notes: list
) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of a torch-ddp run: ``python -m torch.distributed.run --standalone`` (=
    torchrun) with the train env's interpreter on one machine, or one srun task per rank
    (hvdscale.slurm.rendezvous.build_torch_srun). ``program_argv``: PYTHON -m MODULE ...
    (a training run: PYTHON TRAIN_PROGRAM ...), which torchrun starts as ``-m MODULE ...``
    in each rank."""
    if launcher == "srun":
        argv, env, note = rendezvous.build_torch_srun(
            job=job, program_argv=program_argv, env=env, hosts=hosts, srun=srun
        )
        notes += [note, *_gpu_notes(job)]
        return argv, env
    if job.nodes > 1 or (hosts and len(hosts) > 1):
        raise UserError(
            f"{job.framework} on {job.nodes} node(s): start it with --launcher srun inside a "
            "SLURM allocation (torchrun here runs one machine's ranks only)"
        )
    python = program_argv[0]
    argv = [
        *(python, "-m", TORCHRUN_MODULE, "--standalone", "--nnodes=1"),
        *(f"--nproc-per-node={job.workers}", "--max-restarts=0"),
        *program_argv[1:],
    ]
    return argv, env


def _srun_argv(srun: str, job: JobSpec, training: dict, notes: list) -> list[str]:
    # counts and CPUs: from the job's layout (JobSpec; 2 or more ranks, see build_launch)
    # and the partition's GPU binding (scaling.partitions.<name>.gpu_bind)
    argv = job.srun_args(srun, mpi=training.get("srun_mpi"))
    notes += _gpu_notes(job)
    return argv


def _gpu_notes(job: JobSpec) -> list[str]:
    return [gpu_bind_note(job)] if backends.is_gpu_partition(job) else []


def gpu_bind_note(job: JobSpec) -> str:
    """The launcher's line on how the ranks of a GPU job get their GPU."""
    flags = " ".join(job.gpu_bind_args)
    if job.gpu_bind == "none":
        return (
            "GPU binding (gpu_bind none): every rank sees its node's GPUs and uses the one of "
            "its local rank"
        )
    return (
        f"GPU binding (gpu_bind {job.gpu_bind}): srun {flags} gives every rank one GPU "
        "(CUDA_VISIBLE_DEVICES), which it uses whatever its local rank"
    )


def hosts_argument(job: JobSpec, hosts: list[str] | None) -> str:
    """horovodrun -H / mpirun -H value: host:slots for each node of the job."""
    if hosts:
        names = hosts
    elif job.nodes == 1:
        names = ["localhost"]
    else:
        names = slots.slurm_hostnames()
        if not names:
            raise UserError(
                f"{job.nodes} nodes but no host list: run inside a SLURM allocation "
                "(SLURM_JOB_NODELIST) "
                "or pass --hosts host1,host2,..."
            )
    if len(names) < job.nodes:
        raise UserError(
            f"{job.nodes} nodes needed but only {len(names)} host(s) given: {', '.join(names)}"
        )
    out, left = [], job.workers
    for h in names[: job.nodes]:
        h, _, given = h.partition(":")
        n = min(left, int(given) if given else job.workers_per_node)
        out.append(f"{h}:{n}")
        left -= n
    if left > 0:
        raise UserError(
            f"{job.workers} workers do not fit on {job.nodes} node(s) "
            f"with {job.workers_per_node} each"
        )
    return ",".join(out)
