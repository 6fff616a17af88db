"""The torch-ddp framework (issue 19): one rank of a PyTorch DistributedDataParallel run
(gloo on the CPU, nccl on GPUs), the counterpart of the Horovod-TF trainer
``hvdscale.trainer.horovod_tf`` for the same run (same network, rows per rank, optimizer
semantics, LR rules, seeds, loop, checkpoints and run record).

``hvdscale train`` with a torch-ddp run id runs it (started by torchrun or srun, or
directly as a one-rank job). Modules: framework (what ``trainer.rank.train_rank`` runs:
the start of a rank, the label facts, the shutdown), dist (the process group and its
book-keeping collectives), device (the rank's device), net (network, KerasAdam, LR), step
(the DDP steps and evaluation). Train env only: the modules import torch at module level,
except ``dist`` and ``device``.
"""
