"""Measure alone: the quiet guard (``QuietGuard``), the foreign-CPU meter (``CpuMeter``)
and the validity of a row (``validity``, ``row_validity``) of every benchmark. The rules
and their limits, all per core of the machine, are in benchmarks/README.md ("Benchmarks
run alone"). No heavy imports here: the page generator (perfdocs) uses ``row_validity``.
"""

from __future__ import annotations

import os
import re
import resource
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path

CORES = os.cpu_count() or 1
MAX_LOAD_PER_CORE = 0.25
FOREIGN_CPU_PER_CORE = 0.05
LOAD_BEFORE_PER_CORE = 0.5
MAX_LOAD_DEFAULT = MAX_LOAD_PER_CORE * CORES
QUIET_TIMEOUT_DEFAULT = 600.0
BUSY_WINDOW_S = 2.0  # how long the guard watches the machine's CPU before an arm
ENV_MAX_LOAD = "HVDSCALE_BENCH_MAX_LOAD"
ENV_TIMEOUT = "HVDSCALE_BENCH_QUIET_TIMEOUT"
NO_FOREIGN = "no foreign_cpu recorded (measured before the quiet guard)"


class NotQuiet(RuntimeError):
    """The machine did not become quiet before the guard's timeout."""


def load_avg() -> float:
    """The 1-minute load average (0.0 where the OS has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return 0.0


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise SystemExit(f"environment {name}={raw!r}: expected a number") from None


def busiest(n: int = 3) -> str:
    """The ``n`` processes with the most CPU time in the last second (psutil), for the
    guard's message: ``"python3 (pid 12, 0.98 core), ..."``; '' without psutil."""
    try:
        import psutil
    except ImportError:
        return ""
    procs = [p for p in psutil.process_iter(["name"]) if p.pid != os.getpid()]
    for p in procs:
        try:
            p.cpu_percent(None)
        except psutil.Error:
            pass
    time.sleep(1.0)
    use = []
    for p in procs:
        try:
            use.append((p.cpu_percent(None) / 100.0, p.info["name"], p.pid))
        except psutil.Error:
            pass
    top = [u for u in sorted(use, reverse=True)[:n] if u[0] >= 0.05]
    return ", ".join(f"{name} (pid {pid}, {c:.2f} core)" for c, name, pid in top)


class QuietGuard:
    """Waits until the machine is quiet before an arm, at most ``timeout_s`` (then
    NotQuiet). Quiet: the 1-minute load is below ``max_load``, or, where it is not, the
    whole machine used at most ``max_busy`` cores over the last ``BUSY_WINDOW_S`` seconds
    (``busy``): the load average still carries the benchmark's own previous arm for a
    minute or two after it ended, and nothing else is running now. ``strict`` waits for
    the load alone (``make bench``'s first look). ``busy_before`` is that reading (None
    when the load was below the threshold). The sources, sleep and clock can be replaced
    (tests)."""

    def __init__(self, max_load=None, timeout_s=None, poll_s=5.0, load=load_avg,
                 sleep=time.sleep, clock=time.monotonic, culprits=busiest, busy=None,
                 max_busy=None):  # fmt: skip
        self.max_load = _env_float(ENV_MAX_LOAD, MAX_LOAD_DEFAULT) if max_load is None else max_load
        self.timeout_s = timeout_s
        if timeout_s is None:
            self.timeout_s = _env_float(ENV_TIMEOUT, QUIET_TIMEOUT_DEFAULT)
        self.poll_s, self.load, self.sleep, self.clock = poll_s, load, sleep, clock
        self.culprits = culprits
        self.busy = busy if busy is not None else busy_now
        self.max_busy = FOREIGN_CPU_PER_CORE * CORES if max_busy is None else max_busy
        self.busy_before: float | None = None

    def wait(self, what: str = "the next arm", strict: bool = False) -> tuple[float, float]:
        """(load, seconds waited) once the machine is quiet; NotQuiet after the timeout."""
        t0 = self.clock()
        load, busy = self.load(), None
        self.busy_before = None
        told = False
        while load >= self.max_load:
            if not strict:
                busy = self.busy()
                if busy is not None and busy <= self.max_busy:
                    self.busy_before = busy
                    break
            waited = self.clock() - t0
            if waited >= self.timeout_s:
                raise NotQuiet(self.message(load, waited, what, busy))
            if not told:
                print(f"quiet guard: load {load:.2f} >= {self.max_load:g}"
                      + (f" and {busy:.2f} cores busy" if busy is not None else "")
                      + f" before {what}; waiting (at most {self.timeout_s:g} s)",
                      file=sys.stderr, flush=True)  # fmt: skip
                told = True
            self.sleep(min(self.poll_s, max(self.timeout_s - waited, 0.0)) or self.poll_s)
            load = self.load()
        return load, round(self.clock() - t0, 1)

    def message(self, load: float, waited: float, what: str, busy: float | None = None) -> str:
        top = self.culprits()
        now = f" and the machine used {busy:.2f} cores (limit {self.max_busy:g})" if busy else ""
        return (
            f"machine not quiet: the 1-minute load average was {load:.2f} (threshold "
            f"{self.max_load:g}){now} after waiting {waited:.0f} s before {what}. Likely "
            "cause: something else is running on this machine (another benchmark, a test "
            "suite, a build, another session's training)"
            + (f"; busiest now: {top}" if top else "")
            + ". Benchmarks run alone (benchmarks/README.md): stop the other work, or set "
            f"--max-load / {ENV_MAX_LOAD} and --quiet-timeout / {ENV_TIMEOUT}."
        )


