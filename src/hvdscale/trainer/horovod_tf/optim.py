"""The network, its optimizer and the learning-rate schedule of a Horovod-TF run: the
Keras model, Adam, and the warm-up ramp (``trainer.schedule``) as a Keras schedule."""

from __future__ import annotations

from dataclasses import dataclass

from hvdscale.matrix.runtable import learning_rate_for
from hvdscale.trainer.horovod_tf.model import build_model
from hvdscale.trainer.model import check_parameter_count
from hvdscale.trainer.schedule import warmup_updates
from hvdscale.workload.base import workload_for


class WarmupSchedule:
    """Linear ramp from the base to the scaled learning rate over ``warmup_updates``
    optimizer updates (Goyal et al.), then constant: ``trainer.schedule.warmup_lr`` in
    TensorFlow. Built lazily (needs TensorFlow)."""

    @staticmethod
    def make(base: float, target: float, warmup_updates: int):
        import tensorflow as tf

        class _Warmup(tf.keras.optimizers.schedules.LearningRateSchedule):
            def __init__(self):
                self.base, self.target, self.n = (
                    float(base),
                    float(target),
                    max(1, int(warmup_updates)),
                )

            def __call__(self, step):
                frac = tf.minimum(tf.cast(step, tf.float32) / float(self.n), 1.0)
                return self.base + (self.target - self.base) * frac

            def get_config(self):
                return {"base": self.base, "target": self.target, "warmup_updates": self.n}

        return _Warmup()


@dataclass
class Optimisation:
    model: object
    optimizer: object
    schedule: object  # a float or a LearningRateSchedule
    lr_base: float  # training.learning_rate
    lr: float  # after the run's LR rule
    n_params: int
    loss: str = "mse"  # the workload's loss (hvdscale.workload)

    @classmethod
    def build(
        cls, cfg: dict, lr_rule: str, workers: int, steps: int, seed: int | None = None
    ) -> Optimisation:
        """Model seeded with ``seed`` (the run's derived seed; the config's seed when None),
        Adam with the rule's learning rate (and warm-up ramp), built so that its variables
        exist before they are broadcast or restored."""
        import tensorflow as tf

        tcfg = cfg["training"]
        tf.keras.utils.set_random_seed(cfg["seed"] if seed is None else int(seed))
        model = build_model(cfg)
        n_params = check_parameter_count(cfg)
        lr_base = tcfg["learning_rate"]
        lr = learning_rate_for(lr_base, lr_rule, workers)
        ramp = warmup_updates(tcfg, lr_base, lr, steps)
        schedule = WarmupSchedule.make(lr_base, lr, ramp) if ramp else lr
        opt = tf.keras.optimizers.Adam(learning_rate=schedule)
        opt.build(model.trainable_variables)
        return cls(model, opt, schedule, lr_base, lr, n_params, workload_for(cfg).loss)

    def weights_sha256(self) -> str:
        """sha256 of the model's weights (float32 bytes in variable order): the same
        initial weights give the same digest on any worker count."""
        import hashlib

        import numpy as np

        h = hashlib.sha256()
        for w in self.model.get_weights():
            h.update(np.ascontiguousarray(w, dtype=np.float32).tobytes())
        return h.hexdigest()

    def checkpoint(self):
        import tensorflow as tf

        return tf.train.Checkpoint(model=self.model, optimizer=self.optimizer)

    def broadcast(self, worker) -> None:
        """Rank 0's weights and optimizer state on every rank (fresh start or resumed)."""
        hvd = worker.hvd
        if hvd is not None and worker.size > 1:
            hvd.broadcast_variables(self.model.variables, root_rank=0)  # HVD: same weights
            hvd.broadcast_variables(self.optimizer.variables, root_rank=0)  # HVD: same state

    def current_lr(self) -> float:
        import tensorflow as tf

        s = self.schedule
        return float(tf.keras.backend.get_value(s(self.optimizer.iterations) if callable(s) else s))
