"""Gloo across SLURM nodes without ssh (issue 12), and torch-ddp ranks under srun (issue 19).

``horovodrun --gloo`` starts remote ranks by ssh, which many clusters forbid on compute
nodes. Inside a SLURM allocation ``hvdscale launch --launcher srun`` therefore runs a
gloo run in three pieces, the same ones horovodrun uses, with srun in place of ssh:

1. the launcher works out the slot plan (sequential fill: ``workers_per_node`` ranks on
   the first node, then the next; the same plan as Horovod's ``get_host_assignments``)
   from the allocation's host list;
2. it starts Horovod's own ``RendezvousServer`` (``horovod.runner.http.http_server``) in
   the train env (``python -m hvdscale.slurm.rendezvous serve``), initialised with that plan,
   and learns its port;
3. ``srun --mpi=none --distribution=block`` starts every rank through
   ``python -m hvdscale.slurm.rendezvous exec -- PROGRAM``, which turns SLURM_PROCID into the
   variables Horovod's Gloo controller reads (HOROVOD_RANK/SIZE, HOROVOD_LOCAL_RANK/SIZE,
   HOROVOD_CROSS_RANK/SIZE, HOROVOD_HOSTNAME), checks that srun placed the rank where the
   plan says, and execs PROGRAM. HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT,
   HOROVOD_CONTROLLER=gloo and HOROVOD_CPU_OPERATIONS=gloo come with srun's environment.

torch-ddp runs (``build_torch_srun``) use the same host list, slot plan and ``exec``
(``--framework torch-ddp``: RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE instead of
HOROVOD_*), with torch.distributed's own rendezvous on rank 0 (MASTER_ADDR: the first
host, MASTER_PORT: from the job id) instead of Horovod's server.

A 1-worker run (issue 29) starts no srun at all (``build_in_step``): its rank is a child
of ``hvdscale launch``, in the job step the launcher itself runs in. Under the Snakemake
SLURM plugin that step is the job's one task (``srun -n1 --cpus-per-task=...``, the
plugin's step for a non-MPI job): it holds the job's CPUs, its memory and, by srun's
default, all the GPUs (GRES) the job asked for. A nested ``srun --overlap`` step inside it
would get the CPUs but, depending on the site's Slurm version, neither the GPU nor the
memory the plugin's step already holds. The rank gets the environment an srun task of
the n-worker path gets from ``exec`` (``exec --rank 0``: Gloo's HOROVOD_* or
torch.distributed's RANK, WORLD_SIZE, ..., the same plan and rendezvous); an MPI rank runs
as an MPI singleton (``MPI_Init`` without mpirun or srun), without SLURM_STEP_ID and
SLURM_STEPID, which make Open MPI take it for a rank srun started without PMI ("OMPI was
not built with SLURM's PMI support") and abort.

The host list comes from ``scontrol show hostnames`` of SLURM_JOB_NODELIST, else
SLURM_NODELIST, else ``squeue -j $SLURM_JOB_ID -h -o %N``: the Snakemake SLURM plugin's
job step (snakemake-executor-plugin-slurm-jobstep) removes every SLURM_* variable but
the job id before it runs a rule. The same lookup fills ``slurm_nodelist`` of the run
record (HVDSCALE_SLURM_NODELIST, set by the launcher for the ranks). The host list and the
slot plan are ``hvdscale.slurm.slots``.

Pure Python in the workflow env (no Horovod import) except ``serve``, which runs in the
train env.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

from hvdscale.errors import UserError
from hvdscale.slurm.slots import (
    PLAN_HOSTS,
    PLAN_PER_NODE,
    PLAN_WORKERS,
    Slot,
    plan_from_env,
    slot_plan,
    slurm_hostnames,
    slurm_nodelist,
)

PORT_PLACEHOLDER = "<port>"
#: this module as ``python -m`` runs it in the ranks (exec) and next to the launcher (serve)
MODULE = "hvdscale.slurm.rendezvous"
#: Gloo's rendezvous waits 30 s by default; ranks that import TensorFlow on busy or
#: oversubscribed nodes reach hvd.init() minutes apart
DEFAULT_GLOO_TIMEOUT_S = "600"


def rendezvous_address(hosts: list[str]) -> str:
    """An address of this machine that the other hosts of the plan can reach."""
    me = socket.gethostname().split(".")[0]
    others = [h for h in hosts if h.split(".")[0] != me]
    for host in others:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((socket.gethostbyname(host), 9))  # no packet: picks the route
                return s.getsockname()[0]
        except OSError:
            continue
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


# =========================================================================== launch spec


def job_hosts(job, hosts: list[str] | None) -> list[str]:
    """The job's first ``job.nodes`` host names (given, from SLURM, or this host for one
    node), checked against the slot plan; UserError without a host list or a fitting plan."""
    if not hosts:
        hosts = slurm_hostnames() if job.nodes > 1 else [socket.gethostname().split(".")[0]]
    if not hosts:
        raise UserError(
            f"{job.nodes} nodes but no host list: run inside a SLURM allocation "
            "(SLURM_JOB_NODELIST, SLURM_NODELIST or squeue -j $SLURM_JOB_ID) "
            "or pass --hosts host1,host2,..."
        )
    hosts = [h.partition(":")[0] for h in hosts][: job.nodes]
    slot_plan(job.workers, job.workers_per_node, hosts)  # raises when it does not fit
    return hosts


def gloo_rank_env(job, hosts: list[str], env: dict[str, str]) -> dict[str, str]:
    """``env`` plus what every Gloo rank gets from the launcher, with srun or without:
    Horovod's Gloo controller and rendezvous (port filled in by :func:`rendezvous_for`),
    and the slot plan that ``exec`` turns into the rank's HOROVOD_* variables."""
    env = dict(env)
    env.update(
        {
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous_address(hosts),
            "HOROVOD_GLOO_RENDEZVOUS_PORT": PORT_PLACEHOLDER,
            "HOROVOD_GLOO_TIMEOUT_SECONDS": os.environ.get(
                "HOROVOD_GLOO_TIMEOUT_SECONDS", DEFAULT_GLOO_TIMEOUT_S
            ),
            **plan_env(job, hosts),
        }
    )
    return env


