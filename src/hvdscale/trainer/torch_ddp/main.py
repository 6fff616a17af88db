"""Train one run with PyTorch DDP: this is ONE rank of a torch.distributed job (train env).

Started N times by ``torchrun --standalone --nproc-per-node N -m hvdscale.trainer.torch_ddp ARGS``
(started directly it is a one-rank job). The arguments, the run and the outputs are those
of ``hvdscale train`` (``hvdscale.trainer.horovod_tf.main``): the validated config snapshot,
a run id of its scaling matrix, the data directory, OUT_DIR; rank 0 writes OUT_DIR/metrics.json
(the run record, valid against workflow/schemas/run.schema.json) and history.csv, and a
checkpoint per epoch in OUT_DIR/checkpoint/ (re-running the command resumes).

What is shared with the Horovod trainer, unchanged: the rows each rank reads
(``trainer.data.load_rank_data``), the seeds (run seed for the weights, the shuffle rule of
``train.loop``), the epoch loop with its validation/test evaluation, stop rules,
checkpoints and SIGUSR1 time-limit stop (``train.loop``, ``train.checkpoint``,
``launch.timelimit``), and the run record (``record.build.build_record``, ``labelproof``).
What differs: ``TorchWorker`` (collectives through torch.distributed), ``net`` (network,
KerasAdam, LR) and ``step`` (DDP steps). The record says ``config.framework`` =
``torch-ddp`` and its label proof adds what torch.distributed reports (backend, world
size) to the hosts.

Exit status: 0 completed; 3 non-finite loss (a record with status nan_loss); 4 stopped
for the SLURM time limit (checkpoint written); 2 bad input; 1 other errors.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

import torch
import torch.distributed

from hvdscale.errors import UserError
from hvdscale.matrix.config import config_hash, load_config
from hvdscale.matrix.runtable import find_run
from hvdscale.record.build import (
    EXIT_NAN,
    build_record,
    environment_block,
    system_block,
    utc_now,
    write_run_outputs,
)
from hvdscale.record.labelproof import prove
from hvdscale.trainer.checkpoint import Checkpointer
from hvdscale.trainer.data import load_rank_data
from hvdscale.trainer.device import bind_cpus
from hvdscale.trainer.fault import FaultDelay
from hvdscale.trainer.horovod_tf.main import (
    add_arguments,
    announce_fault,
    check_worker_count,
    make_sampler,
    read_target,
    run_rank,
    utilisation_block,
)
from hvdscale.trainer.loop import LoopPlan, train_epochs
from hvdscale.trainer.torch_ddp.device import CudaFacts, choose_device, device_label
from hvdscale.trainer.torch_ddp.dist import TorchWorker, detect_torch_launcher, torch_rank_env
from hvdscale.trainer.torch_ddp.net import TorchOptimisation
from hvdscale.trainer.torch_ddp.step import TorchStepProgram

FRAMEWORK = "torch-ddp"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m hvdscale.trainer.torch_ddp",
        description=__doc__.split("\n\n")[0],
        epilog="Example: torchrun --standalone --nproc-per-node 2 -m hvdscale.trainer.torch_ddp "
        "--config results/config/full.json --run-id local_torch-ddp_gloo_n1_w2_b75_lrnone_r0 "
        "--data-dir results/data --out-dir results/runs/local_torch-ddp_gloo_n1_w2_b75_lrnone_r0"
        " (hvdscale launch starts it so, or with srun on SLURM)",
    )
    add_arguments(p)
    p.add_argument("--backend", default=None, choices=["gloo", "nccl"],
                   help="torch.distributed backend (default: the run id's: gloo on CPUs, "
                   "nccl on GPUs); the run id's backend must name the same")  # fmt: skip
    return p


def run(args) -> int:
    """Run one rank; leave OUT_DIR/.pids/rank-N.exit with the exit status."""
    # torchrun's SIGTERM (another rank failed) ends this rank at once, even inside a
    # blocked gloo collective (the default action; a Python handler would wait for it)
    return run_rank(args, torch_rank_env()["rank"], train_rank, signal.SIG_DFL)


def train_rank(args, out_dir: Path) -> int:
    """Train this rank's part of the run; rank 0 writes the run record. Exit status."""
    cfg = load_config(args.config)
    run_ = find_run(cfg, args.run_id)
    tcfg = cfg["training"]
    started_utc = utc_now()
    target = read_target(args.target)
    r = torch_rank_env()
    bound = bind_cpus(tcfg.get("cpu_binding", "auto"), r["local_rank"], r["local_size"])
    torch.set_num_threads(int(tcfg["threads_per_worker"]))
    check_backend(run_, args.backend)
    device = torch.device(
        choose_device(run_.backend, r["local_rank"], run_.run_id, CudaFacts.probe())
    )
    worker = TorchWorker.init(run_.backend, device)  # nccl: set_device, then the group
    check_worker_count(run_, worker)
    log = root_logger(worker)
    log(
        f"{run_.run_id}: {worker.size} rank(s), torch {torch.__version__} DDP over "
        f"{worker.backend} on {device_label(device)}, {torch.get_num_threads()} thread(s)"
        + (f", bound to cores {bound}" if bound else "")
    )
    fault = announce_fault(FaultDelay.from_env())
    data = load_rank_data(Path(args.data_dir), cfg, worker, run_.batch)
    optim = TorchOptimisation.build(
        cfg, run_.lr_rule, worker.size, data.steps, run_.seed, device=device
    )
    chash = config_hash(cfg)
    checkpointer = Checkpointer.for_run(
        out_dir, optim.checkpoint(), run_.run_id, chash, worker.size, run_.seed, tcfg
    )
    progress = checkpointer.restore(worker, log)
    optim.broadcast(worker)
    if not progress.history and worker.is_root:
        progress.initial_weights_sha256 = optim.weights_sha256()
    progress.begin_attempt(started_utc)
    environment, system = describe_environment(worker, chash, progress.attempts[0])
    program = TorchStepProgram(
        optim, worker, tcfg, train=(data.x_train, data.y_train),
        test=(data.x_test, data.y_test), val=(data.x_val, data.y_val), batch=run_.batch,
        fault=fault,
    )  # fmt: skip
    data.release()
    plan = LoopPlan.from_config(
        cfg, run_.run_id, data.steps, run_.batch * worker.size, run_.seed, target["value"]
    )
    sampler = make_sampler(worker)
    result = train_epochs(program, worker, plan, progress, checkpointer, sampler, optim, log)
    proof_extra = torch_label_facts(worker)
    program.close()  # DDP's reducer before the group it uses (else: abort at exit)
    worker.shutdown()
    if result.exit_code is not None:  # stopped before the time limit: the retry resumes
        return result.exit_code
    if not worker.is_root:
        return 0
    record = build_record(
        run=run_, cfg=cfg, workers=worker.size, controller=worker.controller,
        launcher=detect_torch_launcher(), status=result.status, error=result.error,
        learning_rate_base=optim.lr_base, learning_rate=optim.lr,
        model_parameters=optim.n_params, steps_per_epoch=data.steps,
        environment=environment, attempts=progress.attempts, epochs=progress.history,
        utilisation=utilisation_block(sampler, progress.utilisation_samples),
        timeline=None, timeline_check=None,
        data={**data.info, "test_values": result.test_values},
        fault_delay=fault.describe(), system=system, seed=run_.seed,
        kind=getattr(run_, "kind", ""), target=target, stop_reason=result.stop_reason,
        initial_weights_sha256=progress.initial_weights_sha256, framework=FRAMEWORK,
    )  # fmt: skip
    record["config"]["framework"] = FRAMEWORK
    record["config"]["timeline_steps"] = 0  # a Horovod timeline: torch-ddp records none
    record["config"]["data_in_device_memory"] = True  # torch-ddp: always on the rank's device
    record["label_proof"] = label_proof(record, proof_extra)
    write_run_outputs(out_dir, record)
    log(f"wrote {out_dir / 'metrics.json'} (status {result.status})")
    return EXIT_NAN if result.status == "nan_loss" else 0


