"""bench_frameworks.py's pure parts (issue 19): what a record gives an arm, the row of a
run and its validity, the plan, the per-batch config and the summary figures with their
pairing and censoring. Quick: no training process, no timing asserted."""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import _frameworks_summary as fs  # noqa: E402
import _quiet  # noqa: E402
import _results  # noqa: E402
import bench_frameworks  # noqa: E402

GOOD = {"load": 0.3, "load_before": 0.2, "load_after": 0.3, "foreign_cpu": 0.01,
        "irq_cpu": 0.0, "valid": "true", "invalid_reason": "", "quiet_wait_s": 0.0}  # fmt: skip


def record(wall=(9.0, 2.0, 4.0, 3.0), thr=(1.0, 200.0, 100.0, 150.0), reached=True):
    epochs = [{"warmup": k == 0, "wall_s": w, "throughput": t}
              for k, (w, t) in enumerate(zip(wall, thr))]  # fmt: skip
    return {
        "run_id": "local_gloo_n1_w2_b75_lrlinear_r0",
        "epochs": epochs,
        "target": {
            "reached": reached,
            "time_to_target_s": 5.5 if reached else None,
            "epoch": 2 if reached else None,
        },  # fmt: skip
        "summary": {"final_val_loss": 0.004, "final_test_loss": 0.005},
        "timing": {
            "sync": {
                "allreduce_s": 0.002,
                "exposed_s": 0.001,
                "comm_hook_s": 0.0015,
                "no_comm_step_s": 0.004,
                "definition": "x",
            }
        },  # fmt: skip
    }


def test_an_arm_is_the_records_headline_medians_after_the_warm_up():
    r = fs.arm_result(record())
    assert r["epoch_s"] == 3.0 and r["throughput"] == 150.0  # epoch 0 left out
    assert r["ttt_s"] == 5.5 and r["reached"] and r["target_epoch"] == 2
    assert r["exposed_s"] == 0.001 and r["comm_hook_s"] == 0.0015
    censored = fs.arm_result(record(reached=False))
    assert censored["ttt_s"] == math.inf and not censored["reached"]
    old = record()
    del old["timing"]  # a record before timing.sync
    assert fs.arm_result(old)["exposed_s"] is None


def test_a_failed_run_is_an_invalid_row_and_a_clean_one_keeps_its_quality_fields():
    ok = fs.run_row(1, 75, "torch-ddp", 2, fs.arm_result(record()), GOOD, 12.34)
    assert ok["status"] == "ok" and ok["valid"] == "true" and ok["wall_s"] == 12.3
    assert ok["epoch_s"] == 3.0 and ok["foreign_cpu"] == 0.01 and ok["repeat"] == 1
    bad = fs.run_row(0, 75, "horovod-tf", 1, {"error": "boom"}, GOOD, 1.0)
    assert bad["status"] == "failed" and bad["valid"] == "false"
    assert bad["invalid_reason"] == "the run failed" and _quiet.row_validity(
        {k: str(v) for k, v in bad.items()}
    ) == (False, "the run failed")
    assert fs.left_out_counts([ok, bad, {**bad, "batch": 1000}]) == {75: 1, 1000: 1}


def arm(epoch_s, thr, ttt=5.0, **sync):
    return {"epoch_s": epoch_s, "throughput": thr, "ttt_s": ttt, "fields": GOOD,
            "allreduce_s": sync.get("allreduce_s"), "exposed_s": sync.get("exposed_s"),
            "comm_hook_s": sync.get("comm_hook_s"), "no_comm_step_s": None}  # fmt: skip