def torch_rank_env(job, hosts: list[str], env: dict[str, str]) -> dict[str, str]:
    """``env`` plus what every torch-ddp rank gets from the launcher, with srun or without:
    torch.distributed's env:// rendezvous on the first host and the slot plan that
    ``exec --framework torch-ddp`` turns into RANK, WORLD_SIZE, LOCAL_RANK, ..."""
    env = dict(env)
    env.update({"MASTER_ADDR": hosts[0], "MASTER_PORT": str(master_port()), **plan_env(job, hosts)})
    return env


def plan_env(job, hosts: list[str]) -> dict[str, str]:
    """The slot plan for ``exec`` (and ``serve``), and the launcher's name for the record."""
    return {
        PLAN_HOSTS: ",".join(hosts),
        PLAN_PER_NODE: str(job.workers_per_node),
        PLAN_WORKERS: str(job.workers),
        "HVDSCALE_LAUNCHER": "srun",
    }


def build_gloo_srun(
    *,
    job,
    program_argv: list[str],
    env: dict[str, str],
    hosts: list[str] | None,
    srun: str = "srun",
    srun_extra: list[str] | None = None,
) -> tuple[list[str], dict[str, str], str]:
    """(argv, env, note) of ``srun`` starting ``job.workers`` Gloo ranks (see the module
    doc); ``hvdscale.launch.launchspec`` makes them a LaunchSpec.

    ``env`` is the launcher's environment for the ranks (HOROVOD_* of the backend, ...);
    the rendezvous port is filled in by :func:`rendezvous_for` when the run starts.
    """
    hosts = job_hosts(job, hosts)
    env = gloo_rank_env(job, hosts, env)
    argv = [
        srun,
        "--mpi=none",
        "-n",
        str(job.workers),
        "-N",
        str(job.nodes),
        f"--ntasks-per-node={job.workers_per_node}",
        f"--cpus-per-task={job.cpus_per_task}",
        "--distribution=block",
        "--kill-on-bad-exit=1",
        *job.gpu_bind_args,  # scaling.partitions.<name>.gpu_bind (GPU partitions)
        *(srun_extra or []),
    ]
    python = program_argv[0]
    argv += [python, "-m", MODULE, "exec", "--", *program_argv]
    note = (
        "gloo without ssh: Horovod's rendezvous server runs next to this launcher "
        f"(port chosen at start), srun starts the ranks on {', '.join(hosts)}"
    )
    return argv, env, note


