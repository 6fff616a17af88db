"""docs/performance.md and docs/performance-history.md are generated from
benchmarks/results/*.csv: the pages and the CSVs agree, every CSV carries its provenance,
and no figure is typed by hand outside the generated blocks. Quick: no benchmark runs, no
timing."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))  # the generator is benchmarks/perfdocs (python -m perfdocs)
PAGE = ROOT / "docs" / "performance.md"
HISTORY = ROOT / "docs" / "performance-history.md"
RESULTS = BENCH / "results"
PROVENANCE = ["commit", "machine", "date", "load", "load_before", "load_after"]


def run_gen(*args):
    """``python -m perfdocs`` from benchmarks/, as ``make perf-docs`` runs it."""
    return subprocess.run(
        [sys.executable, "-m", "perfdocs", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=BENCH,
    )


def test_page_agrees_with_the_committed_csvs():
    r = run_gen("--check")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr


def test_every_result_csv_has_provenance_columns():
    csvs = sorted(RESULTS.glob("*.csv"))
    assert csvs, "no benchmark results committed under benchmarks/results/"
    for p in csvs:
        with open(p, newline="") as fh:
            rows = list(csv.DictReader(fh))
        assert rows, f"{p.name}: no rows"
        missing = [c for c in PROVENANCE if c not in rows[0]]
        assert not missing, f"{p.name}: provenance columns missing: {missing}"
        for r in rows:
            assert r["commit"] and r["machine"] and r["date"], f"{p.name}: empty provenance"
            float(r["load_before"]), float(r["load_after"])


@pytest.fixture
def copy(tmp_path):
    """Copies of the results and of both pages; ``--docs page.parent`` renders them."""
    res = tmp_path / "results"
    shutil.copytree(RESULTS, res)
    page = tmp_path / "docs" / "performance.md"
    page.parent.mkdir()
    shutil.copy(PAGE, page)
    shutil.copy(HISTORY, page.parent / HISTORY.name)
    return page, res


def rewrite(p: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(p, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def test_check_fails_when_a_csv_figure_changes(copy):
    page, res = copy
    p = res / "bench_scaling.csv"  # a benchmark's output (not tracked: written here)
    ok = {"foreign_cpu": "0.01", "irq_cpu": "0.0", "valid": "true", "invalid_reason": ""}
    rows = [
        scaling_row("efficiency_vs_ceiling", "hvdscale", 2, "0.9137", **ok),
        scaling_row("ratio_hvdscale_vs_mwms", "hvdscale", 2, "1.0242", **ok),
    ]
    rewrite(p, rows)
    assert run_gen("--check", "--docs", page.parent, "--results", res).returncode == 1
    assert run_gen("--docs", page.parent, "--results", res).returncode == 0
    rows[0]["median"] = str(float(rows[0]["median"]) * 1.5 + 1)
    rewrite(p, rows)
    r = run_gen("--check", "--docs", page.parent, "--results", res)
    assert r.returncode == 1
    assert "make perf-docs" in r.stderr
    # regenerating makes it agree again
    assert run_gen("--docs", page.parent, "--results", res).returncode == 0
    assert run_gen("--check", "--docs", page.parent, "--results", res).returncode == 0


def scaling_row(metric, arm, workers, median, **quality):
    row = {"commit": "abc", "machine": "m", "date": "2026-11-24T00:00:00Z", "load": "0.3"}
    row.update({"load_before": "0.31", "load_after": "1.9", "batch": "75", "metric": metric})
    row.update({"arm": arm, "workers": str(workers), "median": median, "ci_low": "", "n": "3"})
    row.update({"ci_high": "", "note": ""})
    return {**row, **quality}


def test_no_figure_of_an_invalid_or_old_row_reaches_the_page(copy, tmp_path):
    page, _ = copy
    res = tmp_path / "only"
    res.mkdir()
    ok = {"foreign_cpu": "0.02", "irq_cpu": "0.0", "valid": "true", "invalid_reason": ""}
    busy = {"foreign_cpu": "0.35", "valid": "false", "invalid_reason": "foreign_cpu 0.35 > 0.1"}
    rewrite(
        res / "bench_scaling.csv",
        [
            scaling_row("efficiency_vs_ceiling", "hvdscale", 2, "0.9137", **ok),
            scaling_row("ratio_hvdscale_vs_mwms", "hvdscale", 2, "1.4242", **busy),
            scaling_row("ratio_hvdscale_vs_keras", "hvdscale", 1, "0.6161"),  # old: no foreign
        ],
    )
    assert run_gen("--docs", page.parent, "--results", res).returncode == 0
    text = page.read_text()
    assert "0.91" in text and "1.42" not in text and "0.62" not in text
    targets = re.search(r"perf:begin targets -->\n(.*?)<!--", text, re.S).group(1)
    assert "| 0.91 | met (median only; no interval, n < 3) |" in targets
    assert "no valid measurement (foreign CPU 0.35 > 0.1)" in targets
    assert "no valid measurement (no foreign_cpu (old row))" in targets
    summary = re.search(r"perf:begin scaling-summary -->\n(.*?)<!--", text, re.S).group(1)
    # the load and the foreign CPU of every row are on the page, valid or not
    assert summary.count("| 0.31 |") == 3 and "| 0.35 |" in summary and "not recorded" in summary


def test_check_fails_when_the_page_is_edited_by_hand(copy):
    page, res = copy
    text = page.read_text()
    # a block whose CSV is tracked (frameworks_runs.csv), so it holds a table
    m = re.search(r"<!-- perf:begin frameworks-runs -->\n(.*?)<!-- perf:end", text, re.S)
    assert m and "|" in m.group(1), "the frameworks-runs block has no table"
    edited = text.replace(m.group(1), m.group(1).replace("|", "| 0.99 ", 1), 1)
    page.write_text(edited)
    assert run_gen("--check", "--docs", page.parent, "--results", res).returncode == 1


def test_check_fails_when_the_history_page_is_edited_by_hand(copy):
    page, res = copy
    history = page.parent / HISTORY.name
    text = history.read_text()
    m = re.search(r"<!-- perf:begin sync-breakdown -->\n(.*?)<!-- perf:end", text, re.S)
    assert m and m.group(1).strip(), "the sync-breakdown block is empty"
    history.write_text(text.replace(m.group(1), m.group(1).replace("|", "| 0.99 ", 1), 1))
    r = run_gen("--check", "--docs", page.parent, "--results", res)
    assert r.returncode == 1 and HISTORY.name in r.stderr and "make perf-docs" in r.stderr
    assert run_gen("--docs", page.parent, "--results", res).returncode == 0
    assert history.read_text() == text


def test_every_block_is_on_its_one_page():
    """Each generated block belongs to exactly one page and the pages hold just their own
    blocks: a block moved to the other page stops the generator."""
    from perfdocs import generate as g

    names = [n for blocks in g.PAGES.values() for n in blocks]
    assert sorted(names) == sorted(g.BLOCKS) and len(names) == len(set(names))
    for path in (PAGE, HISTORY):
        found = re.findall(r"<!-- perf:begin ([a-z0-9_-]+) -->", path.read_text())
        assert sorted(found) == sorted(g.PAGES[path.name]), path.name
    text = PAGE.read_text()  # the page leads with the targets
    assert text.index("perf:begin targets") < min(
        text.index(f"perf:begin {n}") for n in g.PAGES["performance.md"] if n != "targets"
    )
    block = "<!-- perf:begin data-phase -->\n<!-- perf:end data-phase -->\n"
    with pytest.raises(SystemExit, match="belongs to performance-history.md"):
        g.render(text + block, RESULTS, "performance.md")


def test_a_missing_csv_is_said_not_invented(copy):
    page, res = copy
    (res / "bench_slurm_overhead.csv").unlink(missing_ok=True)
    run_gen("--docs", page.parent, "--results", res)
    assert "Not measured in this revision (no `benchmarks/results/bench_slurm_overhead.csv`)" in (
        page.read_text()
    )


def test_a_missing_csv_of_a_removed_benchmark_says_where_it_went(copy):
    page, res = copy
    (res / "bench_data_phase.csv").unlink(missing_ok=True)  # not tracked: absent in a clone
    assert run_gen("--docs", page.parent, "--results", res).returncode == 0
    text = (page.parent / HISTORY.name).read_text()
    assert "No `benchmarks/results/bench_data_phase.csv` in this revision" in text
    assert "`git log -- benchmarks/bench_data_phase.py`" in text


@pytest.mark.parametrize("path", [PAGE, HISTORY], ids=lambda p: p.name)
def test_no_hand_typed_figures_outside_the_generated_blocks(path):
    text = path.read_text().replace("95 %", "")  # the confidence level, not a measurement
    text = re.sub(r"<!-- perf:begin .*?<!-- perf:end [a-z0-9_-]+ -->", "", text, flags=re.S)
    figures = re.findall(
        r"\d+\.\d+|\d[\d,]* ?%|\d+(?:\.\d+)? ?x\b|\d[\d,]* ?samples/s|\d+ ?ms\b", text
    )
    assert not figures, f"hand-typed figures outside generated blocks: {figures}"


def test_the_frameworks_reading_comes_from_valid_rows_only():
    from perfdocs import frameworks as pf

    def row(metric, arm, workers, median, valid="true"):
        return {"batch": "75", "metric": metric, "arm": arm, "workers": str(workers),
                "median": str(median), "valid": valid, "load_before": "0.1",
                "foreign_cpu": "0.0"}  # fmt: skip

    rows = [
        row("ratio_epoch_torch_vs_horovod", "torch-ddp", 1, 2.5),
        row("ratio_epoch_torch_vs_horovod", "torch-ddp", 2, 0.8),
        row("speedup_epoch", "horovod-tf", 2, 0.3),
        row("speedup_epoch", "torch-ddp", 2, 0.7),
        row("sync_allreduce_s", "horovod-tf", 2, 0.004),
        row("sync_allreduce_s", "torch-ddp", 2, 0.003),
        row("sync_exposed_s", "torch-ddp", 2, 0.0015),
    ]
    text = pf._reading(rows)
    assert "2.50x" in text and "0.70 for DDP against 0.30" in text and "hides 50 %" in text
    rows[-1]["valid"] = "false"  # an invalid row gives no sentence
    assert pf._reading(rows) == ""


def test_the_efficiency_bound_from_the_paired_runs_and_the_bare_allreduce():
    """The bound of docs/performance.md's allreduce section: two independent 1-worker
    runs at once make 150,000 samples/s at batch 75 -> 1000 us per shared step, 250 us
    of allreduce -> bound 0.80; a measured efficiency of 0.7 means a 2-worker step of
    1429 us, 179 us of it beyond the shared step and the allreduce. The step alone comes
    from the same paired runs (100,000 samples/s -> 750 us); an invalid row gives no
    bound."""
    from perfdocs.bound import bound_figures

    ok = {"foreign_cpu": "0.01", "load_before": "0.3", "batch": "75"}
    mpi = dict(ok, row="summary", arm="mpi", controller="mpi", settings="defaults")
    allreduce = [dict(mpi, median_us="250")]
    thr = dict(ok, metric="throughput")
    scaling = [
        dict(thr, arm="hvdscale", workers="1", median="100000"),
        dict(thr, arm="hvdscale", workers="2", median="105000"),
        dict(thr, arm="independent", workers="2", median="150000"),
        dict(ok, metric="efficiency_vs_ceiling", arm="hvdscale", workers="2", median="0.7"),
        dict(ok, batch="1000", metric="throughput", arm="independent", workers="2", median="1"),
    ]
    x = bound_figures(allreduce, scaling)
    assert x["t_step_us"] == pytest.approx(750) and x["t_shared_us"] == pytest.approx(1000)
    assert x["bound"] == pytest.approx(0.8) and x["measured"] == pytest.approx(0.7)
    assert x["t_two_us"] == pytest.approx(1000 / 0.7)
    assert x["t_other_us"] == pytest.approx(1000 / 0.7 - 1250)
    assert x["needed_us"] == pytest.approx(1000 / 9)
    assert x["explained"] == pytest.approx(0.2 / 0.3)
    bad = [dict(allreduce[0], foreign_cpu="0.5")]
    assert bound_figures(bad, scaling) is None
    invalid_indep = [
        dict(r, valid="false") if r.get("arm") == "independent" else r for r in scaling
    ]
    assert bound_figures(allreduce, invalid_indep) is None
    # the step alone is shown when measured; the bound does not need it
    no_alone = [r for r in scaling if r.get("workers") != "1"]
    assert bound_figures(allreduce, no_alone)["t_step_us"] is None
    assert bound_figures(allreduce, no_alone)["bound"] == pytest.approx(0.8)
    # with the tf call reference: a step pays the allreduce's part of a call, not the call
    call = dict(ok, row="summary", arm="tf call", settings="x", median_us="150")
    y = bound_figures([dict(allreduce[0], median_us="400"), call], scaling)
    assert y["t_call_us"] == 150 and y["t_sync_us"] == pytest.approx(250)
    assert y["bound"] == pytest.approx(0.8)
    invalid_call = dict(call, foreign_cpu="0.5")  # an invalid reference is not subtracted
    z = bound_figures([allreduce[0], invalid_call], scaling)
    assert z["t_sync_us"] == pytest.approx(250) and z["t_call_us"] is None
    # MPI at its fastest valid setting: a slower default arm does not lower the bound
    slow = dict(mpi, median_us="600")
    fast = dict(mpi, arm="mpi cycle1", median_us="250")
    w = bound_figures([slow, fast, dict(fast, arm="x", median_us="1", valid="false")], scaling)
    assert w["sync_arm"] == "mpi cycle1" and w["t_sync_us"] == pytest.approx(250)


def test_the_phase_split_places_the_rest_of_the_gap():
    """bench_cycle_time's rows at the cycle times auto picks: compute per step 600 us
    alone and 630 us at 2 workers (1.05x), sync 700 us at 2 workers against 100 us of
    bare allreduce (7x); the rows of other cycle times and invalid rows are not used."""
    from perfdocs.bound import split_figures

    x = {"t_shared_us": 1000.0, "t_sync_us": 100.0, "t_two_us": 1000 / 0.7}
    ok = {"foreign_cpu": "0.01", "load_before": "0.3", "batch": "75", "row": "summary"}
    cycle = [
        dict(ok, workers="1", cycle_ms="0.01", auto="", compute_us_step="900"),
        dict(ok, workers="1", cycle_ms="1", auto="yes", compute_us_step="600", sync_us_step="3"),
        dict(
            ok, workers="2", cycle_ms="0.01", auto="yes", compute_us_step="630", sync_us_step="700"
        ),
        dict(ok, workers="2", cycle_ms="1", auto="", compute_us_step="650", sync_us_step="1400"),
    ]
    p = split_figures(x, cycle)
    assert (p["cycle_alone_ms"], p["cycle_two_ms"]) == ("1", "0.01")
    assert (p["compute_alone_us"], p["compute_two_us"], p["sync_two_us"]) == (600, 630, 700)
    assert p["compute_ratio"] == pytest.approx(1.05) and p["sync_vs_bare"] == pytest.approx(7)
    # the 2-worker row at auto's cycle is invalid: no split
    bad = [*cycle[:2], dict(cycle[2], foreign_cpu="0.5"), cycle[3]]
    assert split_figures(x, bad) is None
    # rows from before the phase split was recorded: none
    old = [{k: v for k, v in r.items() if not k.endswith("_us_step")} for r in cycle]
    assert split_figures(x, old) is None


def test_the_allreduce_reading_comes_from_valid_rows_only():
    from perfdocs import generate as g

    def row(arm, us, valid="true", controller="gloo"):
        return {"row": "summary", "arm": arm, "median_us": str(us), "valid": valid,
                "controller": controller, "load_before": "0.1", "foreign_cpu": "0.0"}  # fmt: skip

    rows = [row("mpi", 300, controller="mpi"), row("gloo", 4200), row("torch gloo", 2100)]
    text = g.allreduce_reading(rows)
    assert "takes 2100 us (7.00x MPI), Horovod's Gloo 4200 us (14.00x MPI, 2.0x torch's)" in text
    assert "most of Horovod's Gloo time is Horovod's own Gloo path" in text  # 2x torch's
    rows[2]["median_us"] = "3000"  # Horovod's Gloo close to the library's: the library
    text = g.allreduce_reading(rows)
    assert "Gloo itself (TCP, here the loopback) is most of the cost" in text
    assert "MPI with the defaults" not in text  # the default arm is the fastest MPI arm
    rows[2]["median_us"] = "600"  # the library within 2x of MPI: Horovod's path is the cost
    text = g.allreduce_reading(rows)
    assert "(2.00x MPI)" in text and "the rest is Horovod's Gloo path" in text
    # a faster MPI setting is the reference, and the slower default arm is explained
    rows.append(row("mpi cycle1", 200, controller="mpi"))
    text = g.allreduce_reading(rows)
    assert "(`mpi cycle1`, 200 us)" in text and "takes 600 us (3.00x MPI)" in text
    assert "MPI with the defaults takes 300 us" in text
    rows[-1]["valid"] = "false"  # an invalid arm is never the reference
    assert "takes 600 us (2.00x MPI)" in g.allreduce_reading(rows)
    rows[1]["median_us"] = "500"
    assert "Horovod's Gloo is within 2x of MPI." in g.allreduce_reading(rows)
    # the arm without hvdscale.native's library: how much the library takes off
    rows.append(row("gloo spin", 4000))
    text = g.allreduce_reading(rows)
    assert "Without hvdscale.native's library (`gloo spin`) Horovod's Gloo takes 4000 us" in text
    assert "8.0x as long (13.33x MPI" in text
    rows.append(row("torch gloo spin", 1800))
    assert "without the library (`torch gloo spin`) it takes 1800 us, 3.0x as long" in (
        g.allreduce_reading(rows)
    )
    rows[-1]["valid"] = rows[-2]["valid"] = "false"
    assert "gloo spin" not in g.allreduce_reading(rows)
    rows[2]["valid"] = "false"  # an invalid row gives no sentence
    assert g.allreduce_reading(rows) == ""
    assert g.allreduce_reading(rows[:2]) == ""


def test_the_sync_breakdown_reading_comes_from_valid_timeline_runs():
    """Shares of the sync phase as medians over the valid timeline runs: 400 of 800 us
    outside the timeline and 120 of 800 us negotiation in both runs, the MPI op 160 and
    320 us (20 % and 40 %, median 30 %); an invalid run and the controls are left out."""
    from perfdocs.sync import sync_reading

    ok = {"foreign_cpu": "0.01", "load_before": "0.3", "row": "run", "timeline": "1"}
    step = {"sync_us": "800", "outside_timeline_us": "400", "negotiate_us": "120"}
    rows = [
        dict(ok, **step, mpi_allreduce_us="160"),
        dict(ok, **step, mpi_allreduce_us="320"),
        dict(ok, **step, mpi_allreduce_us="9999", foreign_cpu="0.5"),  # invalid
        dict(ok, timeline="0", sync_us=""),  # a control run: no split
    ]
    text = sync_reading(rows)
    assert text.startswith("Over the 2 valid timeline runs")
    assert "50 % of the sync phase lies outside" in text and "15 % is negotiation" in text
    assert "30 % the MPI op itself" in text and "160 to 320 us per step" in text
    assert sync_reading([rows[2], rows[3]]) == ""


def write_rows(path: Path, rows: list[dict]) -> None:
    """A benchmark CSV of ``rows`` (the first row's keys are the columns)."""
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_the_gpu_blocks_use_valid_completed_runs_only(tmp_path):
    """perfdocs.gpu (issue 33): the 75 -> 1000 reading is the median epoch ratio of valid,
    completed eager fp32 runs; an invalid or failed run shows no figure; a variant's
    speedup is against eager fp32's median at the same batch."""
    from perfdocs import gpu

    def row(variant, batch, epoch, steps, fc="0.01", status="completed", rep="0"):
        return {"commit": "abc", "machine": "m, GPU X", "date": "d", "load_before": "0.2",
                "foreign_cpu": fc, "valid": "true", "variant": variant, "repeat": rep,
                "compile_mode": "reduce-overhead" if variant.startswith("max") else "",
                "batch": str(batch), "epoch_s": str(epoch), "steps_per_epoch": str(steps),
                "status": status, "throughput": "1", "final_val_loss": "0.01",
                "warm_up_s": "0", "error": "" if status == "completed" else "boom"}  # fmt: skip

    rows = [row("off/fp32", 75, 0.30, 150), row("off/fp32", 75, 0.50, 150, rep="1"),
            row("off/fp32", 1000, 0.04, 10), row("off/fp32", 1000, 9.0, 10, fc="0.5", rep="1"),
            row("max/fp32", 75, 0.20, 150),
            row("max/fp32", 1000, 0.0, 10, status="failed")]  # fmt: skip
    write_rows(tmp_path / "gpu_batch_sweep.csv", rows)
    text = gpu.block_gpu_batch_sweep(tmp_path)
    assert "takes 10.0x as long as at batch 1000" in text  # median(0.3, 0.5) / 0.04
    assert "(medians of 2 and 1 runs" in text and "15.0x as many steps" in text
    assert "9.0000" not in text and "| invalid |" in text  # the foreign-CPU row
    text = gpu.block_gpu_variants(tmp_path)
    line = next(x for x in text.splitlines() if x.startswith("| 75 | max/fp32"))
    assert "| 2.00 |" in line and "reduce-overhead" in line  # 0.4 / 0.2
    line = next(x for x in text.splitlines() if x.startswith("| 1000 | max/fp32"))
    assert "invalid (boom)" in line and "no valid run" in line
    assert "not measured" in gpu.block_gpu_step_profile(tmp_path).lower()


def test_the_torch_vs_horovod_target_takes_each_framework_at_its_best_setting():
    """Issue 32's target row: per batch and precision, torch-ddp's fastest valid 1-worker
    setting over Horovod-TF's fastest; an invalid best row gives no verdict."""
    from perfdocs.frameworks import best_ratio_rows

    def row(setting, arm, median, workers="1", valid="true"):
        return {"setting": setting, "batch": "75", "metric": "epoch_s", "arm": arm,
                "workers": workers, "median": str(median), "valid": valid,
                "load_before": "0.1", "foreign_cpu": "0.0"}  # fmt: skip

    rows = [row("off/fp32", "torch-ddp", 6.0), row("default/fp32", "torch-ddp", 4.0),
            row("off/fp32", "horovod-tf", 3.0), row("default/fp32", "horovod-tf", 3.5),
            row("default/bf16", "torch-ddp", 2.0), row("default/bf16", "horovod-tf", 2.5),
            row("off/fp32", "torch-ddp", 1.0, workers="2")]  # fmt: skip
    got = {text: r["ratio"] for text, r in best_ratio_rows(rows)}
    assert got == {
        "torch-ddp epoch <= 1.2x Horovod-TF's, 1 worker, batch 75, best fp32 settings "
        "(default/fp32 vs off/fp32)": pytest.approx(4.0 / 3.0),
        "torch-ddp epoch <= 1.2x Horovod-TF's, 1 worker, batch 75, best bf16 settings "
        "(default/bf16 vs default/bf16)": pytest.approx(0.8),
    }
    rows[1]["valid"] = "false"  # torch's best fp32 row invalid: the next valid one counts
    fp32 = next(r for t, r in best_ratio_rows(rows) if "fp32" in t)
    assert fp32["ratio"] == pytest.approx(2.0)


def test_the_torch_overhead_block_reads_valid_rows_only(tmp_path):
    """perfdocs.frameworks (issue 32): the reading's share and bound come from valid rows;
    an invalid row shows no figure."""
    from perfdocs import frameworks

    def row(variant, batch, prof, aten, fc="0.01"):
        return {"commit": "abc", "machine": "m", "date": "d", "load_before": "0.2",
                "foreign_cpu": fc, "valid": "true", "variant": variant, "batch": str(batch),
                "wall_us": str(prof * 0.9), "prof_wall_us": str(prof), "aten_us": str(aten),
                "outside_us": str(prof - aten), "outside_share": str((prof - aten) / prof),
                "outside_plain_us": str(prof * 0.9 - aten), "bound_speedup": str(prof / aten),
                "part": "data", "host_us": "10"}  # fmt: skip

    rows = [row("off/fp32", 75, 1000, 800), row("off/fp32", 1000, 4000, 3800),
            row("off/bf16", 75, 9999, 1111, fc="0.5")]  # fmt: skip
    write_rows(tmp_path / "torch_step_overhead.csv", rows)
    text = frameworks.block_torch_step_overhead(tmp_path)
    assert "5% (off/fp32, batch 1000) to 20% (off/fp32, batch 75)" in text
    assert "at most 1.05-1.25x faster" in text
    assert "9999" not in text and "| invalid |" in text
    assert "not measured" in frameworks.block_torch_step_overhead(tmp_path / "none").lower()
