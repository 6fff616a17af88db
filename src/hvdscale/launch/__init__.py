"""Starting a run's ranks (pure Python, no TensorFlow; imported by both environments).

- ``launchspec``: the launcher's argv and the ranks' environment (pure functions);
  torch-ddp runs start with torchrun (``python -m torch.distributed.run``) or srun
  (``hvdscale.slurm.rendezvous``).
- ``command``: the ``hvdscale launch`` command (runs a launch spec, records failures).

The job layout, the srun/Gloo rendezvous, the time limit and the site settings are
SLURM's (``hvdscale.slurm``).
"""
