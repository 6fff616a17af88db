"""The torch-ddp framework (issue 19): one rank of a PyTorch DistributedDataParallel run
on the CPU with Gloo, the counterpart of the Horovod-TF trainer ``hvdscale.trainer.horovod_tf`` for
the same run (same network, rows per rank, optimizer semantics, LR rules, seeds, loop,
checkpoints and run record). ``python -m hvdscale.trainer.torch_ddp`` (``main``); dist (the
process group and its book-keeping collectives), net (network, KerasAdam, LR), step (the
DDP steps and evaluation). Train env only: the modules import torch at module level,
except ``dist``.
"""
