"""docs/performance.md is generated from benchmarks/results/*.csv (benchmarks/perfdocs.py):
the page and the CSVs agree, every CSV carries its provenance, no figure of an invalid row
reaches the page, and no figure is typed by hand outside the generated blocks. Quick: no
benchmark runs, no timing."""

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
PAGE = ROOT / "docs" / "performance.md"
RESULTS = BENCH / "results"
PROVENANCE = ["commit", "machine", "date", "load", "load_before", "load_after"]


def run_gen(*args):
    """``python -m perfdocs`` from benchmarks/, as ``make perf-docs`` runs it."""
    cmd = [sys.executable, "-m", "perfdocs", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=BENCH)


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
    """A copy of the page and of the results: ``--page P --results R`` renders them."""
    res = tmp_path / "results"
    shutil.copytree(RESULTS, res)
    page = tmp_path / "performance.md"
    shutil.copy(PAGE, page)
    return page, res


def rewrite(p: Path, rows: list[dict]) -> None:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(p, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def scaling_row(metric, arm, workers, median, **quality):
    row = {"commit": "abc", "machine": "vm: X, 2 cores", "date": "2026-11-24T00:00:00Z"}
    row.update({"load": "0.3", "load_before": "0.31", "load_after": "1.9", "batch": "75"})
    row.update({"metric": metric, "arm": arm, "workers": str(workers), "median": median})
    row.update({"ci_low": "", "ci_high": "", "n": "3", "note": ""})
    return {**row, **quality}


OK = {"foreign_cpu": "0.02", "irq_cpu": "0.0", "valid": "true", "invalid_reason": ""}


def test_check_fails_when_a_csv_figure_changes(copy):
    page, res = copy
    rows = [
        scaling_row("efficiency_vs_ceiling", "hvdscale", 2, "0.9137", **OK),
        scaling_row("ratio_hvdscale_vs_mwms", "hvdscale", 2, "1.0242", **OK),
    ]
    rewrite(res / "bench_scaling.csv", rows)
    args = ("--page", page, "--results", res)
    assert run_gen("--check", *args).returncode == 1
    assert run_gen(*args).returncode == 0
    assert run_gen("--check", *args).returncode == 0
    rows[0]["median"] = "0.7771"
    rewrite(res / "bench_scaling.csv", rows)
    r = run_gen("--check", *args)
    assert r.returncode == 1 and "make perf-docs" in r.stderr and "0.7771" in r.stdout
    assert run_gen(*args).returncode == 0
    assert "**0.7771**" in page.read_text()


def test_no_figure_of_an_invalid_or_old_row_reaches_the_page(copy):
    page, res = copy
    busy = {"foreign_cpu": "0.35", "valid": "true", "invalid_reason": ""}
    rewrite(
        res / "bench_scaling.csv",
        [
            scaling_row("efficiency_vs_ceiling", "hvdscale", 2, "0.9137", **OK),
            scaling_row("ratio_hvdscale_vs_mwms", "hvdscale", 2, "1.4242", **busy),
            scaling_row("ratio_hvdscale_vs_keras", "hvdscale", 1, "0.6161"),  # no foreign
        ],
    )
    assert run_gen("--page", page, "--results", res).returncode == 0
    text = page.read_text()
    scaling = "".join(re.findall(r"perf:begin scaling-\w+ -->\n(.*?)<!--", text, re.S))
    assert "0.9137" in scaling and "1.424" not in scaling and "0.616" not in scaling
    assert "**no**: foreign_cpu 0.35 > 0.1 (0.05 per core, 2 cores)" in text
    assert "**no**: no foreign_cpu recorded" in text
    targets = re.search(r"perf:begin targets -->\n(.*?)<!--", text, re.S).group(1)
    line = next(x for x in targets.splitlines() if "ceiling >= 0.90, batch 75 " in x)
    assert line.endswith("| 0.91 | met (median; no interval) |")


def test_a_16_core_row_is_judged_per_core(copy):
    """The GPU machine's rows: 0.7 of a core of foreign CPU and a load of 1.1 before are
    quiet on 16 cores, not on 2."""
    page, res = copy
    rows = list(csv.DictReader((res / "gpu_batch_sweep.csv").open(newline="")))[:2]
    for r, cores, figure in zip(rows, (16, 2), ("0.1111", "0.2222"), strict=True):
        r.update(machine=f"vm: Xeon, {cores} cores", foreign_cpu="0.7", load_before="1.1")
        r.update(epoch_s=figure, valid="false", invalid_reason="load 1.1 > 1.0")
    rewrite(res / "gpu_batch_sweep.csv", rows)
    assert run_gen("--page", page, "--results", res).returncode == 0
    text = page.read_text()
    assert "0.1111" in text and "0.2222" not in text
    assert "| `gpu_batch_sweep.csv` | 1 of 2 |" in text


def test_check_fails_when_the_page_is_edited_by_hand(copy):
    page, res = copy
    text = page.read_text()
    m = re.search(r"<!-- perf:begin frameworks-runs -->\n(.*?)<!-- perf:end", text, re.S)
    assert m and "|" in m.group(1), "the frameworks-runs block has no table"
    page.write_text(text.replace(m.group(1), m.group(1).replace("| yes |", "| no |", 1)))
    assert run_gen("--check", "--page", page, "--results", res).returncode == 1


def test_a_missing_csv_is_said_with_its_make_target_and_never_for_a_present_one(copy):
    page, res = copy
    (res / "frameworks.csv").unlink()
    assert run_gen("--page", page, "--results", res).returncode == 0
    block = re.search(r"perf:begin frameworks -->\n(.*?)<!--", page.read_text(), re.S)
    assert block.group(1) == (
        "Not measured in this revision (no `benchmarks/results/frameworks.csv`); "
        "run `make bench-frameworks`.\n"
    )
    # the committed page: a block says "not measured" only where its CSV is absent
    text = PAGE.read_text()
    for name, body in re.findall(r"perf:begin ([a-z-]+) -->\n(.*?)<!--", text, re.S):
        for csv_name in re.findall(r"no `benchmarks/results/([a-z_]+)\.csv`", body):
            assert not (RESULTS / f"{csv_name}.csv").exists(), (name, csv_name)


def test_an_unknown_or_missing_block_stops_the_generator(copy):
    page, res = copy
    text = page.read_text()
    page.write_text(text + "\n<!-- perf:begin nonsense -->\n<!-- perf:end nonsense -->\n")
    r = run_gen("--page", page, "--results", res)
    assert r.returncode != 0 and "unknown generated block 'nonsense'" in r.stderr
    page.write_text(re.sub(r"<!-- perf:begin data -->.*?perf:end data -->", "", text, flags=re.S))
    r = run_gen("--page", page, "--results", res)
    assert r.returncode != 0 and "generated blocks missing: data" in r.stderr


def test_no_hand_typed_figures_outside_the_generated_blocks():
    text = PAGE.read_text().replace("95 %", "")  # the confidence level, not a measurement
    text = re.sub(r"<!-- perf:begin .*?<!-- perf:end [a-z0-9_-]+ -->", "", text, flags=re.S)
    figures = re.findall(
        r"\d+\.\d+|\d[\d,]* ?%|\d+(?:\.\d+)? ?x\b|\d[\d,]* ?samples/s|\d+ ?ms\b", text
    )
    assert not figures, f"hand-typed figures outside generated blocks: {figures}"
