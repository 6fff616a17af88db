"""Training of one rank (train env): the epoch loop, data, checkpoints and metrics
shared by the frameworks; one subpackage per framework (horovod_tf, torch_ddp)."""