def results(censor_torch_2w: int = 0) -> dict:
    """Three paired repeats: Horovod 1 worker 10 s / 100 samples/s, 2 workers 6 s / 160;
    torch 1 worker 20 s / 50, 2 workers 12.5 s / 80; independent 190 samples/s."""
    R: dict = {}
    for rep in range(3):
        d = 0.01 * rep  # a little spread between repeats
        R[("horovod-tf", 1)] = {**R.get(("horovod-tf", 1), {}), rep: arm(10 + d, 100, 8.0)}
        R[("horovod-tf", 2)] = {
            **R.get(("horovod-tf", 2), {}),
            rep: arm(6 + d, 160, 4.0, allreduce_s=0.002, exposed_s=0.002),
        }
        R[("torch-ddp", 1)] = {**R.get(("torch-ddp", 1), {}), rep: arm(20 + d, 50, 12.0)}
        ttt = math.inf if rep < censor_torch_2w else 8.0
        R[("torch-ddp", 2)] = {**R.get(("torch-ddp", 2), {}),
                               rep: arm(12.5 + d, 80, ttt, allreduce_s=0.003,
                                        exposed_s=0.001, comm_hook_s=0.0025)}  # fmt: skip
        ind = {"throughput": 190, "fields": GOOD}  # what Runner.run_independent gives
        R[(fs.INDEPENDENT, 2)] = {**R.get((fs.INDEPENDENT, 2), {}), rep: ind}
    return {75: R}


def pick(rows, metric, arm_, workers=2):
    hit = [r for r in rows if r["metric"] == metric and r["arm"] == arm_
           and r["workers"] == workers]  # fmt: skip
    assert len(hit) == 1, (metric, arm_, workers, hit)
    return hit[0]


def test_the_summary_pairs_the_repeats_per_framework_against_the_same_ceiling():
    rows = fs.summarise([75], results(), {75: 2})
    assert pick(rows, "ceiling", fs.INDEPENDENT)["median"] == pytest.approx(0.95)
    hv, tor = "horovod-tf", "torch-ddp"
    assert pick(rows, "efficiency", hv)["median"] == pytest.approx(0.8)
    assert pick(rows, "efficiency", tor)["median"] == pytest.approx(0.8)
    assert pick(rows, "efficiency_vs_ceiling", hv)["median"] == pytest.approx(0.8 / 0.95)
    assert pick(rows, "speedup_epoch", hv)["median"] == pytest.approx(10.01 / 6.01)
    assert pick(rows, "speedup_epoch", tor)["median"] == pytest.approx(20.01 / 12.51)
    assert pick(rows, "speedup_ttt", hv)["median"] == pytest.approx(2.0)
    assert pick(rows, "speedup_ttt", tor)["median"] == pytest.approx(1.5)
    assert pick(rows, "ratio_epoch_torch_vs_horovod", tor, 1)["median"] == pytest.approx(
        20.01 / 10.01
    )
    assert pick(rows, "sync_exposed_s", tor)["median"] == 0.001
    assert pick(rows, "sync_comm_hook_s", tor)["median"] == 0.0025
    assert not [r for r in rows if r["metric"] == "sync_comm_hook_s" and r["arm"] == hv]
    assert [r["metric"] for r in rows if r["arm"] == fs.INDEPENDENT] == ["throughput", "ceiling"]
    for r in rows:  # three repeats: intervals; quality fields and left-out count everywhere
        assert r["runs_left_out"] == 2 and r["valid"] == "true" and r["foreign_cpu"] == 0.01
        if r["metric"] in ("efficiency", "speedup_epoch", "ceiling"):
            assert r["n"] == 3 and r["ci_low"] <= r["median"] <= r["ci_high"]


def test_censored_times_to_target_are_inf_and_never_an_interval_of_the_reached_alone():
    rows = fs.summarise([75], results(censor_torch_2w=1))
    ttt = pick(rows, "ttt_s", "torch-ddp")
    assert ttt["median"] == 8.0 and ttt["ci_low"] is None and "reached 2/3" in ttt["note"]
    sp = pick(rows, "speedup_ttt", "torch-ddp")
    assert sp["median"] == pytest.approx(1.5) and "reached 2/3 (2 workers)" in sp["note"]
    rows = fs.summarise([75], results(censor_torch_2w=2))  # half or more censored: no median
    assert pick(rows, "ttt_s", "torch-ddp")["median"] is None
    sp = pick(rows, "speedup_ttt", "torch-ddp")
    assert sp["median"] is None and sp["ci_low"] is None and "no interval" in sp["note"]