def busy_now(window_s: float = BUSY_WINDOW_S) -> float | None:
    """Cores the whole machine used over the next ``window_s`` seconds (user+nice+system+
    steal of /proc/stat; the caller sleeps meanwhile); None where it cannot be read."""
    c0, t0 = cpu_seconds(), time.monotonic()
    time.sleep(window_s)
    c1, t1 = cpu_seconds(), time.monotonic()
    if c0 is None or c1 is None or t1 <= t0:
        return None
    return round(max(c1[0] - c0[0], 0.0) / (t1 - t0), 3)


def cpu_seconds() -> tuple[float, float] | None:
    """System-wide CPU seconds since boot from /proc/stat: (user+nice+system+steal,
    irq+softirq); None where it cannot be read."""
    try:
        with open("/proc/stat") as fh:
            f = fh.readline().split()
        v = [float(x) for x in f[1:9]]  # user nice system idle iowait irq softirq steal
        hz = float(os.sysconf("SC_CLK_TCK"))
        return (v[0] + v[1] + v[2] + v[7]) / hz, (v[5] + v[6]) / hz  # guest is inside user
    except (OSError, ValueError, IndexError):
        return None


def own_cpu_seconds() -> float:
    """CPU seconds of this process and of its children that were waited for (their own
    waited-for descendants included, as the kernel adds them up)."""
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


class TreeSampler(threading.Thread):
    """Samples (psutil) the CPU time of every live descendant of this process, plus the
    processes named ``names`` and their descendants (bench_costmodel: the SLURM
    daemons run its jobs outside this tree). ``total()``: the sum of the last value seen
    of each process, a lower bound of what the tree used since ``start``."""

    def __init__(self, names: tuple[str, ...] = (), poll_s: float = 0.5):
        super().__init__(daemon=True)
        self.names, self.poll_s = set(names), poll_s
        self.seen: dict[tuple[int, float], float] = {}
        self.base: dict[tuple[int, float], float] = {}
        self._stop = threading.Event()
        try:
            import psutil

            self.psutil = psutil
        except ImportError:
            self.psutil = None
        self._sample(self.base)  # what existed before is not the arm's

    def _procs(self):
        ps = self.psutil
        me = ps.Process()
        roots = [me]
        if self.names:
            roots += [p for p in ps.process_iter(["name"]) if p.info["name"] in self.names]
        out = {}
        for r in roots:
            for p in [r, *r.children(recursive=True)] if r is not me else r.children(True):
                out[p.pid] = p
        return out.values()

    def _sample(self, into: dict) -> None:
        if self.psutil is None:
            return
        try:
            procs = list(self._procs())
        except self.psutil.Error:
            return
        for p in procs:
            try:
                t = p.cpu_times()
                into[(p.pid, p.create_time())] = t.user + t.system
            except self.psutil.Error:
                pass

    def run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._sample(self.seen)

    def finish(self) -> float:
        self._stop.set()
        self._sample(self.seen)
        return sum(v - self.base.get(k, 0.0) for k, v in self.seen.items())


CGROUP_ROOTS = ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/unified", "/sys/fs/cgroup")