def root_logger(worker: TorchWorker):
    """print() on rank 0, nothing elsewhere."""
    if worker.is_root:
        return lambda msg: print(f"[hvdscale torchddp] {msg}", flush=True)
    return lambda msg: None


def check_backend(run_, backend: str | None) -> None:
    """The run is a torch-ddp run, and of ``backend`` when one was given."""
    if getattr(run_, "framework", None) != FRAMEWORK:
        raise UserError(
            f"run {run_.run_id} is a run of framework {getattr(run_, 'framework', '?')}, not "
            f"{FRAMEWORK}: torch-ddp run ids read {{partition}}_{FRAMEWORK}_{{backend}}_... "
            "(config key scaling.sweeps[].frameworks)"
        )
    if backend is not None and run_.backend != backend:
        raise UserError(
            f"run {run_.run_id} is labelled backend {run_.backend!r} but this rank was "
            f"started with --backend {backend}; torch-ddp runs with gloo (CPU) or nccl (GPU)"
        )


def torch_label_facts(worker: TorchWorker) -> dict:
    """What torch.distributed itself reports (before the group is destroyed)."""
    d = worker.dist
    return {
        "framework": FRAMEWORK,
        "process_group_backend": str(d.get_backend()),
        "process_group_world_size": int(d.get_world_size()),
        "nccl_version": nccl_version() if d.get_backend() == "nccl" else None,
    }


