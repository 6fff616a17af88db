"""The benchmarks' quiet guard, foreign-CPU validity and bench_scaling's ceiling check
(quick: fake load and CPU sources, no real timing), and bench_scaling.py --quick end to
end (slow: starts about ten training processes; no timing is asserted)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest_train import TRAIN_PY, needs_train_env

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _quiet  # noqa: E402
import _results  # noqa: E402
import bench_scaling  # noqa: E402


class FakeTime:
    """A clock that only the fake sleep advances."""

    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def clock(self):
        return self.now

    def sleep(self, s):
        self.sleeps.append(s)
        self.now += s


def guard(load: float, t: FakeTime, **kw) -> _quiet.QuietGuard:
    return _quiet.QuietGuard(
        max_load=kw.get("max_load", 0.5),
        timeout_s=kw.get("timeout_s", 30.0),
        poll_s=5.0,
        load=lambda: load,
        sleep=t.sleep,
        clock=t.clock,
        culprits=lambda: "stress-ng (pid 4242, 1.00 core)",
        busy=kw.get("busy", lambda: 1.5),  # cores the machine uses now
        max_busy=0.1,
    )


def test_a_busy_machine_makes_the_guard_wait_then_stop_with_the_cause():
    t = FakeTime()
    with pytest.raises(_quiet.NotQuiet) as exc:
        guard(3.2, t).wait("keras w1 b75")
    assert sum(t.sleeps) == 30.0 and len(t.sleeps) == 6  # it waited the whole timeout
    msg = str(exc.value)
    assert "3.20" in msg and "threshold 0.5" in msg and "keras w1 b75" in msg
    assert "something else is running" in msg and "stress-ng (pid 4242" in msg
    assert _quiet.ENV_MAX_LOAD in msg


def test_a_quiet_machine_lets_the_arm_proceed_at_once():
    t = FakeTime()
    load, waited = guard(0.21, t).wait()
    assert (load, waited, t.sleeps) == (0.21, 0.0, [])


def test_the_guard_proceeds_when_the_load_drops_while_it_waits():
    t = FakeTime()
    loads = iter([1.4, 0.9, 0.3])
    g = guard(0.0, t)
    g.load = lambda: next(loads)
    assert g.wait() == (0.3, 10.0)


def test_a_high_load_on_an_idle_machine_is_the_last_arm_s_lag_not_foreign_work():
    """The load average still carries the benchmark's own previous arm; the machine's CPU
    now says nothing else runs: the arm proceeds at once and the reading is recorded."""
    t = FakeTime()
    g = guard(1.8, t, busy=lambda: 0.02)
    assert g.wait() == (1.8, 0.0) and t.sleeps == [] and g.busy_before == 0.02
    with pytest.raises(_quiet.NotQuiet, match="1.80"):  # make bench's first look: the load
        g.wait("the benchmarks", strict=True)
    assert g.busy_before is None


def test_a_high_load_with_the_cpu_busy_waits_and_names_both():
    t = FakeTime()
    busy = iter([0.9, 0.8, 0.03])
    g = guard(1.8, t, busy=lambda: next(busy))
    assert g.wait() == (1.8, 10.0) and g.busy_before == 0.03
    g = guard(1.8, t, busy=lambda: 0.9)
    with pytest.raises(_quiet.NotQuiet) as exc:
        g.wait("torch-ddp w2 b75")
    assert "used 0.90 cores (limit 0.1)" in str(exc.value)


def test_validity_judges_the_load_and_the_cpu_reading_where_the_guard_took_one(monkeypatch):
    monkeypatch.setattr(_quiet, "CORES", 2)
    assert _quiet.validity(0.01, load_before=1.7) == (
        False,
        "load before 1.70 > 1 (0.5 per core, 2 cores): started on a busy machine",
    )
    assert not _quiet.validity(0.01, load_before=1.7, busy_before=0.04)[0]  # load rules
    assert _quiet.validity(0.01, load_before=0.7, busy_before=0.04) == (True, "")
    ok, why = _quiet.validity(0.01, load_before=0.2, busy_before=0.3)
    assert not ok and why.startswith("busy before 0.30 > 0.1")
    row = {"machine": "vm: AMD EPYC, 2 cores", "foreign_cpu": "0.01", "load_before": "1.7"}
    assert not _quiet.row_validity(row)[0]
    assert not _quiet.row_validity({**row, "busy_before": "0.04"})[0]


def test_threshold_and_timeout_from_the_environment(monkeypatch):
    monkeypatch.setenv(_quiet.ENV_MAX_LOAD, "0.8")
    monkeypatch.setenv(_quiet.ENV_TIMEOUT, "42")
    g = _quiet.QuietGuard()
    assert (g.max_load, g.timeout_s) == (0.8, 42.0)
    monkeypatch.setenv(_quiet.ENV_MAX_LOAD, "low")
    with pytest.raises(SystemExit, match=_quiet.ENV_MAX_LOAD):
        _quiet.QuietGuard()


def test_a_benchmark_stops_with_the_message_before_measuring(monkeypatch, capsys, tmp_path):
    """bench_data's harness on a busy machine: waits, then exits 3 with the guard's
    message, and never starts its measurement (the data commands)."""
    import bench_data

    t = FakeTime()
    fake = guard(2.7, t)
    for k in ("load", "sleep", "clock", "culprits", "busy", "max_busy"):
        monkeypatch.setattr(_results.GUARD, k, getattr(fake, k))

    def no_run(*a, **k):
        raise AssertionError("the benchmark measured on a busy machine")

    monkeypatch.setattr(bench_data.subprocess, "run", no_run)
    monkeypatch.setattr(bench_data.subprocess, "Popen", no_run)
    argv = ["--max-load", "0.5", "--quiet-timeout", "20", "--tmpdir", str(tmp_path)]
    rc = bench_data.main(argv)
    assert rc == 3
    err = capsys.readouterr().err
    assert "machine not quiet" in err and "2.70" in err and "waiting" in err
    assert sum(t.sleeps) == 20.0
    assert not list(tmp_path.iterdir())  # nothing generated


def fake_meter(busy_s: float, own_s: float, wall_s: float = 10.0) -> _quiet.CpuMeter:
    """System busy CPU grows by ``busy_s``, the arm's own by ``own_s`` over ``wall_s``."""
    t = {"total": iter([(100.0, 1.0), (100.0 + busy_s, 1.5)]), "own": iter([5.0, 5.0 + own_s])}
    clock = iter([0.0, wall_s])
    return _quiet.CpuMeter(
        total=lambda: next(t["total"]),
        own=lambda: next(t["own"]),
        clock=lambda: next(clock),
        sample_tree=False,
    )


