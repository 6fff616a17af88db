"""GPU binding per task (issue 29, "run where users are"): which visible GPU a rank uses
(``trainer.placement.gpu_for_rank``, shared by the Horovod-TF and torch-ddp trainers) and the
record's name of it (``visible_gpu_id``, ``gpu_label``), under the srun options of each
partition gpu_bind (``JobSpec.gpu_bind_args``). Pure functions: no GPU, no TensorFlow, no
torch."""

from __future__ import annotations

import copy

import pytest

from hvdscale.config.load import load_config, validate_config
from hvdscale.errors import UserError
from hvdscale.project import PROJECT_ROOT
from hvdscale.record.labelproof import gpu_id, rank_gpu_ids
from hvdscale.slurm.jobspec import JobSpec
from hvdscale.trainer.placement import (
    GpuDemand,
    cuda_visible_devices,
    framework_sees,
    gpu_for_rank,
    gpu_label,
    visible_gpu_id,
)
from hvdscale.trainer.torch_ddp.device import CudaFacts, choose_device

A100 = "NVIDIA A100-SXM4-40GB"


# --------------------------------------------------------------------------- one GPU per task


@pytest.mark.parametrize("local_rank", [0, 1])
def test_one_bound_gpu_is_used_whatever_the_local_rank(local_rank):
    # srun --gpus-per-task=1 (or --gpu-bind=single:1): each task sees only its own GPU
    env = {"CUDA_VISIBLE_DEVICES": "3"}
    index = gpu_for_rank(local_rank, 2, 1, rank=4 + local_rank, visible="3")
    assert index == 0
    assert visible_gpu_id(index, env) == "3"
    assert gpu_label(index, A100, env) == f"GPU:3 (CUDA_VISIBLE_DEVICES=3; {A100})"


def test_one_bound_gpu_by_uuid_is_named_by_its_uuid():
    env = {"CUDA_VISIBLE_DEVICES": "GPU-8f3a2c1e"}
    assert gpu_for_rank(1, 2, 1, 1, env["CUDA_VISIBLE_DEVICES"]) == 0
    assert (
        gpu_label(0, A100, env) == f"GPU:GPU-8f3a2c1e (CUDA_VISIBLE_DEVICES=GPU-8f3a2c1e; {A100})"
    )


def test_torch_nccl_uses_the_one_bound_gpu():
    cuda = CudaFacts("2.11.0+cu128", True, 1, visible="2")
    assert choose_device("nccl", 0, "r", cuda, rank=0, local_size=2) == "cuda:0"
    assert choose_device("nccl", 1, "r", cuda, rank=1, local_size=2) == "cuda:0"


# --------------------------------------------------------------------------- several visible


def test_several_visible_gpus_one_per_local_rank():
    for lr in range(4):
        assert gpu_for_rank(lr, 4, 4, rank=8 + lr, visible=None) == lr
        assert gpu_for_rank(lr, 4, 4, rank=8 + lr, visible="4,5,6,7") == lr
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert visible_gpu_id(2, env) == "6"
    assert gpu_label(2, A100, env) == f"GPU:6 (CUDA_VISIBLE_DEVICES=4,5,6,7; {A100})"


def test_without_cuda_visible_devices_the_record_names_the_index():
    assert visible_gpu_id(1, {}) == "1"
    assert gpu_label(1, A100, {}) == f"GPU:1 ({A100})"  # as before issue 29


def test_torch_nccl_takes_the_gpu_of_its_local_rank_among_several():
    cuda = CudaFacts("2.11.0+cu128", True, 4, visible="0,1,2,3")
    assert [choose_device("nccl", lr, "r", cuda) for lr in range(4)] == [
        "cuda:0",
        "cuda:1",
        "cuda:2",
        "cuda:3",
    ]


# --------------------------------------------------------------------------- no GPU of its own


def test_more_local_ranks_than_gpus_names_the_rank_the_count_and_the_fix():
    with pytest.raises(UserError) as exc:
        gpu_for_rank(2, 4, 2, rank=6, visible="0,1")
    msg = str(exc.value)
    assert "rank 6 (local rank 2 of 4 on its node) sees 2 GPUs" in msg
    assert "CUDA_VISIBLE_DEVICES=0,1" in msg
    assert "one worker per GPU" in msg and "--gpus-per-task=1" in msg


