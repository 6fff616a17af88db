"""One epoch's metrics and timings of a rank, and their reduction over all ranks in one
allreduce (a float64 vector in field order)."""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, fields

import numpy as np

from hvdscale.record.timing import EpochTimer
from hvdscale.trainer.worker import WorkerInfo


@dataclass
class EpochMetrics:
    """Per rank: the rank's own numbers. After ``allreduce``: ``val_sse`` and
    ``val_values`` are sums over the ranks, every other field is the mean over ranks."""

    train_loss: float  # mean loss of the epoch's steps
    val_sse: float  # sum of squared errors over the validation rows
    val_values: float  # number of validation values (rows x labels)
    time_data: float  # phase sums over the timed steps
    time_compute: float
    time_sync: float
    time_update: float
    dispatch: float  # launch overhead of the timed calls
    train_wall: float  # wall time of the step loop
    eval_wall: float  # wall time of the validation evaluation
    g_local_sq: float = 0.0  # sum over the timed multi-worker updates of |g_local|^2
    g_global_sq: float = 0.0  # ... of |g_allreduced|^2
    noise_updates: float = 0.0  # how many updates those sums cover
    elapsed: float = 0.0  # the rank's training time so far (headline), for the budget
    val_correct: float = 0.0  # a classifier's correct validation predictions

    SUMMED = ("val_sse", "val_values", "val_correct")

    @classmethod
    def size(cls) -> int:
        return len(fields(cls))

    def to_vector(self) -> np.ndarray:
        return np.asarray(astuple(self), dtype=np.float64)

    @classmethod
    def from_vector(cls, v) -> EpochMetrics:
        v = np.asarray(v, dtype=np.float64)
        if v.shape != (cls.size(),):
            raise ValueError(f"EpochMetrics: expected {cls.size()} values, got shape {v.shape}")
        return cls(*(float(x) for x in v))

    def allreduce(self, worker: WorkerInfo, name: str) -> EpochMetrics:
        """Sums of the SUMMED fields and means of the others over all ranks."""
        total = worker.allreduce(self.to_vector(), op="sum", name=name)  # HVD: one allreduce
        out = EpochMetrics.from_vector(total)
        for f in fields(self):
            if f.name not in self.SUMMED:
                setattr(out, f.name, getattr(out, f.name) / worker.size)
        return out

    @property
    def phases(self) -> list[float]:
        return [self.time_data, self.time_compute, self.time_sync, self.time_update]

    @property
    def val_loss(self) -> float:
        return self.val_sse / self.val_values if self.val_values > 0 else float("nan")

    @property
    def val_accuracy(self) -> float:
        """A classifier's validation accuracy (its val_values are the validation rows)."""
        return self.val_correct / self.val_values if self.val_values > 0 else float("nan")

    def finite(self) -> bool:
        return math.isfinite(self.train_loss) and math.isfinite(self.val_loss)

    def noise_fields(self) -> dict:
        """Per-epoch record fields of the gradient noise scale (means per update)."""
        n = int(round(self.noise_updates))
        if n == 0:
            return {"noise_steps": 0, "g_local_sq": None, "g_global_sq": None}
        a, b = self.g_local_sq / n, self.g_global_sq / n
        if not (math.isfinite(a) and math.isfinite(b)):  # a diverged epoch
            return {"noise_steps": 0, "g_local_sq": None, "g_global_sq": None}
        return {"noise_steps": n, "g_local_sq": a, "g_global_sq": b}

    def timer(self, steps: int, timed_steps: int, epoch_wall: float) -> EpochTimer:
        """The epoch's EpochTimer (its record fields go into the history)."""
        return EpochTimer(
            steps=steps,
            timed_steps=timed_steps,
            phase_sums=self.phases,
            dispatch_sum=self.dispatch,
            train_wall=self.train_wall,
            eval_wall=self.eval_wall,
            epoch_wall=epoch_wall,
        )
