"""Device utilisation sampled in a background thread (rank 0's node).

GPU nodes: NVML (``pynvml``) utilisation percent of the GPUs, averaged over the GPUs of
the node (the run uses all of them: one worker per GPU). Otherwise the node's CPU
utilisation in percent (``psutil.cpu_percent``; 100 = every core busy). A sample is
``[seconds since the sampler started, percent]``.
"""

from __future__ import annotations

import threading
import time


class UtilisationSampler:
    def __init__(self, interval_s: float = 0.5, prefer_gpu: bool = True):
        self.interval_s = float(interval_s)
        self.samples: list[list[float]] = []
        self.kind = "cpu"
        self._nvml = None
        self._handles = []
        if prefer_gpu:
            try:
                import pynvml

                pynvml.nvmlInit()
                n = pynvml.nvmlDeviceGetCount()
                if n > 0:
                    self._nvml = pynvml
                    self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
                    self.kind = "gpu"
            except Exception:  # no pynvml, no driver, no GPU: CPU utilisation
                self._nvml = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.perf_counter()
        self.offset_s = 0.0  # added to every timestamp (elapsed time of earlier attempts)

    def _read(self) -> float:
        if self._nvml is not None:
            vals = [self._nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self._handles]
            return float(sum(vals) / len(vals))
        import psutil

        return float(psutil.cpu_percent(interval=None))

    def _loop(self) -> None:
        self._read()  # psutil: the first call only starts the measurement interval
        while not self._stop.wait(self.interval_s):
            try:
                self.samples.append(
                    [
                        round(self.offset_s + time.perf_counter() - self._t0, 3),
                        round(self._read(), 2),
                    ]
                )
            except Exception:
                pass

    def start(self) -> UtilisationSampler:
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="utilisation", daemon=True)
        self._thread.start()
        return self

    def now(self) -> float:
        """Sampler time (same clock as the samples)."""
        return self.offset_s + time.perf_counter() - self._t0

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    def mean_between(self, t_start: float, t_end: float) -> float | None:
        vals = [v for t, v in list(self.samples) if t_start <= t <= t_end]
        return round(sum(vals) / len(vals), 2) if vals else None


class NullSampler:
    """What non-root ranks use: no thread, no samples."""

    kind = "cpu"
    interval_s = 0.0
    samples: list = []
    offset_s = 0.0

    def start(self):
        return self

    def stop(self):
        pass

    def now(self) -> float:
        return 0.0

    def mean_between(self, t_start, t_end):
        return None