def master_port(env: dict[str, str] | None = None) -> int:
    """torch.distributed's rendezvous port of a SLURM job, derived from its job id (20000
    to 29999, below Linux's ephemeral ports), so that the jobs sharing a node differ;
    a free port outside SLURM."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if job and job.isdigit():
        return 20000 + int(job) % 10000
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def build_torch_srun(
    *, job, program_argv: list[str], env: dict[str, str], hosts: list[str] | None, srun: str
) -> tuple[list[str], dict[str, str], str]:
    """(argv, env, note) of ``srun`` starting ``job.workers`` torch-ddp ranks, one task per
    rank: the job's srun arguments (``JobSpec.srun_args``, ``--mpi=none``) with the block
    distribution of the slot plan, every task through ``exec --framework torch-ddp``
    (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE from SLURM_PROCID and the plan, which
    SLURM_NODEID/SLURM_LOCALID must match). The rendezvous is torch's own env:// store on
    rank 0: MASTER_ADDR the job's first host, MASTER_PORT from the job id (no ssh, no
    server next to the launcher)."""
    hosts = job_hosts(job, hosts)
    env = torch_rank_env(job, hosts, env)
    argv = [*job.srun_args(srun, mpi="none"), "--distribution=block"]
    python = program_argv[0]
    argv += [python, "-m", MODULE, "exec", "--framework", "torch-ddp", "--", *program_argv]
    note = (
        f"torch-ddp under srun: one task per rank on {', '.join(hosts)}, torch.distributed's "
        f"rendezvous at {env['MASTER_ADDR']}:{env['MASTER_PORT']} (rank 0)"
    )
    return argv, env, note


#: what makes Open MPI take a process for a rank that srun started (direct launch, which
#: needs SLURM's PMI): an MPI singleton in the launcher's own job step runs without them
SRUN_TASK_VARS = ("SLURM_STEP_ID", "SLURM_STEPID")


def launcher_step(env: dict[str, str] | None = None) -> str | None:
    """``JOBID.STEPID`` of the job step this process runs in, ``JOBID`` in a job outside
    any srun step (a batch script), None outside SLURM."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job:
        return None
    step = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    return f"{job}.{step}" if step else job


def in_step_note(job, controller: str, env: dict[str, str] | None = None) -> str:
    """The launcher's line on where the rank of a 1-worker run runs (``build_in_step``)."""
    env = os.environ if env is None else env
    step = launcher_step(env)
    where = (
        f"in SLURM job step {step}, the launcher's own (under the Snakemake SLURM plugin: "
        "the job's one task, with its CPUs, memory and GPUs)"
        if step and "." in step
        else (f"in SLURM job {step}, outside any srun step" if step else "outside SLURM")
    )
    note = f"1 worker: rank 0 runs as a child of this launcher {where}; no srun, no nested step"
    if controller == "mpi":
        note += (
            f"; an MPI singleton (no mpirun; {' and '.join(SRUN_TASK_VARS)} unset for it, "
            "else Open MPI takes it for a rank srun started)"
        )
    if job.gpus:
        note += f"; the step's GPUs: CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')!r}"
    return note