def test_an_unbound_single_gpu_is_not_shared_by_two_local_ranks():
    # CUDA_VISIBLE_DEVICES unset (nothing bound the node's one GPU to this task), or naming
    # more ids than the rank sees: local rank 1 would share the GPU with local rank 0
    for visible in (None, "0,1"):
        with pytest.raises(
            UserError, match=r"rank 1 \(local rank 1 of 2 on its node\) sees 1 GPU "
        ):
            gpu_for_rank(1, 2, 1, rank=1, visible=visible)
    with pytest.raises(UserError, match="CUDA_VISIBLE_DEVICES unset"):
        gpu_for_rank(1, 2, 1, rank=1, visible=None)
    assert gpu_for_rank(0, 2, 1, rank=0, visible=None) == 0  # local rank 0 keeps it


def test_torch_nccl_error_names_the_run_and_the_rank():
    cuda = CudaFacts("2.11.0+cu128", True, 2, visible="0,1")
    with pytest.raises(UserError) as exc:
        choose_device("nccl", 3, "run-x", cuda, rank=7, local_size=4)
    msg = str(exc.value)
    assert msg.startswith("run run-x: backend nccl: rank 7 (local rank 3 of 4 on its node)")
    assert "sees 2 GPUs (CUDA_VISIBLE_DEVICES=0,1)" in msg


# --------------------------------------------------------------------------- no GPU


def test_no_visible_gpu_is_the_cpu():
    assert gpu_for_rank(0, 1, 0, rank=0) is None
    assert gpu_for_rank(3, 4, 0, rank=3, visible="") is None  # CUDA_VISIBLE_DEVICES=""
    assert choose_device("gloo", 1, "r", CudaFacts("2.13.0+cpu", False, 0)) == "cpu"


def test_a_bound_gpu_the_framework_cannot_use_is_the_cpu_and_the_record_keeps_the_id():
    # the emulated partition (or a CPU build): SLURM bound GPU 1 to the task, the framework
    # lists no GPU; the rank trains on the CPU and its record still shows the bound id
    env = {"CUDA_VISIBLE_DEVICES": "1"}
    assert gpu_for_rank(1, 2, 0, rank=1, visible=env["CUDA_VISIBLE_DEVICES"]) is None
    assert choose_device("gloo", 1, "r", CudaFacts("2.13.0+cpu", False, 0, visible="1")) == "cpu"
    assert cuda_visible_devices(env) == "1" and cuda_visible_devices({}) is None
    assert rank_gpu_ids(["CPU (1 thread)"], [cuda_visible_devices(env)]) == ["1"]


# --------------------------------------------------------------------------- per gpu_bind


@pytest.mark.parametrize(
    "bind, srun_args, visible_by_local_rank, indices, gpu_ids",
    [
        # CUDA_VISIBLE_DEVICES as SLURM set it under these srun options on the emulated
        # partition (DEVELOPERS.md): one id per task when bound, the node's GPUs when not
        ("per-task", ["--gpus-per-task=1"], ["0", "1"], [0, 0], ["0", "1"]),
        ("single", ["--gpu-bind=single:1"], ["0", "1"], [0, 0], ["0", "1"]),
        ("none", [], ["0,1", "0,1"], [0, 1], ["0", "1"]),
    ],
)
def test_each_gpu_bind_gives_every_local_rank_its_own_gpu(
    alpha_config, bind, srun_args, visible_by_local_rank, indices, gpu_ids
):
    """The partition's gpu_bind end to end: the srun options its JobSpec gives the ranks,
    then the device choice under what SLURM makes visible with them: a bound rank uses its
    one visible GPU (index 0), an unbound one the GPU of its local rank; either way the GPU
    each rank computes on is the id its device label names, and the record's label proof
    reads the same ids."""
    cfg = copy.deepcopy(alpha_config)
    cfg["scaling"]["partitions"]["alpha"]["gpu_bind"] = bind
    job = JobSpec.for_workers(validate_config(cfg), "alpha", "mpi", 2)
    assert (job.gpu_bind, job.gpu_bind_args) == (bind, srun_args)
    labels, chosen = [], []
    for lr, visible in enumerate(visible_by_local_rank):
        env = {"CUDA_VISIBLE_DEVICES": visible}
        n_visible = len(visible.split(","))
        index = gpu_for_rank(lr, 2, n_visible, rank=lr, visible=visible)
        chosen.append(index)
        labels.append(gpu_label(index, A100, env))
    assert chosen == indices
    assert [gpu_id(label) for label in labels] == gpu_ids
    assert rank_gpu_ids(labels, visible_by_local_rank) == gpu_ids


@pytest.fixture(scope="module")
def alpha_config() -> dict:
    """The thesis config (its GPU partition alpha), validated."""
    return load_config(PROJECT_ROOT / "config" / "thesis.yaml")


