"""What the framework-free parts of a rank ask of a framework: the host interface of its
step program (``Steps``: the epoch loop, ``trainer.loop``, drives it) and of its network
and optimizer (``Optimiser``: ``trainer.rank.train_rank``, the loop and the checkpoints
use it). Each framework implements both: ``trainer.horovod_tf.step.StepProgram`` and
``trainer.horovod_tf.optim.Optimisation``, ``trainer.torch_ddp.step.TorchStepProgram``
and ``trainer.torch_ddp.net.TorchOptimisation``.

The interfaces are ``typing.Protocol`` classes: nothing inherits from them, they name
what the loop calls."""

from __future__ import annotations

from typing import Protocol

import numpy as np

#: rows per forward pass when a rank evaluates its validation or test rows (both
#: frameworks: the same sums of squared errors, batch by batch)
EVAL_BATCH = 4096


class Steps(Protocol):
    """One rank's compiled (or eager) training steps and evaluation, seen from the host."""

    #: the rank's training rows
    n_local: int

    def warm_up(self, spe: int) -> None:
        """Trace or compile what needs it (no state change); ``spe``: steps per call."""

    def start_epoch(self, perm: np.ndarray) -> None:
        """Reset the epoch's sums; ``perm``: the order of the rank's rows this epoch."""

    def run_steps(self, start: int, n: int, timed: bool) -> float:
        """Run steps start..start+n-1 of the epoch (``timed``: with the phase clocks);
        returns the host-side data time of the call (0 where the data phase is timed on
        the device)."""

    def epoch_results(self) -> tuple[float, np.ndarray]:
        """The epoch's loss sum and the timed steps' phase sums (data, compute, sync,
        update, and the noise-scale sums, which belong to no phase)."""

    def grad_sq(self) -> tuple[float, float, int]:
        """The epoch's sums of |g_local|^2 and |g_allreduced|^2 and the updates they cover."""

    def val_sse(self) -> tuple[float, int]:
        """Sum of squared errors over the rank's validation rows, and the number of values."""

    def test_sse(self) -> tuple[float, int]:
        """Sum of squared errors over the rank's test rows, and the number of values."""


class Optimiser(Protocol):
    """The network and its optimizer, with the run's learning rate."""

    lr_base: float  # training.learning_rate
    lr: float  # after the run's LR rule
    n_params: int  # trainable parameters

    def current_lr(self) -> float:
        """The learning rate of the next update (the warm-up ramp included)."""

    def weights_sha256(self) -> str:
        """sha256 of the float32 weights in Keras' variable order and layout."""

    def checkpoint(self):
        """An object with ``write(prefix)`` and ``read(prefix)`` (``tf.train.Checkpoint``'s)
        for ``trainer.checkpoint.Checkpointer``."""

    def broadcast(self, worker) -> None:
        """Rank 0's weights and optimizer state on every rank."""