def build_in_step(
    *, job, program_argv: list[str], env: dict[str, str], hosts: list[str] | None, controller: str
) -> tuple[list[str], dict[str, str], str]:
    """(argv, env, note) of a 1-worker run under ``--launcher srun``: the single rank as a
    child of the launcher, in the launcher's own job step (see the module doc), with the
    environment an srun task of the same framework and controller gets (``gloo_rank_env``,
    ``torch_rank_env`` and ``exec --rank 0``; MPI: a singleton without SRUN_TASK_VARS)."""
    if job.workers != 1:
        raise UserError(f"build_in_step: {job.workers} workers; only a 1-worker run runs in-step")
    python = program_argv[0]
    if job.framework == "torch-ddp":
        env = torch_rank_env(job, job_hosts(job, hosts), env)
        exec_argv = [python, "-m", MODULE, "exec", "--framework", "torch-ddp", "--rank", "0"]
        argv = [*exec_argv, "--", *program_argv]
    elif controller == "gloo":
        env = gloo_rank_env(job, job_hosts(job, hosts), env)
        argv = [python, "-m", MODULE, "exec", "--rank", "0", "--", *program_argv]
    else:  # MPI (Horovod's MPI controller): MPI_Init as a singleton
        env = dict(env)
        argv = ["env", *(a for v in SRUN_TASK_VARS for a in ("-u", v)), *program_argv]
    return argv, env, in_step_note(job, controller)


