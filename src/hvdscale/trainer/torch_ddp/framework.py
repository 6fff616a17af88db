"""The torch-ddp framework: what ``trainer.rank.train_rank`` runs for a PyTorch
DistributedDataParallel run (``FRAMEWORK``, named in ``matrix.backends.TRAINERS``; issue
19). The run, its rows, seeds, loop, checkpoints and record are the Horovod trainer's.

A rank binds its CPUs from torchrun's LOCAL_RANK / LOCAL_WORLD_SIZE, takes
``threads_per_worker`` torch threads (``slurm.threads``: auto is SLURM_CPUS_PER_TASK),
picks its device (``device.choose_device``: ``cuda:LOCAL_RANK`` with nccl and on any
partition with GPUs, the CPU with gloo elsewhere; a rank of a GPU partition without a GPU
stops there) and joins the process group (``dist.TorchWorker``) (``start``); the network,
KerasAdam and the LR of every update come from ``net``, the DDP steps from ``step``. The
record says ``config.framework`` = ``torch-ddp``, has no Horovod timeline, and its label
proof adds what torch.distributed reports (backend, world size) to the hosts. The module
imports torch (train env only).
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

import torch
import torch.distributed

from hvdscale.record.labelproof import prove
from hvdscale.slurm.threads import threads_for_rank
from hvdscale.trainer.placement import GpuDemand, bind_cpus
from hvdscale.trainer.rank import Started
from hvdscale.trainer.torch_ddp.device import CudaFacts, choose_device, device_label
from hvdscale.trainer.torch_ddp.dist import TorchWorker, detect_torch_launcher, torch_rank_env
from hvdscale.trainer.torch_ddp.net import TorchOptimisation
from hvdscale.trainer.torch_ddp.precision_compile import (
    check_precision,
    compile_mode,
    use_compile_cache,
)
from hvdscale.trainer.torch_ddp.step import TorchStepProgram

NAME = "torch-ddp"


class TorchDDP:
    """PyTorch DDP over gloo (CPU, or GPU on a GPU partition) or nccl (GPU), started by
    torchrun or srun."""

    name = NAME
    log_name = "hvdscale torchddp"
    record_config = {
        "timeline_steps": 0,  # a Horovod timeline: torch-ddp records none
        "data_in_device_memory": True,  # torch-ddp: always on the rank's device
    }
    # torchrun's SIGTERM (another rank failed) ends this rank at once, even inside a
    # blocked gloo collective (the default action; a Python handler would wait for it)
    on_term = signal.SIG_DFL

    def rank_env(self) -> dict:
        return torch_rank_env()

    def start(self, args, run_, tcfg: dict, demand: GpuDemand | None = None) -> Started:
        r = torch_rank_env()
        bound = bind_cpus(tcfg.get("cpu_binding", "auto"), r["local_rank"], r["local_size"])
        torch.set_num_threads(threads_for_rank(tcfg["threads_per_worker"], os.environ))
        device = torch.device(
            choose_device(
                run_.backend,
                r["local_rank"],
                run_.run_id,
                CudaFacts.probe(),
                rank=r["rank"],
                local_size=r["local_size"],
                demand=demand,
                host=socket.gethostname(),
            )
        )
        check_precision(tcfg["precision"], device, run_.run_id)  # before the group
        cache = (
            use_compile_cache(getattr(args, "out_dir", None)) if tcfg["compile"] != "off" else None
        )
        worker = TorchWorker.init(run_.backend, device)  # nccl: set_device, then the group
        summary = (
            f"{worker.size} rank(s), torch {torch.__version__} DDP over {worker.backend} on "
            f"{device_label(device)}, {torch.get_num_threads()} thread(s), precision "
            f"{tcfg['precision']}, compile {tcfg['compile']}"
            + (f" (mode {compile_mode(tcfg['compile'], device)}, cache {cache})" if cache else "")
        )
        # the device as the Horovod trainer names it: GPU:i (name) or CPU:0
        return Started(worker, device, device_label(device), bound, summary)

    def optimisation(self, cfg: dict, run_, worker, steps: int, device) -> TorchOptimisation:
        return TorchOptimisation.build(
            cfg, run_.lr_rule, worker.size, steps, run_.seed, device=device
        )

    def step_program(self, optim, worker, tcfg, device, *, train, test, val, batch):
        return TorchStepProgram(optim, worker, tcfg, train=train, test=test, val=val, batch=batch)

    def timeline_window(self, worker, tcfg: dict, out_dir: Path, start_epoch: int):
        return None

    def versions(self) -> dict:
        # torch_cuda: None on a CPU build
        return {"torch": torch.__version__, "torch_cuda": torch.version.cuda}

    def label_facts(self, worker: TorchWorker) -> dict:
        """What torch.distributed itself reports (before the group is destroyed)."""
        d = worker.dist
        return {
            "framework": NAME,
            "process_group_backend": str(d.get_backend()),
            "process_group_world_size": int(d.get_world_size()),
            "nccl_version": nccl_version() if d.get_backend() == "nccl" else None,
        }

    def shutdown(self, worker: TorchWorker, program: TorchStepProgram) -> None:
        program.close()  # DDP's reducer before the group it uses (else: abort at exit)
        worker.shutdown()

    def launcher(self) -> str:
        return detect_torch_launcher()

    def timeline_file(self) -> Path | None:
        return None

    def label_proof(self, record: dict, facts: dict, out_dir: Path) -> dict:
        return label_proof(record, facts)

    def leave(self) -> None:
        leave_group()


FRAMEWORK = TorchDDP()


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


def leave_group() -> None:
    """Leave the process group a rank still holds (a rank that stops with an error):
    exiting with it alive aborts the process (SIGABRT, "terminate called without an
    active exception"), which hides the rank's own exit status from torchrun."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
