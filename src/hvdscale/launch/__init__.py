"""Starting a run's ranks (pure Python, no TensorFlow; imported by both environments).

- ``jobspec``: the job layout of a run (nodes, tasks, CPUs, gres, memory, runtime);
  the rules' SLURM resources and the launcher's arguments both come from it.
- ``launchspec``: the launcher's argv and the ranks' environment (pure functions);
  torch-ddp runs start with torchrun (``python -m torch.distributed.run``) or srun.
- ``gloo_slurm``: Gloo across SLURM nodes without ssh (host list, slot plan, rendezvous,
  ``python -m hvdscale.launch.gloo_slurm exec|serve`` in the ranks), and torch-ddp ranks
  under srun (``exec --framework torch-ddp``, torch.distributed's own rendezvous); the
  rank of a 1-worker run in the launcher's own job step, without srun (``build_in_step``).
- ``timelimit``: SIGUSR1 before the SLURM time limit, in the launcher and in the ranks.
- ``site_settings``: NCCL variables, ``srun --mpi`` and SLURM clusters from the config.
- ``command``: the ``hvdscale launch`` command (runs a launch spec, records failures).

Levels, low to high: site_settings, timelimit -> jobspec -> gloo_slurm -> launchspec ->
command. This file imports nothing, so ``hvdscale.matrix.jobspec`` stays cheap.
"""
