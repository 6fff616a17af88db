"""The learning-rate warm-up of a run, in plain Python: how many optimizer updates the
ramp lasts and the rate of each update. Framework-free: the Horovod-TF trainer builds its
Keras schedule from them (``trainer.horovod_tf.optim.WarmupSchedule``, the same formula
in TensorFlow) and the torch-ddp trainer sets the rate before every update
(``trainer.torch_ddp.net.TorchOptimisation``). The rate the ramp ends at is the run's LR
rule (``matrix.runtable.learning_rate_for``)."""

from __future__ import annotations


def warmup_updates(tcfg: dict, lr_base: float, lr: float, steps: int) -> int:
    """Optimizer updates of the warm-up ramp from ``lr_base`` to ``lr`` (0: no ramp): the
    training section's ``warmup_epochs`` times the updates per epoch (``steps`` //
    backward_passes_per_step), when ``lr_warmup`` is on and the LR rule changed the rate."""
    if tcfg["lr_warmup"] and tcfg["warmup_epochs"] > 0 and lr != lr_base:
        return tcfg["warmup_epochs"] * (steps // tcfg["horovod"]["backward_passes_per_step"])
    return 0


def warmup_lr(base: float, target: float, warmup_updates: int, update: int) -> float:
    """The learning rate of optimizer update ``update`` (0 = the first): a linear ramp
    from ``base`` to ``target`` over ``warmup_updates`` updates, then ``target``; the
    formula of ``trainer.horovod_tf.optim.WarmupSchedule`` in plain Python."""
    n = max(1, int(warmup_updates))
    return float(base) + (float(target) - float(base)) * min(float(update) / n, 1.0)