class CgroupAccount:
    """Exact CPU time of the arm: a cgroup of its own (cgroup v1 ``cpuacct.usage``, or
    v2 ``cpu.stat`` usage_usec) holding this process and the named processes (the SLURM
    daemons). Whatever they fork later is born in it, also processes that are reparented
    (slurmstepd) or end between two looks, and the kernel charges their CPU time to it,
    so nothing is sampled. ``open()`` returns None where no writable cgroup exists (not
    root, no cgroup file system); the meter falls back to sampling then.
    ``close()`` moves every process left in it back to the root group and removes it."""

    def __init__(self, root: Path, names: tuple[str, ...] = ()):
        self.root, self.names = root, names
        self.dir = root / f"hvdscale-bench-{os.getpid()}-{time.monotonic_ns()}"
        self.v1 = (root / "cpuacct.usage").exists() or root.name == "cpuacct"

    @classmethod
    def open(cls, names: tuple[str, ...] = (), roots: Iterable[str] = CGROUP_ROOTS):
        for r in map(Path, roots):
            if not (r / "cgroup.procs").exists():
                continue
            acct = cls(r, names)
            try:
                acct.dir.mkdir()
                acct.add(os.getpid())
                for pid in pids_named(names):
                    acct.add(pid, missing_ok=True)
                acct.usage()
                return acct
            except OSError:
                acct.close()
        return None

    def add(self, pid: int, missing_ok: bool = False) -> None:
        try:
            (self.dir / "cgroup.procs").write_text(f"{pid}\n")
        except ProcessLookupError:
            if not missing_ok:
                raise

    def usage(self) -> float:
        """CPU seconds charged to the group since it was made."""
        if self.v1:
            return int((self.dir / "cpuacct.usage").read_text()) / 1e9
        for line in (self.dir / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
        raise OSError(f"{self.dir / 'cpu.stat'}: no usage_usec")

    def close(self) -> None:
        try:
            for pid in (self.dir / "cgroup.procs").read_text().split():
                try:
                    (self.root / "cgroup.procs").write_text(f"{pid}\n")
                except ProcessLookupError:
                    pass
            self.dir.rmdir()
        except OSError:
            pass


def pids_named(names: Iterable[str]) -> list[int]:
    """PIDs of the live processes whose name (/proc/PID/comm) is one of ``names``."""
    names, out = set(names), []
    if not names:
        return out
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() in names:
                    out.append(int(d.name))
            except OSError:
                pass
    return out


class CpuMeter:
    """``start()`` ... ``stop()`` -> (foreign_cpu, irq_cpu) as fractions of one core over
    the wall time between them (None, None where the system's CPU time is unknown). The
    sources can be replaced (tests)."""

    def __init__(self, total=cpu_seconds, own=own_cpu_seconds, clock=time.monotonic,
                 sample_tree: bool = True, names: tuple[str, ...] = ()):  # fmt: skip
        self.total, self.own, self.clock = total, own, clock
        self.sample_tree, self.names = sample_tree, names
        self.sampler: TreeSampler | None = None
        self.cgroup: CgroupAccount | None = None

    def start(self) -> CpuMeter:
        self.cgroup = CgroupAccount.open(self.names) if self.sample_tree else None
        self.cg0 = self.cgroup.usage() if self.cgroup is not None else None
        if self.sample_tree and self.cgroup is None:
            self.sampler = TreeSampler(self.names)
            self.sampler.start()
        self.t0, self.total0, self.own0 = self.clock(), self.total(), self.own()
        self.self0 = _self_cpu()
        return self

    def stop(self) -> tuple[float | None, float | None]:
        wall = self.clock() - self.t0
        total1, own_ru = self.total(), self.own() - self.own0
        own = own_ru
        if self.cgroup is not None:
            own = max(own_ru, self.cgroup.usage() - self.cg0)
            self.cgroup.close()
            self.cgroup = None
        elif self.sampler is not None:
            own = max(own_ru, _self_cpu() - self.self0 + self.sampler.finish())
        if self.total0 is None or total1 is None or wall <= 0:
            return None, None
        busy = total1[0] - self.total0[0]
        irq = total1[1] - self.total0[1]
        return round(max(busy - own, 0.0) / wall, 3), round(max(irq, 0.0) / wall, 3)


def _self_cpu() -> float:
    s = resource.getrusage(resource.RUSAGE_SELF)
    return s.ru_utime + s.ru_stime


def validity(
    foreign_cpu: float | None,
    cores: int | None = None,
    load_before: float | None = None,
    busy_before: float | None = None,
) -> tuple[bool, str]:
    """(valid, reason) of a measurement with this foreign CPU (in cores) on a machine of
    ``cores`` cores (None: this one's) that started at ``load_before`` and, where the guard
    read the CPU, with ``busy_before`` cores busy: the limits are per core; both apply."""
    cores = cores or CORES
    if foreign_cpu is None:
        return False, "foreign CPU not measurable on this system"
    if foreign_cpu > FOREIGN_CPU_PER_CORE * cores:
        return False, (
            f"foreign_cpu {foreign_cpu:.2f} > {FOREIGN_CPU_PER_CORE * cores:g} "
            f"({FOREIGN_CPU_PER_CORE:g} per core, {cores} cores): other processes ran"
        )
    if busy_before is not None:
        if busy_before > FOREIGN_CPU_PER_CORE * cores:
            return False, (
                f"busy before {busy_before:.2f} > {FOREIGN_CPU_PER_CORE * cores:g} "
                f"({FOREIGN_CPU_PER_CORE:g} per core, {cores} cores): started on a busy machine"
            )
    if load_before is not None and load_before > LOAD_BEFORE_PER_CORE * cores:
        return False, (
            f"load before {load_before:.2f} > {LOAD_BEFORE_PER_CORE * cores:g} "
            f"({LOAD_BEFORE_PER_CORE:g} per core, {cores} cores): started on a busy machine"
        )
    return True, ""


def cores_of(machine: str) -> int:
    """The core count a CSV row's ``machine`` column names ("..., 16 cores, ..."); 1 when
    it names none (the strictest limits)."""
    m = re.search(r"(\d+) cores", machine or "")
    return int(m.group(1)) if m else 1


def _number(raw: str) -> float | None:
    try:
        return float(raw)
    except ValueError:
        return None


def row_validity(row: dict) -> tuple[bool, str]:
    """(valid, reason) of a CSV row (strings), judged again by the per-core limits: no
    foreign_cpu (an old row) -> invalid; foreign CPU or load before above the limits ->
    invalid; ``valid`` false for another reason (a failed run) -> invalid with it."""
    raw = (row.get("foreign_cpu") or "").strip()
    if not raw:
        return False, NO_FOREIGN
    fc = _number(raw)
    if fc is None:
        return False, f"foreign_cpu {raw!r} is not a number"
    before = _number((row.get("load_before") or "").strip())
    busy = _number((row.get("busy_before") or "").strip())
    ok, why = validity(fc, cores_of(row.get("machine", "")), before, busy)
    if not ok:
        return ok, why
    reason = row.get("invalid_reason") or ""
    marked = str(row.get("valid", "true")).strip().lower() in ("false", "0", "no")
    if marked and not re.search(r"foreign|load|busy", reason):  # quiet rules: judged above
        return False, reason or "marked invalid"
    return True, ""


def add_quiet_args(ap) -> None:
    """The guard's options on a benchmark's ArgumentParser."""
    ap.add_argument("--max-load", type=float, default=None,
                    help=f"before each arm wait until the 1-minute load is below this (default "
                    f"{MAX_LOAD_PER_CORE:g} per core = {MAX_LOAD_DEFAULT:g} here; "
                    f"env {ENV_MAX_LOAD})")  # fmt: skip
    ap.add_argument("--quiet-timeout", type=float, default=None,
                    help=f"give up waiting for a quiet machine after this many seconds (default "
                    f"{QUIET_TIMEOUT_DEFAULT:g}; env {ENV_TIMEOUT})")  # fmt: skip


def main(argv=None) -> int:
    """``python benchmarks/_quiet.py``: wait (strictly, by the 1-minute load) until the
    machine is quiet; ``make bench`` runs it first. Exit 3 when it stays busy."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    add_quiet_args(ap)
    a = ap.parse_args(argv)
    guard = QuietGuard(a.max_load, a.quiet_timeout)
    try:
        load, waited = guard.wait("the benchmarks", strict=True)
    except NotQuiet as exc:
        print(f"make bench stopped: {exc}", file=sys.stderr, flush=True)
        return 3
    print(f"quiet: 1-minute load {load:.2f} < {guard.max_load:g} (waited {waited:g} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