@contextlib.contextmanager
def rendezvous_for(spec, python: str | None = None) -> Iterator[None]:
    """Run Horovod's RendezvousServer (train env) while the ranks of ``spec`` run; fills
    HOROVOD_GLOO_RENDEZVOUS_PORT. A no-op for every other launch."""
    if spec.env.get("HOROVOD_GLOO_RENDEZVOUS_PORT") != PORT_PLACEHOLDER:
        yield
        return
    python = python or spec.argv[spec.argv.index(MODULE) - 2]
    env = dict(os.environ)
    env.update(spec.env)
    proc = subprocess.Popen(
        [python, "-m", MODULE, "serve"],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        m = re.fullmatch(r"RENDEZVOUS_PORT=(\d+)\s*", line)
        if not m:
            proc.kill()
            raise UserError(
                f"Horovod's rendezvous server did not start ({python} -m {MODULE} "
                f"serve said {line.strip()!r}, exit {proc.wait()})"
            )
        spec.env["HOROVOD_GLOO_RENDEZVOUS_PORT"] = m.group(1)
        print(
            "hvdscale launch: Gloo rendezvous at "
            f"{spec.env['HOROVOD_GLOO_RENDEZVOUS_ADDR']}:{m.group(1)} (pid {proc.pid})",
            file=sys.stderr,
            flush=True,
        )
        yield
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# =========================================================================== in the ranks


def serve() -> int:
    """Start Horovod's RendezvousServer with the plan from the environment; print its
    port; serve until stdin closes or SIGTERM."""
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.http.http_server import RendezvousServer

    env = os.environ
    hosts = [h for h in env[PLAN_HOSTS].split(",") if h]
    per_node, workers = int(env[PLAN_PER_NODE]), int(env[PLAN_WORKERS])
    nodes = -(-workers // per_node)
    spec = ",".join(
        f"{h}:{min(per_node, workers - i * per_node)}" for i, h in enumerate(hosts[:nodes])
    )
    plan = get_host_assignments(parse_hosts(spec), workers)
    mine = slot_plan(workers, per_node, hosts)
    theirs = [
        (s.hostname, s.rank, s.local_rank, s.cross_rank, s.size, s.local_size, s.cross_size)
        for s in plan
    ]
    ours = [
        (s.hostname, s.rank, s.local_rank, s.cross_rank, s.size, s.local_size, s.cross_size)
        for s in mine
    ]
    if theirs != ours:  # the ranks' environment must describe Horovod's plan exactly
        print(f"gloo plan mismatch: horovod {theirs} vs ours {ours}", file=sys.stderr)
        return 2
    server = RendezvousServer(verbose=0)
    port = server.start()
    server.init(plan)
    print(f"RENDEZVOUS_PORT={port}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        sys.stdin.read()  # until the launcher closes the pipe (or exits)
    finally:
        server.stop()
    return 0


def exec_rank(program: list[str], framework: str = "horovod-tf", rank: int | None = None) -> int:
    """Set this rank's variables from SLURM_PROCID (or ``rank``: a rank the launcher
    started itself, without srun) and the plan and exec ``program``: Horovod's Gloo ones,
    or torch.distributed's (framework torch-ddp)."""
    env = os.environ
    if not program:
        raise UserError("rendezvous exec: no program given")
    slots = plan_from_env(env)
    if rank is None:
        slot = srun_slot(slots, env)
    elif 0 <= rank < len(slots):  # started by the launcher (build_in_step): no srun placement
        slot = slots[rank]
    else:
        raise UserError(f"rendezvous exec: --rank {rank} but the plan has {len(slots)}")
    new_env = dict(env)
    new_env.update(slot.torch_env() if framework == "torch-ddp" else slot.env())
    os.execvpe(program[0], program, new_env)
    return 127  # not reached


def srun_slot(slots: list[Slot], env: dict[str, str]) -> Slot:
    """The slot of the srun task ``env`` describes (SLURM_PROCID), checked against where
    srun placed it (SLURM_NODEID, SLURM_LOCALID, SLURM_STEP_NUM_TASKS)."""
    if "SLURM_PROCID" not in env:
        raise UserError("rendezvous exec: SLURM_PROCID is not set (start it with srun)")
    rank = int(env["SLURM_PROCID"])
    if not 0 <= rank < len(slots):
        raise UserError(f"rendezvous exec: SLURM_PROCID {rank} but the plan has {len(slots)}")
    slot = slots[rank]
    node_id = env.get("SLURM_NODEID")
    local_id = env.get("SLURM_LOCALID")
    if (node_id is not None and int(node_id) != slot.cross_rank) or (
        local_id is not None and int(local_id) != slot.local_rank
    ):
        raise UserError(
            f"rendezvous exec: srun placed rank {rank} as local id {local_id} on node {node_id}; "
            f"the Gloo plan says local rank {slot.local_rank} on node {slot.cross_rank} "
            "(srun needs --distribution=block and the plan's tasks per node)"
        )
    tasks = env.get("SLURM_STEP_NUM_TASKS")
    if tasks is not None and int(tasks) != slot.size:
        raise UserError(f"rendezvous exec: srun started {tasks} tasks; the plan has {slot.size}")
    return slot


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("serve", help="run Horovod's Gloo rendezvous server for the plan in the env")
    e = sub.add_parser("exec", help="set this srun task's rank env and exec PROGRAM")
    e.add_argument(
        "--framework",
        choices=["horovod-tf", "torch-ddp"],
        default="horovod-tf",
        help="Horovod's Gloo variables (default) or torch.distributed's RANK, WORLD_SIZE, ...",
    )
    e.add_argument(
        "--rank",
        type=int,
        default=None,
        help="this rank (a rank the launcher starts itself, no srun); default: SLURM_PROCID",
    )
    e.add_argument("program", nargs=argparse.REMAINDER)
    sub.add_parser("hosts", help="print the allocation's host names and node list")
    args = p.parse_args(argv)
    try:
        if args.cmd == "serve":
            return serve()
        if args.cmd == "exec":
            prog = args.program[1:] if args.program[:1] == ["--"] else args.program
            return exec_rank(prog, args.framework, args.rank)
        print(" ".join(slurm_hostnames()))
        print(slurm_nodelist() or "")
        return 0
    except UserError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
