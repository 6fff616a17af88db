"""The ``hvdscale launch`` command: one training run (or an allreduce measurement) as N
Horovod (or torch-ddp) ranks, from its launch spec (``launch.launchspec``), run and read
by ``launch.runner``; its ``--help`` is ``run``'s docstring."""

from __future__ import annotations

import os
import sys
import time

from hvdscale import native
from hvdscale.cliargs import add_options
from hvdscale.config.load import load_config
from hvdscale.errors import UserError
from hvdscale.launch.launchspec import (
    LAUNCHERS,
    PROGRAMS,
    build_launch,
    default_train_python,
)
from hvdscale.launch.runner import (
    allreduce_outcome,
    allreduce_program,
    clear_stale,
    companion,
    job_for,
    run_spec,
    torchrun_status,
    train_outcome,
    train_program,
    train_python_problem,
)
from hvdscale.record.build import write_failure
from hvdscale.slurm import rendezvous
from hvdscale.slurm.deployment import module_load_problem


def add_arguments(p):
    add_options(
        p,
        (
            "--config",
            {
                "required": True,
                "help": "validated config snapshot (JSON from hvdscale write-config, or a YAML "
                "config file)",
            },
        ),
        (
            "--program",
            {
                "choices": PROGRAMS,
                "default": "train",
                "help": "what the ranks run (default: train)",
            },
        ),
        ("--run-id", "run of the scaling matrix (train), e.g. local_gloo_n1_w2_b75_lrnone_r0"),
        ("--allreduce-id", "measure-allreduce: {partition}_{backend}_n{nodes}_w{workers}"),
        ("--data-dir", "train: data directory with manifest.json"),
        (
            "--target",
            "train: the study's target.json (rule calibrate_target), passed on to the ranks; "
            "none for a calibration run",
        ),
        (
            "--out-dir",
            "train: run directory (metrics.json, history.csv, checkpoint/, failure.json)",
        ),
        ("--out", "measure-allreduce: output CSV"),
        (
            "--sizes",
            "measure-allreduce: MIN:MAX[:xSTEP] message sizes in bytes (default 8:128Mi:x2)",
        ),
        ("--iterations", {"type": int, "help": "measure-allreduce: timed iterations per size"}),
        (
            "--warmup-iterations",
            {"type": int, "help": "measure-allreduce: untimed iterations per size"},
        ),
        ("--launcher", {"choices": LAUNCHERS, "help": "default: training.launcher of the config"}),
        (
            "--train-python",
            "interpreter of the train env (default: environment.venv/bin/python "
            "for venv deployments, `python` for env-modules/conda)",
        ),
        ("--hosts", "comma-separated host[:slots] list for multi-node runs outside SLURM"),
        ("--timeout", {"type": float, "help": "kill the job after this many seconds"}),
        (
            "--dry-run",
            {"action": "store_true", "help": "print the command and environment; start nothing"},
        ),
    )


def check_modules_loaded(cfg: dict, environ=None) -> None:
    """For environment.deployment env-modules: stop (UserError, no rank started) when a
    module of environment.modules is not in LOADEDMODULES. Snakemake 9 runs the job as
    `module purge && module load A B; hvdscale launch ...`, so a failed load does not
    stop it by itself."""
    envc = cfg.get("environment") or {}
    if envc.get("deployment") != "env-modules":
        return
    environ = os.environ if environ is None else environ
    problem = module_load_problem(envc.get("modules", []), environ.get("LOADEDMODULES"))
    if problem:
        raise UserError(problem)


def check_train_python(cfg: dict, python: str, rank_env: dict, environ=None) -> None:
    """For an env-modules or conda deployment: stop (UserError, no rank started) when the
    ranks' `python` does not find hvdscale and its dependencies in the ranks'
    environment (the venv deployment's .venv-train has them installed)."""
    if (cfg.get("environment") or {}).get("deployment", "venv") == "venv":
        return
    environ = os.environ if environ is None else environ
    problem = train_python_problem(python, {**environ, **rank_env})
    if problem:
        raise UserError(problem)