def measured(meter, load=0.2):
    t = FakeTime()
    m = _results.Measured("hvdscale w2 b75", guard=guard(load, t), meter=meter)
    with m:
        pass
    return m.fields()


def test_foreign_cpu_above_the_limit_marks_the_row_invalid(tmp_path, monkeypatch):
    monkeypatch.setattr(_quiet, "CORES", 2)  # the limit is 0.05 of a core per core
    # 3.5 core-seconds busy, 2.0 of them the arm's own, over 10 s: 0.15 of a core foreign
    f = measured(fake_meter(3.5, 2.0))
    assert f["foreign_cpu"] == 0.15 and f["irq_cpu"] == 0.05
    assert f["valid"] == "false" and "foreign_cpu 0.15 > 0.1" in f["invalid_reason"]
    assert f["load_before"] == 0.2
    out = _results.write_csv("x", [{"arm": "hvdscale", **f}], tmp_path / "x.csv")
    with open(out, newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert row["valid"] == "false" and row["foreign_cpu"] == "0.15"
    row["machine"] = "vm: AMD EPYC, 2 cores"
    assert _quiet.row_validity(row) == (False, f["invalid_reason"])


def test_foreign_cpu_below_the_limit_keeps_the_row_valid(monkeypatch):
    monkeypatch.setattr(_quiet, "CORES", 2)
    f = measured(fake_meter(2.5, 2.0))  # 0.05 of a core foreign
    assert (f["foreign_cpu"], f["valid"], f["invalid_reason"]) == (0.05, "true", "")
    row = {k: str(v) for k, v in f.items()}
    assert _quiet.row_validity({**row, "machine": "vm: AMD EPYC, 2 cores"}) == (True, "")


@pytest.mark.parametrize(
    "cores, foreign, before, reason",
    [
        (2, "0.13", "0.5", "foreign_cpu 0.13 > 0.1 (0.05 per core, 2 cores)"),
        (16, "0.73", "0.5", ""),
        (16, "0.81", "0.5", "foreign_cpu 0.81 > 0.8 (0.05 per core, 16 cores)"),
        (2, "0.01", "1.10", "load before 1.10 > 1 (0.5 per core, 2 cores)"),
        (16, "0.01", "1.10", ""),
    ],
)
def test_the_validity_rule_is_per_core(cores, foreign, before, reason):
    """A 16-core GPU machine is judged like the 2-core one: foreign CPU and load before
    per core. A row the benchmark marked invalid by the old absolute load rule is judged
    again; one marked invalid for another reason stays so."""
    machine = f"vm: Intel Xeon, {cores} cores, GPU NVIDIA H200"
    old = {"valid": "false", "invalid_reason": "load before 1.1 > 1.0: started on a busy machine"}
    row = {"machine": machine, "foreign_cpu": foreign, "load_before": before, **old}
    ok, why = _quiet.row_validity(row)
    assert ok == (not reason) and why.startswith(reason) and bool(why) == bool(reason)
    failed = {**row, "invalid_reason": "the run failed"}
    assert _quiet.row_validity(failed)[0] is False


def test_rows_without_foreign_cpu_are_invalid():
    assert _quiet.row_validity({"load": "0.1"}) == (False, _quiet.NO_FOREIGN)
    # a row behind several measurements is valid only when each of them is
    merged = _results.merge_fields([measured(fake_meter(2.5, 2.0)), measured(fake_meter(4, 2))])
    assert merged["valid"] == "false" and merged["foreign_cpu"] == 0.2


def paired_runs(ceiling: float) -> dict:
    """Three paired repeats at batch 75 whose independent control gives ``ceiling``."""
    f = {"load": 0.1, "load_before": 0.1, "load_after": 1.9, "foreign_cpu": 0.01}
    f.update({"irq_cpu": 0.0, "valid": "true", "invalid_reason": "", "quiet_wait_s": 0.0})
    thr = {("hvdscale", 1): 1000.0, ("hvdscale", 2): 1500.0, ("independent", 2): 2000 * ceiling}
    return {
        75: {k: {rep: {"throughput": v, "fields": f} for rep in range(3)} for k, v in thr.items()}
    }


BURN = (
    "import os, time\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"  # the burner is reparented, as slurmstepd is
    "    t = time.process_time()\n"
    "    while time.process_time() - t < 0.6: pass\n"
    "    os._exit(0)\n"
    "os.write(1, str(pid).encode())\n"
    "os._exit(0)\n"
)


def burn_reparented() -> None:
    """Run BURN and wait until its reparented grandchild has ended: it burns 0.6 s of its
    own CPU time, however long a busy machine makes that take (no fixed sleep)."""
    pid = int(subprocess.run([sys.executable, "-c", BURN], check=True, capture_output=True,
                             text=True).stdout)  # fmt: skip
    stat = Path(f"/proc/{pid}/stat")
    deadline = time.monotonic() + 120  # a hang guard, not a measurement
    while time.monotonic() < deadline:
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                return  # exited, not (yet) reaped by its new parent
        except (FileNotFoundError, ProcessLookupError):
            return  # exited and reaped
        time.sleep(0.05)
    raise AssertionError(f"the burner {pid} did not end within 120 s")


def test_the_cgroup_account_charges_short_lived_reparented_processes():
    """What sampling missed under the SLURM daemons: a process that leaves this tree
    (reparented) and ends between two looks is still charged to the arm."""
    acct = _quiet.CgroupAccount.open()
    if acct is None:
        pytest.skip("no writable cgroup here (not root or no cgroup file system)")
    try:
        u0 = acct.usage()
        burn_reparented()  # the grandchild burns 0.6 s of CPU after its parent exited
        used = acct.usage() - u0
    finally:
        acct.close()
    assert used >= 0.55, used  # the 0.6 CPU seconds it burned, less the clock's grain
    assert not acct.dir.exists()
    assert str(os.getpid()) in (acct.root / "cgroup.procs").read_text().split()  # back


def test_the_meter_counts_a_named_process_tree_through_the_cgroup():
    """A process started before the arm, named like a SLURM daemon, is put in the arm's
    group: what it forks during the arm is the arm's own, not foreign."""
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        name = Path(f"/proc/{daemon.pid}/comm").read_text().strip()
        meter = _quiet.CpuMeter(names=(name,))
        meter.start()
        if meter.cgroup is None:
            pytest.skip("no writable cgroup here")
        assert daemon.pid in map(int, (meter.cgroup.dir / "cgroup.procs").read_text().split())
        burn_reparented()
        own = meter.cgroup.usage() - meter.cg0
        meter.stop()
    finally:
        daemon.kill()
        daemon.wait()
    assert own >= 0.55


def test_the_ceiling_check_rejects_4_93():
    summary = bench_scaling.summarise([75], paired_runs(4.93), {}, 6, 3)
    ceiling = next(r for r in summary if r["metric"] == "ceiling")
    assert ceiling["median"] == pytest.approx(4.93)
    with pytest.raises(bench_scaling.CeilingError) as exc:
        bench_scaling.check_ceiling(summary)
    msg = str(exc.value)
    assert "batch 75: 4.93" in msg and "not alone" in msg and "timers" in msg


def test_the_ceiling_check_accepts_a_possible_ceiling():
    summary = bench_scaling.summarise([75], paired_runs(0.97), {}, 6, 3)
    bench_scaling.check_ceiling(summary)  # no exception
    assert all(r["valid"] == "true" and r["runs_left_out"] == 0 for r in summary)


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_quick_mode_writes_the_summary_and_the_runs(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    r = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_scaling.py"),
            "--quick",
            # a smoke test of the plumbing, wherever it runs: no guard, no ceiling check
            "--max-load",
            "1000",
            "--no-ceiling-check",
            "--out-dir",
            tmp_path,
            "--work",
            tmp_path / "work",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(tmp_path / "bench_scaling_runs.csv", newline="") as fh:
        runs = list(csv.DictReader(fh))
    assert {r["phase"] for r in runs} == {"tune", "paired"}
    assert all(r["status"] == "ok" for r in runs), [
        (r["arm"], r["status"], r.get("invalid_reason")) for r in runs if r["status"] != "ok"
    ]
    assert {"hvdscale", "independent"} <= {r["arm"] for r in runs if r["phase"] == "paired"}
    for row in runs:
        assert row["commit"] and row["machine"] and row["date"]
        float(row["load_before"]), float(row["load_after"]), float(row["foreign_cpu"])
        assert row["valid"] in ("true", "false")


def test_instrumentation_overhead_row_is_paired_per_round():
    import bench_train_overhead as bto

    class A:
        instrument_every, samples, batch, core = 10, 300, 75, 0

    res = {"inst": [980.0, 1000.0, 990.0], "plain": [1000.0, 1010.0, 1000.0]}
    cfg = {"inst": {"in_device_memory": True, "spe": 64, "instrument_every": 10}}
    f = measured(fake_meter(2.5, 2.0))
    row = bto.overhead_row(res, cfg, A, f)
    per_round = sorted([1000 / 980 - 1, 1010 / 1000 - 1, 1000 / 990 - 1])
    assert row["variant"] == "instrumentation_overhead" and row["instrument_every"] == 10
    assert row["overhead"] == pytest.approx(per_round[1]) and row["repeats"] == 3
    assert row["valid"] == "true" and row["overhead_goal"] == 0.02
    worse = bto.round_fields(f, [0.01, 0.4, None])
    assert worse["valid"] == "false" and worse["foreign_cpu"] is None
    worse = bto.round_fields(f, [0.01, 0.4])
    assert worse["foreign_cpu"] == 0.4 and "0.40 > 0.1" in worse["invalid_reason"]


@pytest.mark.slow
@pytest.mark.horovod
@needs_train_env
def test_train_overhead_runs_every_variant_end_to_end(tmp_path):
    """bench_train_overhead.py, tiny: every hvdscale variant (xla: training.compile
    default) and one Keras candidate train, and the CSV has their rows and the overhead
    row. No figure is judged."""
    out = tmp_path / "overhead.csv"
    argv = [str(TRAIN_PY), str(ROOT / "benchmarks" / "bench_train_overhead.py")]
    argv += ["--samples", "1500", "--repeats", "2", "--variants", "default,plain,inst,xla"]
    argv += ["--keras", "spe64jit0", "--max-load", "1000", "--csv", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "TF_CPP_MIN_LOG_LEVEL": "2"}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with open(out, newline="") as fh:
        rows = {row["variant"]: row for row in csv.DictReader(fh)}
    want = {"keras_spe64jit0", "default", "plain", "inst", "xla", "instrumentation_overhead"}
    assert set(rows) == want, sorted(rows)
    assert all(float(rows[v]["samples_per_s"]) > 0 for v in want - {"instrumentation_overhead"})
