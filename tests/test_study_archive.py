"""Archive and regenerate (issue 13): the real Snakemake report rules on synthetic run
records (no training: report.allow_partial reads the records that exist), then
`hvdscale export` (rule export_study), then a rebuild in a fresh directory with the
workflow env alone gives identical bytes for every PDF, PNG and table, the tuning
sweep's selection and tuned tables included (issue 31: the checkpoint's selection is
written before the re-runs, tuned.csv after them); and strict=True fails the workflow
on a regression."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import fixtures_runs as F
import pandas as pd
import pytest
import yaml

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.tuning import selection
from hvdscale.cli import main as cli_main
from hvdscale.figures.registry import FIGURE_NAMES
from hvdscale.matrix.allreduce_sweeps import allreduce_jobs
from hvdscale.matrix.runtable import run_config, run_table
from hvdscale.study.export import REPORT_RULES, read_archive, rebuild
from hvdscale.study.plan import merged_config

# real Snakemake jobs (about a minute on an idle 2-core machine): the full suite
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "results-test-study-archive"


def snakemake(*args):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("SOURCE_DATE_EPOCH", None)
    return subprocess.run(
        [sys.executable, "-m", "snakemake", "--cores", "2", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )


STUDY = {
    "training": {"repeats": 3, "target": {"mode": "absolute", "value": 0.05}},
    "scaling": {
        "sweeps": [
            {
                "name": "archive",
                "partitions": ["local"],
                "workers": [1, 2],
                "backends": ["gloo", "mpi"],
                "batch_sizes": [75],
                "lr_rules": ["none"],
            }
        ],
        # as the default config: tune the 2-worker runs, the winner re-run with fresh seeds
        "tune": {
            "partitions": ["local"],
            "workers": [2],
            "backends": ["mpi"],
            "batch_sizes": [75],
            "lr_rules": ["linear"],
            "lr_multipliers": [0.5, 2],
            "warmup_epochs": [1],
            "repeats": 1,
            "rerun_repeats": 3,
        },
    },
}


@pytest.fixture(scope="module")
def study():
    """A finished study in RESULTS (3 repeats, so the references get intervals)."""
    res = ROOT / RESULTS
    shutil.rmtree(res, ignore_errors=True)
    # the study: 2 backends x 1, 2 workers x 3 repeats and 2 tuning candidates, an absolute
    # target (no calibration runs): the 14 simulated records are the whole run table
    res.mkdir(parents=True)
    (res / "study.yaml").write_text(yaml.safe_dump(STUDY))
    configs = ["config/config.yaml", "config/partial.yaml", f"{RESULTS}/study.yaml"]
    cfg = merged_config([ROOT / c for c in configs])
    assert len(run_table(cfg)) == 14
    # the study's target first, as the workflow fixes it before any run: the records
    # written after it are up to date (Snakemake keeps them; they are not retrained)
    first = f"{RESULTS}/scaling/target.json"
    out = snakemake("--configfile", *configs, "--config", f"results_dir={RESULTS}", "--", first)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    # each run's config slice as rule write_run_config writes it, then its record
    for run in run_table(cfg):
        cfg_json = json.dumps(run_config(cfg, run.run_id), sort_keys=True)
        out_json = res / "runs" / run.run_id / "config.json"
        assert cli_main(["write-config", "--json", cfg_json, "--out", str(out_json)]) == 0
    F.write_study(res / "runs", cfg)
    # the winner's re-runs, as the checkpoint select_tuned will request them
    agg = aggregate(res / "runs", cfg)
    chosen = selection(agg.runs, agg.status)
    assert list(chosen["status"]) == ["selected"]
    assert len(F.write_reruns(res / "runs", cfg, chosen, 3)) == 3
    F.add_systems(res / "runs", skip=2)  # two records as before runs described the system
    # the allreduce sweeps under the names the rules expect ({partition}_{backend}_n_w)
    tables = {p.stem: p for p in F.study_allreduce(res / "tmp-allreduce", cfg)}
    (res / "allreduce").mkdir()
    for job in allreduce_jobs(cfg):
        shutil.copy(
            tables[f"{job['partition']}_{job['backend']}"], res / "allreduce" / f"{job['id']}.csv"
        )
    shutil.rmtree(res / "tmp-allreduce")
    target = f"{RESULTS}/study.tar.gz"
    out = snakemake("--configfile", *configs, "--config", f"results_dir={RESULTS}", "--", target)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    yield res, out, configs
    shutil.rmtree(res, ignore_errors=True)


def test_snakemake_prints_the_plan_and_checks_the_references(study):
    res, out, _ = study
    # 12 scaling runs, 2 tuning candidates, the winner's 3 re-runs
    assert "hvdscale plan: 17 training jobs, worst case 8.5 node-h" in out.stderr
    plan_line = next(x for x in out.stderr.splitlines() if x.startswith("hvdscale plan:"))
    assert "14 done (record, config unchanged)" in out.stderr, plan_line
    ref = pd.read_csv(res / "scaling" / "references.csv")
    assert set(ref["verdict"]) <= {"within", "better", "worse", "inconclusive", "not measured"}
    sync = ref[ref.quantity == "sync_share"].iloc[0]
    assert sync["min_repeats"] == 3 and sync["ci_low"] <= sync["measured"] <= sync["ci_high"]
    assert (ref[ref.partition == "alpha"]["verdict"] == "not measured").all()


def test_archive_holds_inputs_products_and_provenance(study):
    res, _, configs = study
    members = read_archive(res / "study.tar.gz")
    names = set(members)
    assert {"MANIFEST.json", "system.json", *configs, "envs/workflow.lock.txt"} <= names
    # in merge order, each once: the Snakefile's configfile is merged first, so a rebuild
    # that replays the list gets the study's tuning sweep, not the default config's
    import json

    assert json.loads(members["MANIFEST.json"])["config_files"] == configs
    assert f"{RESULTS}/report.pdf" in names and f"{RESULTS}/scaling/references.csv" in names
    assert f"{RESULTS}/scaling/systems.csv" in names  # issue 13 item 5
    systems = pd.read_csv(io.BytesIO(members[f"{RESULTS}/scaling/systems.csv"]), dtype=str)
    assert list(systems["partition"]) == ["local"]
    row = systems.iloc[0]
    assert (row["runs"], row["described"]) == ("17", "15")
    assert row["cpu_model"] == "Generic x86-64" and row["interfaces"] == "eth0 (192.0.2.2)"
    assert len([n for n in names if n.endswith("/metrics.json")]) == 17
    assert not [n for n in names if "checkpoint" in n]
    with tarfile.open(res / "study.tar.gz") as tar:
        assert {m.mtime for m in tar.getmembers()} == {0}


def test_rebuild_from_the_archive_alone_is_byte_identical(study, tmp_path):
    res, _, configs = study
    archive = tmp_path / "moved" / "study.tar.gz"
    archive.parent.mkdir()
    shutil.copy(res / "study.tar.gz", archive)
    shutil.rmtree(res / "plots")  # the rebuild must not read the original results
    out = rebuild(archive, tmp_path / "rebuilt")
    files = out["files"]
    for name in FIGURE_NAMES:
        for ext in ("pdf", "png"):
            assert files[f"{RESULTS}/plots/{name}.{ext}"] == "identical", name
    assert files[f"{RESULTS}/report.pdf"] == "identical"
    for table in ("selection.csv", "tuned.csv", "headline.csv"):
        assert files[f"{RESULTS}/scaling/{table}"] == "identical", table
    assert set(files.values()) == {"identical"}, files  # `hvdscale rebuild` exits 0
    assert (tmp_path / "rebuilt" / RESULTS / "report.pdf").exists()
    # the report rules themselves, run by Snakemake; nothing of the training stage
    ran = set(re.findall(r"^(?:local)?rule (\w+):", "\n".join(out["log"]), re.M))
    assert "build_report" in ran and ran <= set(REPORT_RULES), ran

    # a tampered record is detected: the products differ
    members = read_archive(archive)
    rid = next(n for n in members if n.endswith("_w2_b75_lrnone_r0/metrics.json"))
    bad = tmp_path / "bad.tar.gz"
    with tarfile.open(archive) as src, tarfile.open(bad, "w:gz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()
            if m.name.endswith(rid):
                data = data.replace(b'"wall_s": ', b'"wall_s": 1')  # every epoch
            m.size = len(data)
            dst.addfile(m, io.BytesIO(data))
    out2 = rebuild(bad, tmp_path / "rebuilt-bad")
    assert out2["files"][f"{RESULTS}/scaling/runs.csv"] == "differs"


def test_strict_fails_the_workflow_on_a_regression(study):
    res, _, configs = study
    (res / "strict.yaml").write_text(
        "strict: true\nreferences:\n  sync_share: { value: 0.0, tolerance: 0.001 }\n"
    )
    out = snakemake(
        "--configfile", *configs, f"{RESULTS}/strict.yaml", "--config", f"results_dir={RESULTS}",
        "--", f"{RESULTS}/scaling/references.ok",
    )  # fmt: skip
    assert out.returncode != 0
    assert "Error in rule enforce_references" in out.stdout + out.stderr, out.stderr[-3000:]
    log = (res / "logs" / "enforce_references.log").read_text()
    assert "worse than the reference beyond the tolerance" in log and "sync_share" in log
    assert not (res / "scaling" / "references.ok").exists()
    ref = pd.read_csv(res / "scaling" / "references.csv")
    assert ref.loc[ref.quantity == "sync_share", "verdict"].item() == "worse"