def test_fewer_than_three_repeats_give_no_interval_and_missing_arms_no_figure():
    R = results()[75]
    two = {k: {0: v[0]} for k, v in R.items() if k != (fs.INDEPENDENT, 2)}
    rows = fs.summarise([75], {75: two})
    assert pick(rows, "efficiency", "torch-ddp")["ci_low"] is None
    assert not [r for r in rows if r["metric"] in ("ceiling", "efficiency_vs_ceiling")]
    assert fs.summarise([75, 1000], {75: two}) == rows  # batch 1000: nothing measured


def test_plan_config_and_run_ids():
    assert bench_frameworks.plan(0)[0] == ("horovod-tf", 1)
    assert bench_frameworks.plan(1) == bench_frameworks.plan(0)[::-1]
    assert {a for a, _ in bench_frameworks.plan(0)} == {"horovod-tf", "torch-ddp", "independent"}
    a = SimpleNamespace(samples=40000, epochs=8, repeats=3)
    assert bench_frameworks.bench_config(a, 75, False)["training"]["steps_per_execution"] == 30
    cfg = bench_frameworks.bench_config(a, 1000, False)
    assert cfg["training"]["steps_per_execution"] == 2 and cfg["training"]["instrument_every"] == 10
    assert cfg["scaling"]["sweeps"][0]["backends"] == ["gloo"]
    assert cfg["scaling"]["sweeps"][0]["repeats"] == 3
    rid = bench_frameworks.run_id
    assert (
        rid("torch-ddp", 2, 75, "linear", 1, True) == "local_torch-ddp_gloo_n1_w2_b75_lrlinear_r1"
    )
    assert rid("torch-ddp", 2, 75, "linear", 1, False) == rid(
        "horovod-tf", 2, 75, "linear", 1, True
    )


def fake_measured(foreign_busy_s: float):
    """Measured with a quiet machine and a CPU meter: the system used ``foreign_busy_s``
    more CPU seconds than the arm over 10 s."""

    def make(what):
        t = {"total": iter([(100.0, 1.0), (110.0 + foreign_busy_s, 1.0)])}
        own, clock = iter([5.0, 15.0]), iter([0.0, 10.0])
        meter = _quiet.CpuMeter(total=lambda: next(t["total"]), own=lambda: next(own),
                                clock=lambda: next(clock), sample_tree=False)  # fmt: skip
        guard = _quiet.QuietGuard(max_load=0.5, timeout_s=1, load=lambda: 0.1)
        return _results.Measured(what, guard=guard, meter=meter)

    return make


@pytest.mark.parametrize("busy,valid", [(0.0, True), (5.0, False)])
def test_a_run_beside_foreign_work_is_recorded_invalid_and_left_out(monkeypatch, busy, valid):
    monkeypatch.setattr(bench_frameworks, "Measured", fake_measured(busy))
    bench = SimpleNamespace(run=lambda *a: fs.arm_result(record()))
    rows: list = []
    r = bench_frameworks.measure(bench, "torch-ddp", 2, 75, 0, rows)
    assert rows[0]["valid"] == ("true" if valid else "false")
    assert (r is not None) == valid  # an invalid run never reaches the summary
    if valid:
        assert r["fields"]["foreign_cpu"] == 0.0 and r["epoch_s"] == 3.0
    else:
        assert rows[0]["foreign_cpu"] == 0.5 and "foreign_cpu" in rows[0]["invalid_reason"]


