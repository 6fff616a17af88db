"""Shared helpers of the benchmarks: machine load, provenance columns and the CSV files
under ``benchmarks/results/`` that docs/performance.md is generated from
(scripts/gen_perf_docs.py).

Every row a benchmark writes carries the same provenance columns:

  commit       git commit of the tree when the benchmark started (``+dirty`` when tracked
               files had local changes)
  machine      host, CPU model and core count (``os.cpu_count()``)
  date         UTC time the CSV was written (ISO 8601)
  load         the highest 1-minute load average seen around the measurement
  load_before  1-minute load average just before the measurement
  load_after   1-minute load average just after it

``load`` above ``LOAD_WARN`` (1.0) is printed as a warning when it is measured: the
figures of a busy machine are noisier and usually lower. The results are committed on
purpose (they are data, not build output): regenerate the page with ``make perf-docs``.
"""

from __future__ import annotations

import csv
import os
import platform
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LOAD_WARN = 1.0
PROVENANCE = ["commit", "machine", "date", "load", "load_before", "load_after"]


def load_avg() -> float:
    """The 1-minute load average (0.0 where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return 0.0


def warn_load(value: float, what: str) -> None:
    if value > LOAD_WARN:
        print(
            f"WARNING: load average {value:.2f} > {LOAD_WARN} around {what}: noisy figures",
            file=sys.stderr,
            flush=True,
        )


class Measured:
    """Records the load before and after a measurement and warns when either exceeds
    LOAD_WARN: ``with Measured("keras b75") as m: ...``, then ``m.fields()`` (or
    ``m = Measured(...).start()`` ... ``m.stop()``)."""

    def __init__(self, what: str):
        self.what = what
        self.before = self.after = 0.0

    def start(self) -> Measured:
        self.before = load_avg()
        return self

    def stop(self) -> None:
        self.after = load_avg()
        warn_load(max(self.before, self.after), f"{self.what} ({self.before} -> {self.after})")

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def fields(self) -> dict:
        return {
            "load": max(self.before, self.after),
            "load_before": self.before,
            "load_after": self.after,
        }


def wait_for_load(max_load: float, max_wait_s: float, poll_s: float = 5.0) -> float:
    """Wait up to ``max_wait_s`` for the 1-minute load to drop below ``max_load`` (a quieter
    moment on a shared machine); returns the load when it gives up or succeeds."""
    t_end = time.monotonic() + max_wait_s
    load = load_avg()
    while load >= max_load and time.monotonic() < t_end:
        time.sleep(poll_s)
        load = load_avg()
    return load


def git_commit() -> str:
    """Short commit of the working tree (12 hex digits), ``+dirty`` when tracked files
    differ: hvdscale.common.git_commit, shortened for the CSVs."""
    from hvdscale.common import git_commit as full_commit

    commit = full_commit(ROOT)
    return commit if commit == "unknown" else commit[:12] + commit[40:]


def machine() -> str:
    """``host: CPU model, N cores`` (model from /proc/cpuinfo where there is one)."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()}: {model}, {os.cpu_count()} cores"


COMMIT_AT_START = git_commit()  # the tree that runs (files may change while it runs)


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def write_csv(name: str, rows: Sequence[dict], out: Path | str | None = None) -> Path:
    """Write ``rows`` to benchmarks/results/NAME.csv (or ``out``) with the provenance
    columns first. A row may bring its own load fields (``Measured.fields()``); rows
    without them get the load at writing time. Returns the path."""
    path = Path(out) if out else RESULTS / f"{name}.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    common = {"commit": COMMIT_AT_START, "machine": machine(), "date": utc_now()}
    now = load_avg()
    full = []
    for r in rows:
        row = {**common, "load": now, "load_before": now, "load_after": now, **r}
        full.append(row)
    keys = list(PROVENANCE)
    for r in full:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as fh:
        wr = csv.DictWriter(fh, fieldnames=keys, lineterminator="\n")
        wr.writeheader()
        for r in full:
            wr.writerow({k: _fmt(r.get(k)) for k in keys})
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", flush=True)
    return path


def _fmt(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    return v


def median_ci(values: Iterable[float]) -> tuple[float, float | None, float | None]:
    """Median of ``values`` with the project's bootstrap 95 % interval (hvdscale.analysis.
    stats: scipy.stats.bootstrap, percentile; None, None with fewer than 3 values: too
    few to say anything about the spread)."""
    from hvdscale.analysis.stats import median_interval

    return median_interval(values, name="benchmark")
