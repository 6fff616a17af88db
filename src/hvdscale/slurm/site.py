"""Settings that thesis-like GPU clusters need, from the config (issue 12).

- ``training.nccl`` -> NCCL_SOCKET_IFNAME / NCCL_IB_HCA / NCCL_DEBUG, passed to the ranks
  by every launcher (in the launch environment: mpirun -x, srun's exported environment,
  horovodrun's) and recorded in the run record (``config.nccl_env``).
- ``training.srun_mpi`` -> ``srun --mpi=<type>`` for MPI runs (pmix, pmi2, ...).
- ``scaling.partitions.<p>.cluster`` -> the SLURM plugin's ``slurm_cluster`` resource
  (``sbatch --clusters``), for sites whose partitions live in separate SLURM clusters.

One GPU per rank: the job asks for ``--gres=gpu:<ranks on the node>`` per node; the
partition's ``gpu_bind`` (``hvdscale.slurm.jobspec.GPU_BIND_SRUN``) decides the ranks'
srun options: ``per-task`` (default) ``--gpus-per-task=1`` gives each rank its own
CUDA_VISIBLE_DEVICES (one id, which it uses), ``single`` ``--gpu-bind=single:1`` the
same by binding, ``none`` lets every rank see the node's GPUs and training pins the GPU
of its local rank (``tf.config.set_visible_devices``, Horovod's TF2 recipe). The
emulated partition of the local cluster shows that SLURM binds them so
(tests/test_slurm_multinode.py).
"""

from __future__ import annotations

import os

NCCL_KEYS = {"socket_ifname": "NCCL_SOCKET_IFNAME", "ib_hca": "NCCL_IB_HCA", "debug": "NCCL_DEBUG"}


def nccl_env(training: dict) -> dict[str, str]:
    """NCCL_* variables for the ranks from ``training.nccl`` (unset keys: not set)."""
    nccl = training.get("nccl") or {}
    return {var: str(nccl[key]) for key, var in NCCL_KEYS.items() if nccl.get(key) is not None}


def nccl_env_now(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The NCCL_* variables this rank runs with (for the run record)."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in sorted(environ.items()) if k.startswith("NCCL_")}


def srun_mpi(training: dict) -> str:
    """``srun --mpi=`` value for MPI runs (``training.srun_mpi``, default pmix)."""
    return f"--mpi={training.get('srun_mpi') or 'pmix'}"


def slurm_cluster(partition: dict) -> str | None:
    """The plugin's ``slurm_cluster`` resource (sbatch --clusters) or None."""
    return partition.get("cluster") or None