def test_the_docs_blocks_show_valid_figures_only(tmp_path):
    """benchmarks/perfdocs.py's frameworks blocks: a valid summary figure, a censored
    time to target as '> budget', no figure of an invalid run."""
    import shutil
    import subprocess

    res = tmp_path / "results"
    shutil.copytree(ROOT / "benchmarks" / "results", res)
    page = tmp_path / "performance.md"
    shutil.copy(ROOT / "docs" / "performance.md", page)
    _results.write_csv("frameworks", fs.summarise([75], results(1)), res / "frameworks.csv")
    bad = {**GOOD, "foreign_cpu": 0.4, "valid": "false", "invalid_reason": "foreign_cpu 0.4"}
    runs = [fs.run_row(0, 75, "torch-ddp", 2, {**fs.arm_result(record(reached=False))}, GOOD, 9),
            fs.run_row(1, 75, "torch-ddp", 2, {**fs.arm_result(record()), "epoch_s": 7.777},
                       bad, 9)]  # fmt: skip
    _results.write_csv("frameworks_runs", runs, res / "frameworks_runs.csv")
    gen = [sys.executable, "-m", "perfdocs"]  # from benchmarks/, as make perf-docs runs it
    r = subprocess.run(
        [*gen, "--page", page, "--results", res], capture_output=True, text=True, cwd=BENCH
    )
    assert r.returncode == 0, r.stderr
    text = page.read_text()
    assert "| 75 | sync_exposed_s | torch-ddp | 2 | **0.001** | 0.001-0.001 | 3 |" in text
    assert "| 0 | 75 | torch-ddp | 2 | 3.000 | 150 | > budget | ok |" in text
    assert "7.777" not in text and "| 1 | 75 | torch-ddp | 2 | invalid | invalid |" in text


def test_an_impossible_ceiling_fails_the_benchmark_as_bench_scaling():
    R = results()[75]
    for rep in R[(fs.INDEPENDENT, 2)]:
        R[(fs.INDEPENDENT, 2)][rep] = {"throughput": 230, "fields": GOOD}  # 1.15 x 2 x 100
    rows = fs.summarise([75], {75: R})
    with pytest.raises(bench_frameworks.CeilingError, match="independent ceiling above"):
        bench_frameworks.check_ceiling(rows)
    bench_frameworks.check_ceiling(fs.summarise([75], results()))  # 0.95: fine
    assert bench_frameworks.parse_args(["--quick"]).no_ceiling_check


def test_settings_pair_both_frameworks_and_share_the_ceiling(tmp_path):
    """Issue 32: with several COMPILE/PRECISION settings every framework runs at every
    setting in the same paired order, the independent arm once (under the first), and each
    setting's summary has the ceiling and its own torch/Horovod ratio."""
    steps = bench_frameworks.plan(0, ["off/fp32", "default/bf16"])
    assert len(steps) == 9 and steps.count(("off/fp32", "independent", 2)) == 1
    assert {s for s, *_ in steps} == {"off/fp32", "default/bf16"}
    assert bench_frameworks.plan(1, ["off/fp32", "default/bf16"]) == steps[::-1]
    a = SimpleNamespace(samples=40000, epochs=8, repeats=3)
    cfg = bench_frameworks.bench_config(a, 75, True, "default/bf16")
    assert (cfg["training"]["compile"], cfg["training"]["precision"]) == ("default", "bf16")
    with pytest.raises(SystemExit):
        bench_frameworks.parse_setting("max/fp16")  # no fp16 on a CPU
    a = bench_frameworks.parse_args(["--settings", "off/fp32,default/bf16",
                                     "--out-dir", str(tmp_path)])  # fmt: skip
    R = results()[75]
    best = {k: v for k, v in R.items() if k[0] != "independent"}  # measured under the first
    summary = bench_frameworks.save(a, {"off/fp32": {75: R}, "default/bf16": {75: best}}, [])
    for s in ("off/fp32", "default/bf16"):
        mine = [r for r in summary if r["setting"] == s]
        assert any(r["metric"] == "ceiling" for r in mine), s
        assert any(r["metric"] == "ratio_epoch_torch_vs_horovod" for r in mine), s
    rows = list(csv.DictReader((tmp_path / "frameworks.csv").open()))
    assert {r["setting"] for r in rows} == {"off/fp32", "default/bf16"}


