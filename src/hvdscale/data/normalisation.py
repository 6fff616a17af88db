"""Streaming per-column mean and standard deviation: the normalisation statistics of the
split (manifest.json)."""

from __future__ import annotations

import numpy as np


class RunningStats:
    """Per-column count, mean and sum of squared deviations (Chan et al.), in float64."""

    def __init__(self, k: int):
        self.n = 0
        self.mean = np.zeros(k)
        self.m2 = np.zeros(k)

    def add(self, x: np.ndarray) -> None:
        """Add rows: ``x`` has shape (m, k) or (m, p, k); statistics per last-axis column."""
        k = x.shape[-1]
        x = x.reshape(-1, k)
        m = x.shape[0]
        if m == 0:
            return
        part = RunningStats(k)
        part.n = m
        for c in range(k):
            col = x[:, c].astype(np.float64)
            part.mean[c] = col.sum() / m
            col -= part.mean[c]
            part.m2[c] = float(np.square(col, out=col).sum())
        self.merge(part)

    def merge(self, other: RunningStats) -> None:
        if other.n == 0:
            return
        n = self.n + other.n
        delta = other.mean - self.mean
        self.mean = self.mean + delta * (other.n / n)
        self.m2 = self.m2 + other.m2 + delta * delta * (self.n * other.n / n)
        self.n = n

    def result(self) -> tuple[list[float], list[float]]:
        std = np.sqrt(self.m2 / self.n) if self.n else np.zeros_like(self.m2)
        return [float(v) for v in self.mean], [float(v) for v in std]
