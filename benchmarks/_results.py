"""Shared helpers of the benchmarks: ``Measured`` (one arm behind the quiet guard, with its
load and foreign-CPU fields), the machine's load, and ``write_csv``, which writes a
benchmark's rows under ``benchmarks/results/`` with the provenance and quality columns
that benchmarks/README.md ("Results are committed") lists; docs/performance.md is
generated from those CSVs (benchmarks/perfdocs.py).
"""

from __future__ import annotations

import csv
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from _quiet import CpuMeter, NotQuiet, QuietGuard, add_quiet_args, load_avg, validity

__all__ = ["NotQuiet", "add_quiet_args"]  # re-exported for the benchmarks

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
LOAD_WARN = 1.0
PROVENANCE = ["commit", "machine", "date", "load", "load_before", "load_after"]
QUALITY = ["busy_before", "foreign_cpu", "irq_cpu", "valid", "invalid_reason", "quiet_wait_s"]


def warn_load(value: float, what: str) -> None:
    if value > LOAD_WARN:
        print(
            f"WARNING: load average {value:.2f} > {LOAD_WARN} around {what}: noisy figures",
            file=sys.stderr,
            flush=True,
        )


GUARD = QuietGuard()  # configure_quiet(args) sets its threshold and timeout


def configure_quiet(args) -> QuietGuard:
    """Apply a benchmark's ``--max-load`` / ``--quiet-timeout`` (add_quiet_args) to the
    shared guard (None: keep the environment's or the default)."""
    if getattr(args, "max_load", None) is not None:
        GUARD.max_load = args.max_load
    if getattr(args, "quiet_timeout", None) is not None:
        GUARD.timeout_s = args.quiet_timeout
    return GUARD


def quiet_main(fn):
    """Decorator of a benchmark's ``main``: a machine that stays busy (NotQuiet) ends it
    with exit status 3 and the guard's message instead of a traceback."""

    def main(argv=None) -> int:
        try:
            return fn(argv)
        except NotQuiet as exc:
            print(f"{Path(sys.argv[0]).name} stopped: {exc}", file=sys.stderr, flush=True)
            return 3

    main.__doc__, main.__name__ = fn.__doc__, fn.__name__
    return main


class Measured:
    """One arm's measurement: ``start()`` waits for a quiet machine (GUARD; NotQuiet when
    it stays busy), records the load before and starts the foreign-CPU meter; ``stop()``
    records the load after and the foreign CPU share, and warns. ``with Measured("keras
    b75") as m: ...``, then ``m.fields()`` for the CSV row. ``names``: processes outside
    this tree that belong to the arm (bench_costmodel: the SLURM daemons)."""

    def __init__(
        self,
        what: str,
        guard: QuietGuard | None = None,
        meter: CpuMeter | None = None,
        names: tuple[str, ...] = (),
    ):
        self.what = what
        self.guard = guard
        self.meter = meter if meter is not None else CpuMeter(names=names)
        self.before = self.after = 0.0
        self.busy_before: float | None = None  # the guard's CPU reading (high load only)
        self.waited = 0.0
        self.foreign: float | None = None
        self.irq: float | None = None

    def start(self) -> Measured:
        guard = self.guard or GUARD
        # strict: the load itself must fall (the row's validity is judged by it)
        self.before, self.waited = guard.wait(self.what, strict=True)
        self.busy_before = guard.busy_before
        self.meter.start()
        return self

    def stop(self) -> None:
        self.foreign, self.irq = self.meter.stop()
        self.after = load_avg()
        if self.busy_before is None:  # a CPU reading judged the machine, not the load
            warn_load(self.before, f"{self.what} ({self.before} -> {self.after})")
        ok, why = validity(self.foreign, load_before=self.before, busy_before=self.busy_before)
        if not ok:
            print(f"WARNING: {self.what}: row invalid: {why}", file=sys.stderr, flush=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def fields(self) -> dict:
        ok, why = validity(self.foreign, load_before=self.before, busy_before=self.busy_before)
        return {
            "load": max(self.before, self.after),
            "load_before": self.before,
            "load_after": self.after,
            "busy_before": self.busy_before,
            "foreign_cpu": self.foreign,
            "irq_cpu": self.irq,
            "valid": "true" if ok else "false",
            "invalid_reason": why,
            "quiet_wait_s": self.waited,
        }


def paired_order(plan: list, rep: int) -> list:
    """The arms of paired repeat ``rep``: every repeat runs each arm once, odd repeats in
    reverse order, so that a drift of the machine within a repeat hits the arms evenly."""
    return plan[::-1] if rep % 2 else plan


def merge_fields(parts: list[dict]) -> dict:
    """The fields of several measurements behind one row: load before of the first, after
    of the last, the highest load and foreign CPU; valid only when every part is."""
    if not parts:
        return {}
    fc = [p.get("foreign_cpu") for p in parts]
    worst = None if any(f is None for f in fc) else max(fc)
    ok, why = validity(worst)
    if ok and any(p.get("valid") == "false" for p in parts):
        ok, why = False, next(p["invalid_reason"] for p in parts if p.get("valid") == "false")
    irq = [p.get("irq_cpu") for p in parts if p.get("irq_cpu") is not None]
    return {
        "load": max(p["load"] for p in parts),
        "load_before": parts[0]["load_before"],
        "load_after": parts[-1]["load_after"],
        "busy_before": parts[0].get("busy_before"),
        "foreign_cpu": worst,
        "irq_cpu": max(irq) if irq else None,
        "valid": "true" if ok else "false",
        "invalid_reason": why,
        "quiet_wait_s": sum(p.get("quiet_wait_s") or 0.0 for p in parts),
    }


def training_budget(epochs: int) -> dict:
    """The training keys for a run of exactly ``epochs`` epochs, never stopped early; an
    absolute target: no calibration runs, the arms time one training run each."""
    return {
        "max_epochs": epochs,
        "stop_at_target": False,
        "target": {"mode": "absolute", "value": 0.05},
    }


#: what the benchmarks themselves write into the tree: no reason for "+dirty"
OWN_OUTPUTS = ("benchmarks/results", "docs/performance.md")


def git_commit() -> str:
    """Short commit of the working tree (12 hex digits), ``+dirty`` when tracked files
    other than the benchmarks' own outputs differ (``make bench``'s second benchmark
    starts beside the first one's new CSVs): hvdscale.project.git_commit, shortened."""
    from hvdscale.project import git_commit as full_commit

    commit = full_commit(ROOT, ignore=OWN_OUTPUTS)
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
    keys = list(PROVENANCE) + [k for k in QUALITY if any(k in r for r in full)]
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