def test_every_setting_gets_the_machines_ceiling_and_a_runs_csv_resummarises(tmp_path):
    """The ceiling is thr(independent) / (2 x thr(the independent arm's own step: Horovod-TF
    at the first setting, 1 worker)) in every setting, not over a slower setting's
    Horovod-TF; ``--resummarise`` rebuilds the same summary from the runs CSV."""
    a = bench_frameworks.parse_args(["--settings", "off/fp32,default/bf16",
                                     "--out-dir", str(tmp_path)])  # fmt: skip
    R = results()[75]
    slow = {k: {rep: {**x, "throughput": x["throughput"] / 2} for rep, x in v.items()}
            for k, v in R.items() if k[0] != "independent"}  # fmt: skip
    summary = bench_frameworks.save(a, {"off/fp32": {75: R}, "default/bf16": {75: slow}}, [])
    ceilings = {r["setting"]: r["median"] for r in summary if r["metric"] == "ceiling"}
    assert ceilings["default/bf16"] == pytest.approx(ceilings["off/fp32"]) == 0.95
    assert not [r for r in summary if r["arm"] == "ceiling-base"]
    rows = []
    for setting, res in (("off/fp32", R), ("default/bf16", slow)):
        for (arm, w), reps in res.items():
            for rep, x in reps.items():
                rows.append({"setting": setting, **fs.run_row(rep, 75, arm, w, x, GOOD, 1.0)})
    _results.write_csv("frameworks_runs", rows, tmp_path / "runs.csv")
    out = tmp_path / "again"
    b = bench_frameworks.parse_args(["--resummarise", str(tmp_path / "runs.csv"),
                                     "--out-dir", str(out)])  # fmt: skip
    assert bench_frameworks.main(["--resummarise", str(tmp_path / "runs.csv"),
                                  "--out-dir", str(out)]) == 0  # fmt: skip
    assert b.resummarise
    again = list(csv.DictReader((out / "frameworks.csv").open()))
    first = list(csv.DictReader((tmp_path / "frameworks.csv").open()))
    key = lambda r: (r["setting"], r["metric"], r["arm"], r["workers"])  # noqa: E731
    assert {key(r): float(r["median"]) for r in again} == pytest.approx(
        {key(r): float(r["median"]) for r in first}, rel=1e-5
    )


def test_a_setting_names_the_mkl_path_and_add_keeps_the_other_settings_rows(tmp_path):
    """``off/fp32/intel`` runs torch-ddp with training.mkl_code_path intel (run ids as
    off/fp32's); ``--add`` replaces only the measured settings' rows and keeps the
    others' as they were written (their commit stays theirs)."""
    a = SimpleNamespace(samples=40000, epochs=8, repeats=3)
    cfg = bench_frameworks.bench_config(a, 75, True, "off/fp32/intel")
    assert cfg["training"]["mkl_code_path"] == "intel"
    assert (
        bench_frameworks.bench_config(a, 75, True, "off/fp32")["training"]["mkl_code_path"]
        == "vendor"
    )
    rid = bench_frameworks.run_id("torch-ddp", 2, 75, "linear", 1, True, "off/bf16/intel")
    assert rid == "local_torch-ddp_gloo_n1_w2_b75_lrlinear_bf16_r1"
    with pytest.raises(SystemExit, match="vendor \\(default\\) or intel"):
        bench_frameworks.parse_setting("off/fp32/amd")
    R = results()[75]
    first = bench_frameworks.parse_args(["--settings", "off/fp32,default/bf16",
                                         "--out-dir", str(tmp_path)])  # fmt: skip
    bench_frameworks.save(first, {"off/fp32": {75: R}, "default/bf16": {75: R}}, [])
    old = list(csv.DictReader((tmp_path / "frameworks.csv").open()))
    bf16_before = [r for r in old if r["setting"] == "default/bf16"]
    for r in bf16_before:
        assert r["commit"]
    with_add = bench_frameworks.parse_args(["--settings", "off/fp32,off/fp32/intel", "--add",
                                            "--out-dir", str(tmp_path)])  # fmt: skip
    bench_frameworks.save(with_add, {"off/fp32": {75: R}, "off/fp32/intel": {75: R}}, [])
    rows = list(csv.DictReader((tmp_path / "frameworks.csv").open()))
    assert {r["setting"] for r in rows} == {"off/fp32", "default/bf16", "off/fp32/intel"}
    assert [r for r in rows if r["setting"] == "default/bf16"] == bf16_before
    assert len([r for r in rows if r["setting"] == "off/fp32"]) == len(
        [r for r in old if r["setting"] == "off/fp32"]
    )  # replaced, not doubled