# --------------------------------------------------------------------------- GPU label, GPU

ALPHA = GpuDemand("alpha", 8, emulated=False, run_id="alpha_mpi_n1_w2_b75_lrnone_r0")
CPU_TF = framework_sees("TensorFlow 2.15.1", 0, False, "tf.test.is_built_with_cuda() is False", "1")


def test_a_cpu_rank_of_a_gpu_partition_stops_naming_rank_host_what_it_sees_and_the_fix():
    with pytest.raises(UserError) as exc:
        ALPHA.check(False, rank=1, host="node1", sees=CPU_TF)
    msg = str(exc.value)
    assert msg.startswith(
        "run alpha_mpi_n1_w2_b75_lrnone_r0: rank 1 on host node1 would train on the CPU, "
        "but partition 'alpha' has 8 GPUs per node; stopped before the first step."
    )
    assert (
        "The framework sees: TensorFlow 2.15.1 lists no GPU: a CPU-only build "
        "(tf.test.is_built_with_cuda() is False); CUDA_VISIBLE_DEVICES='1'." in msg
    )
    assert "make setup-gpu" in msg and "HVD_GPU=1 scripts/setup.sh" in msg
    assert "CUDA module" in msg and "scaling.partitions.alpha.gpus_per_node" in msg


def test_a_gpu_rank_a_cpu_partition_and_emulated_gpus_pass():
    ALPHA.check(True, rank=0, host="n", sees="")  # on its GPU
    GpuDemand("local", 0).check(False, rank=0, host="n", sees="")  # a CPU partition
    emulated = GpuDemand("alpha", 8, emulated=True)
    emulated.check(False, rank=0, host="n", sees="")  # the test cluster's emulated GPUs
    assert emulated.gpu_partition and not emulated.needs_gpu and ALPHA.needs_gpu


def test_the_demand_comes_from_the_runs_partition():
    cfg = {"scaling": {"partitions": {"alpha": {"gpus_per_node": 8}, "local": {}}}}

    class Run:
        partition, run_id = "alpha", "alpha_gloo_n1_w1_b75_lrnone_r0"

    assert GpuDemand.of(cfg, Run) == GpuDemand("alpha", 8, False, Run.run_id)
    cfg["scaling"]["partitions"]["alpha"]["emulated_gpus"] = True
    assert GpuDemand.of(cfg, Run).emulated is True
    Run.partition = "local"
    assert not GpuDemand.of(cfg, Run).gpu_partition


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_torch_without_a_gpu_on_a_gpu_partition_stops_whatever_the_backend(backend):
    cpu_build = CudaFacts("2.13.0+cpu", False, 0, visible="0", cuda_build=None)
    with pytest.raises(UserError) as exc:
        choose_device(backend, 0, "r", cpu_build, rank=3, demand=ALPHA, host="node2")
    msg = str(exc.value)
    assert "rank 3 on host node2 would train on the CPU" in msg
    assert (
        "torch 2.13.0+cpu lists no GPU: a CPU-only build (torch.version.cuda is None); "
        "CUDA_VISIBLE_DEVICES='0'" in msg
    )
    # a CUDA build that finds no GPU (no driver, no GPU allocated) says so
    no_gpu = CudaFacts("2.13.0+cu121", False, 0, visible=None, cuda_build="12.1")
    with pytest.raises(UserError, match="a CUDA build that finds no usable GPU.*unset"):
        choose_device(backend, 0, "r", no_gpu, rank=0, demand=ALPHA, host="node2")


def test_torch_gloo_computes_on_the_gpu_of_a_gpu_partition_and_on_the_cpu_elsewhere():
    cuda = CudaFacts("2.13.0+cu121", True, 2, visible="0,1", cuda_build="12.1")
    assert choose_device("gloo", 1, "r", cuda, demand=ALPHA) == "cuda:1"
    assert choose_device("gloo", 1, "r", cuda, demand=GpuDemand("local", 0)) == "cpu"
    assert choose_device("gloo", 1, "r", cuda) == "cpu"  # no partition given: as before
    # emulated GPUs: torch finds none, gloo trains on the CPU; nccl cannot
    emulated = GpuDemand("alpha", 8, emulated=True)
    cpu_build = CudaFacts("2.13.0+cpu", False, 0, visible="1")
    assert choose_device("gloo", 1, "r", cpu_build, demand=emulated) == "cpu"
    with pytest.raises(UserError, match="backend nccl needs a CUDA build of torch"):
        choose_device("nccl", 1, "r", cpu_build, demand=emulated)