def nccl_version() -> str | None:
    try:
        return ".".join(map(str, torch.cuda.nccl.version()))
    except (AttributeError, RuntimeError):
        return None


def label_proof(record: dict, facts: dict) -> dict:
    """``record.labelproof.prove`` (world size and hosts from the gathered host names, ranks per
    host, devices) plus torch.distributed's own backend and world size, checked against
    the label."""
    proof = prove(record, None)
    proof.update(facts)
    cfg = record["config"]
    if facts["process_group_backend"] != cfg["backend"]:
        proof["problems"].append(
            f"torch.distributed backend {facts['process_group_backend']}, "
            f"label says {cfg['backend']}"
        )
    if facts["process_group_world_size"] != cfg["workers"]:
        proof["problems"].append(
            f"torch.distributed world size {facts['process_group_world_size']}, "
            f"label says {cfg['workers']} workers"
        )
    proof["ok"] = not proof["problems"]
    return proof


def describe_environment(worker: TorchWorker, chash: str, first_attempt: dict):
    """Every rank's host and device (``GPU:i (name)`` or ``CPU:0``, as the Horovod trainer
    names them); rank 0 gets the environment and system blocks."""
    device = device_label(worker.device or torch.device("cpu"))
    gathered = worker.allgather_object((worker.hostname, device), name="hosts")
    if not worker.is_root:
        return None, None
    environment = environment_block(
        config_hash=chash,
        hostnames=[h for h, _ in gathered],
        devices=[d for _, d in gathered],
        tensorflow="none",
        horovod="none",
        started_utc=first_attempt["started_utc"],
    )
    environment["torch"] = torch.__version__
    environment["torch_cuda"] = torch.version.cuda  # None on a CPU build
    return environment, system_block([h for h, _ in gathered])


def leave_group() -> None:
    """Leave the process group a rank still holds (a rank that stops with an error):
    exiting with it alive aborts the process (SIGABRT, "terminate called without an
    active exception"), which hides the rank's own exit status from torchrun."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return run(args)
    except UserError as exc:
        print(f"hvdscale torchddp: error: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        leave_group()
