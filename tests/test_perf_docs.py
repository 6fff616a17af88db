"""docs/performance.md is generated from benchmarks/results/*.csv: the page and the CSVs
agree, every CSV carries its provenance, and no figure is typed by hand outside the
generated blocks. Quick: no benchmark runs, no timing."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GEN = ROOT / "scripts" / "gen_perf_docs.py"
PAGE = ROOT / "docs" / "performance.md"
RESULTS = ROOT / "benchmarks" / "results"
PROVENANCE = ["commit", "machine", "date", "load", "load_before", "load_after"]


def run_gen(*args):
    return subprocess.run(
        [sys.executable, str(GEN), *map(str, args)], capture_output=True, text=True, cwd=ROOT
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
    res = tmp_path / "results"
    shutil.copytree(RESULTS, res)
    page = tmp_path / "performance.md"
    shutil.copy(PAGE, page)
    return page, res


def test_check_fails_when_a_csv_figure_changes(copy):
    page, res = copy
    p = res / "bench_scaling.csv"
    if not p.is_file():
        pytest.skip("no bench_scaling.csv")
    with open(p, newline="") as fh:
        rows = list(csv.DictReader(fh))
    rows[0]["median"] = str(float(rows[0]["median"]) * 1.5 + 1)
    with open(p, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    r = run_gen("--check", "--page", page, "--results", res)
    assert r.returncode == 1
    assert "make perf-docs" in r.stderr
    # regenerating makes it agree again
    assert run_gen("--page", page, "--results", res).returncode == 0
    assert run_gen("--check", "--page", page, "--results", res).returncode == 0


def test_check_fails_when_the_page_is_edited_by_hand(copy):
    page, res = copy
    text = page.read_text()
    m = re.search(r"<!-- perf:begin scaling-summary -->\n(.*?)<!-- perf:end", text, re.S)
    assert m and m.group(1).strip(), "the scaling block is empty"
    edited = text.replace(m.group(1), m.group(1).replace("|", "| 0.99 ", 1), 1)
    page.write_text(edited)
    assert run_gen("--check", "--page", page, "--results", res).returncode == 1


def test_a_missing_csv_is_said_not_invented(copy):
    page, res = copy
    (res / "bench_slurm_overhead.csv").unlink(missing_ok=True)
    run_gen("--page", page, "--results", res)
    assert "Not measured in this revision (no `benchmarks/results/bench_slurm_overhead.csv`)" in (
        page.read_text()
    )


def test_no_hand_typed_figures_outside_the_generated_blocks():
    text = PAGE.read_text().replace("95 %", "")  # the confidence level, not a measurement
    text = re.sub(r"<!-- perf:begin .*?<!-- perf:end [a-z0-9_-]+ -->", "", text, flags=re.S)
    figures = re.findall(
        r"\d+\.\d+|\d[\d,]* ?%|\d+(?:\.\d+)? ?x\b|\d[\d,]* ?samples/s|\d+ ?ms\b", text
    )
    assert not figures, f"hand-typed figures outside generated blocks: {figures}"