def run(args) -> int:
    """Start one training run (or an allreduce measurement) as N Horovod (or torch-ddp) ranks.

    Pure Python (no TensorFlow): runs from the workflow env and starts the ranks in the
    train env through the configured launcher:

      horovodrun  horovodrun -np N -H host:slots[,...] --gloo|--mpi PYTHON -m hvdscale.cli ...
      mpirun      mpirun -np N --bind-to none --map-by slot -x HOROVOD_...
                  PYTHON -m hvdscale.cli ...
      srun        srun --mpi=pmix -n N --kill-on-bad-exit=1 PYTHON -m hvdscale.cli ...
                  (inside a SLURM allocation: nodes and tasks per node come from it); a
                  1-worker run starts no srun: its rank is this command's child in its own
                  job step (hvdscale.slurm.rendezvous.build_in_step; a launch note says so)

    A torch-ddp run (run id {partition}_torch-ddp_{backend}_...) runs the same
    ``-m hvdscale.cli train`` (which reads the framework from the run id), started by
    ``PYTHON -m torch.distributed.run --standalone --nproc-per-node=N`` (torchrun) under
    horovodrun/mpirun, one srun task per rank under srun (slurm.rendezvous). torchrun exits
    1 for any failing rank: the exit status is the failing rank's own (its exit marker).

    The collective backend of the run (from its run_id) selects the Horovod environment:
    gloo -> HOROVOD_CPU_OPERATIONS=gloo with horovodrun's Gloo controller (Gloo needs
    horovodrun's rendezvous, so gloo runs start with horovodrun --gloo whatever the
    launcher; inside SLURM with the allocation's hosts); mpi ->
    HOROVOD_CPU_OPERATIONS=mpi with the MPI controller; nccl -> HOROVOD_GPU_OPERATIONS=NCCL.
    training.horovod.cycle_time_ms / fusion_threshold_mb become HOROVOD_CYCLE_TIME /
    HOROVOD_FUSION_THRESHOLD, training.horovod.mpi_yield_when_idle (mpi backend)
    OMPI_MCA_mpi_yield_when_idle=1, training.gloo_yield_when_spinning (gloo, also torch-ddp's)
    LD_PRELOAD of hvdscale.native's library (the run is refused when it is not built),
    training.mkl_code_path intel (torch-ddp runs only; Horovod-TF runs ignore it) LD_PRELOAD
    of its MKL library as well (the same refusal, naming that key),
    training.timeline HOROVOD_TIMELINE=OUT_DIR/timeline.json. Every rank gets
    HVDSCALE_LAUNCH_START, this command's start (hvdscale.record.startup: the run record's
    start-up and launch-to-target times count from it).

    The ranks' output streams to this command's stdout/stderr. Exit status 0 when the run
    completed with a valid record, and also when it stopped with a valid record of status
    nan_loss (a diverged configuration is a result; an ERROR line says so). Otherwise the
    status is non-zero and OUT_DIR/failure.json (measure-allreduce: OUT.failure.json)
    records run_id, status "failed", the exit status, the tail of the output and the time.

    Examples:
      hvdscale launch --config results/runs/local_gloo_n1_w2_b75_lrnone_r0/config.json \
      --run-id local_gloo_n1_w2_b75_lrnone_r0 --data-dir results/data \
      --out-dir results/runs/local_gloo_n1_w2_b75_lrnone_r0 --dry-run
      hvdscale launch --program measure-allreduce \
      --config results/config/allreduce/local_mpi_n1_w2.json \
      --allreduce-id local_mpi_n1_w2 --out results/allreduce/local_mpi_n1_w2.csv
    """
    started_at = time.time()  # the launcher's start: the ranks' start-up counts from it
    cfg = load_config(args.config)
    training = cfg["training"]
    launcher = args.launcher or training["launcher"]
    python = args.train_python or default_train_python(cfg)
    job, ident = job_for(cfg, args.program, args.run_id, args.allreduce_id)
    if args.program == "train":
        out_dir, failure_path, prog = train_program(args, python, ident)
    else:
        out_dir, failure_path, prog = allreduce_program(args, python, job)
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
        started_at=started_at,
        environment=cfg.get("environment"),
    )
    if args.dry_run:
        print(spec.shell())
        for n in spec.notes:
            print(f"# {n}")
        return 0
    return start_ranks(args, cfg, spec, python, job, ident, out_dir, failure_path)


def start_ranks(args, cfg, spec, python, job, ident, out_dir, failure_path) -> int:
    """Check the deployment, start the ranks of ``spec``, wait for them and judge the
    outcome (the exit status of ``hvdscale launch``; failure.json when it failed)."""
    check_modules_loaded(cfg)  # env-modules: Snakemake runs us whatever `module load` said
    check_train_python(cfg, python, spec.env)  # env-modules/conda: imports hvdscale?
    native.check_built(spec.env)  # Gloo / mkl_code_path intel: hvdscale.native's libraries
    clear_stale(args.program, out_dir, failure_path)
    print(f"hvdscale launch: {ident}: {spec.shell()}", file=sys.stderr, flush=True)
    for n in spec.notes:
        print(f"hvdscale launch: note: {n}", file=sys.stderr, flush=True)
    t0 = time.time()
    with rendezvous.rendezvous_for(spec, python):  # Horovod's Gloo rendezvous (gloo + srun)
        status, tail = run_spec(spec, timeout_s=args.timeout)
    took = time.time() - t0
    if status < 0:  # killed by a signal
        status = 128 - status
    if args.program == "train":
        done, status, msg = train_outcome(ident, out_dir, status, tail, t0, took, job.workers)
        if not done and spec.launcher == "torchrun":  # torchrun says 1 for any failure
            status = torchrun_status(status, tail, out_dir, job.workers)
            msg += f"; exit status {status}: the failing rank's (torchrun exits 1 for any)"
    else:
        done, status, msg = allreduce_outcome(ident, args.out, status, tail, took, job.workers)
    if done:
        return 0

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
