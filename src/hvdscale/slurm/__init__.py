"""Everything SLURM, in one place (pure Python; both environments import it).

- ``jobspec``: the job layout of a run (nodes, tasks, CPUs, gres, memory, runtime);
  the rules' SLURM resources and the launcher's arguments both come from it.
- ``site``: NCCL variables, ``srun --mpi`` and SLURM clusters from the config.
- ``partitions``: the study's partitions against those ``sinfo`` lists.
- ``clusters``: several SLURM instances, one study (``only_cluster``).
- ``deployment``: how the train env reaches the ranks, against ``--sdm`` and the loaded
  modules.
- ``gpu_support``: what a GPU partition's ranks need (CUDA, compute capability).
- ``threads``: threads per rank (``auto``: SLURM_CPUS_PER_TASK).
- ``rendezvous``: Gloo across SLURM nodes without ssh (host list, slot plan, rendezvous,
  ``python -m hvdscale.slurm.rendezvous exec|serve`` in the ranks), and torch-ddp ranks
  under srun (``exec --framework torch-ddp``, torch.distributed's own rendezvous); the
  rank of a 1-worker run in the launcher's own job step, without srun (``build_in_step``).
- ``timelimit``: SIGUSR1 before the SLURM time limit, in the launcher and in the ranks.

This file imports nothing, so ``hvdscale.slurm.jobspec`` stays cheap.
"""
