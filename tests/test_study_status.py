"""Watching and steering a study: which finished runs an edited config retrains
(hvdscale plan), and the study's progress (hvdscale status) over a crafted results
folder, as it reads it without SLURM and with squeue's lines."""

from __future__ import annotations

import json
import os
from base64 import urlsafe_b64encode
from pathlib import Path

import pytest
import yaml

from hvdscale.cli import main
from hvdscale.matrix.runkinds import target_config
from hvdscale.matrix.runtable import run_config, run_table
from hvdscale.study.plan import merged_config, plan, study_config_files
from hvdscale.study.status import (
    QueueJob,
    format_status,
    parse_elapsed,
    parse_squeue,
    run_of_comment,
    status,
)

ROOT = Path(__file__).resolve().parents[1]
TEST_CONFIG = ROOT / ".test" / "config" / "config.yaml"
SCALING = [
    "local_gloo_n1_w1_b75_lrnone_r0",
    "local_gloo_n1_w2_b75_lrnone_r0",
    "local_mpi_n1_w1_b75_lrnone_r0",
    "local_mpi_n1_w2_b75_lrnone_r0",
]
CAL = "local_gloo_n1_w1_b75_lrnone_cal_r0"


def write_slice(cfg: dict, results: Path, run_id: str) -> None:
    """RUNS/<run_id>/config.json as rule write_run_config writes it."""
    rdir = results / "runs" / run_id
    rdir.mkdir(parents=True, exist_ok=True)
    cfg_json = json.dumps(run_config(cfg, run_id), sort_keys=True)
    assert main(["write-config", "--json", cfg_json, "--out", str(rdir / "config.json")]) == 0


def finished_study(tmp_path: Path) -> tuple[dict, Path]:
    """Every run of .test/config/config.yaml finished: config.json and target's config
    written as the workflow's rules write them (hvdscale write-config), a record each."""
    cfg = merged_config(study_config_files([TEST_CONFIG]))
    results = tmp_path / "results"
    for run in run_table(cfg):
        write_slice(cfg, results, run.run_id)
        (results / "runs" / run.run_id / "metrics.json").write_text(
            json.dumps({"run_id": run.run_id})
        )
    tgt = json.dumps(target_config(cfg), sort_keys=True)
    out = results / "config" / "target.json"
    assert main(["write-config", "--json", tgt, "--out", str(out)]) == 0
    return cfg, results


def test_plan_counts_unchanged_records_as_done(tmp_path, capsys):
    cfg, results = finished_study(tmp_path)
    p = plan(cfg, results)
    assert p["total"]["jobs_done"] == 5 and p["total"]["jobs_retrain"] == 0
    assert main(["plan", str(TEST_CONFIG), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "5 done (record, config unchanged)" in out and "retrain" not in out


def test_an_edited_training_key_names_the_runs_it_retrains(tmp_path, capsys):
    """training.max_epochs is in every scaling run's slice; the calibration run's slice
    has its own max_epochs (training.target.calibration), so it stays done."""
    _, results = finished_study(tmp_path)
    edited = tmp_path / "edit.yaml"
    edited.write_text(yaml.safe_dump({"training": {"max_epochs": 4}}))
    assert main(["plan", str(TEST_CONFIG), str(edited), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert "1 done (record, config unchanged); 4 finished run(s) retrain" in out
    assert "4 finished run(s) will retrain: their config slice changed (training.max_epochs)" in out
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("training.max_epochs:"))
    assert sorted(line.split(":", 1)[1].strip().split(", ")) == SCALING
    assert CAL not in out
    p = plan(merged_config(study_config_files([TEST_CONFIG, edited])), results)
    assert p["retrain"] == {run_id: ["training.max_epochs"] for run_id in SCALING}


def test_config_overrides_count_like_snakemake_config(tmp_path, capsys):
    """--config seed=7 (Snakemake's syntax): every slice has the seed; the target's
    calibration depends on it too, so the scaling runs name both."""
    _, results = finished_study(tmp_path)
    args = ["plan", str(TEST_CONFIG), "--results", str(results), "--json", "--config", "seed=7"]
    assert main(args) == 0
    p = json.loads(capsys.readouterr().out)
    assert p["retrain"][CAL] == ["seed"]
    for run_id in SCALING:
        assert p["retrain"][run_id] == ["seed", "target: seed"]
    assert p["total"]["jobs_done"] == 0


def test_a_rewritten_config_json_retrains_even_with_the_same_slice(tmp_path):
    """Snakemake compares times: a config.json newer than the record retrains the run."""
    import os

    cfg, results = finished_study(tmp_path)
    victim = results / "runs" / SCALING[0]
    t = (victim / "metrics.json").stat().st_mtime
    os.utime(victim / "config.json", (t + 10, t + 10))
    assert plan(cfg, results)["retrain"] == {SCALING[0]: ["config.json is newer than the record"]}


# --------------------------------------------------------------------------- status


def test_squeue_lines_map_to_run_ids():
    text = (
        "101|RUNNING|1:02:03|1|rule_train_run_wildcards_local_mpi_n1_w2_b75_lrnone_r0\n"
        "102|PENDING|0:00|2|rule_train_run_wildcards_alpha_mpi_n2_w16_b75_lrnone_r0\n"
        "103|RUNNING|1-00:00:05|1|rule_generate_shard_wildcards_0001\n"
        "104|RUNNING|5:00|1|\n"
    )
    jobs = parse_squeue(text)
    assert [j.run_id for j in jobs] == [
        "local_mpi_n1_w2_b75_lrnone_r0",
        "alpha_mpi_n2_w16_b75_lrnone_r0",
        None,
        None,
    ]
    assert [j.elapsed_s for j in jobs] == [3723.0, 0.0, 86405.0, 300.0]
    assert jobs[1].nodes == 2 and jobs[1].state == "PENDING"
    assert run_of_comment("rule_train_run") is None
    assert parse_elapsed("INVALID") == 0.0


def _done(cfg: dict, results: Path, run_id: str, wall_s: float, end: str) -> None:
    write_slice(cfg, results, run_id)
    rdir = results / "runs" / run_id
    rec = {"run_id": run_id, "finished_utc": end, "environment": {"started_utc": end}}
    (rdir / "metrics.json").write_text(json.dumps(rec))
    bench = results / "benchmarks" / "train_run" / f"{run_id}.tsv"
    bench.parent.mkdir(parents=True, exist_ok=True)
    bench.write_text(f"s\th:m:s\tmax_rss\n{wall_s}\t0:00:00\t100\n")


def test_status_mid_study_from_records_logs_and_the_queue(tmp_path):
    """Two runs done (100 s and 200 s, one after the other), one running for 30 s, one
    not started, the calibration run failed."""
    cfg = merged_config(study_config_files([TEST_CONFIG]))
    results = tmp_path / "results"
    _done(cfg, results, SCALING[0], 100.0, "2024-06-01T10:00:00+00:00")
    _done(cfg, results, SCALING[1], 200.0, "2024-06-01T10:10:00+00:00")
    cal = results / "runs" / CAL
    cal.mkdir(parents=True)
    (cal / "failure.json").write_text(
        json.dumps(
            {
                "run_id": CAL,
                "status": "failed",
                "exit_status": 1,
                "message": "rank 0 on node1 exited with 1\nTraceback follows",
            }
        )
    )
    queue = [
        QueueJob("7", "RUNNING", 30.0, 1, f"rule_train_run_wildcards_{SCALING[2]}"),
        QueueJob("8", "RUNNING", 99.0, 1, "rule_generate_shard_wildcards_0000"),
    ]
    s = status(cfg, results, queue, workdir=tmp_path)
    row = s["partitions"][0]
    assert {k: row[k] for k in ("done", "running", "queued", "failed", "not_started")} == {
        "done": 2,
        "running": 1,
        "queued": 0,
        "failed": 1,
        "not_started": 1,
    }
    assert row["node_hours_spent"] == round((100 + 200 + 30) / 3600, 3)
    # mpi w1 runs at the median of its shape (100 s) less 30 s; mpi w2 at 200 s; one at once
    assert row["eta_s"] == 270 and row["parallel_jobs"] == 1
    reason = "rank 0 on node1 exited with 1"
    assert s["failed"] == [{"run_id": CAL, "reason": reason, "where": str(cal / "failure.json")}]
    text = format_status(s)
    assert "5 runs: 2 done, 1 running, 0 queued, 1 failed, 1 not started" in text
    assert "ETA: 4 min" in text
    assert f"{CAL}: rank 0 on node1 exited with 1" in text


def test_status_without_slurm_reads_the_rule_log(tmp_path):
    """No squeue, no Snakemake running: a run with a rule log and no record failed,
    named by the log's last error line; the others have not started."""
    cfg = merged_config(study_config_files([TEST_CONFIG]))
    results = tmp_path / "results"
    log = results / "logs" / "train_run" / f"{SCALING[3]}.log"
    log.parent.mkdir(parents=True)
    log.write_text("hvdscale launch: starting\nUserError: shard 0003 checksum mismatch\ndone\n")
    s = status(cfg, results, None, workdir=tmp_path)
    assert s["source"] == "records and logs"
    assert s["total"]["failed"] == 1 and s["total"]["not_started"] == 4
    assert s["failed"][0]["reason"] == "UserError: shard 0003 checksum mismatch"
    # nothing finished: each run left is expected at its partition's time limit
    runtime_s = cfg["scaling"]["partitions"]["local"]["runtime_min"] * 60
    assert s["total"]["eta_s"] == 4 * runtime_s


def mark_started(workdir: Path, output: Path) -> None:
    """``output`` as Snakemake marks a job's output it started and has not seen end
    (.snakemake/incomplete/<the path in URL-safe base64>)."""
    name = urlsafe_b64encode(os.path.normpath(str(output)).encode()).decode()
    marker = workdir / ".snakemake" / "incomplete" / name
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()


def test_a_record_of_an_interrupted_job_is_not_done(tmp_path):
    """A record whose job Snakemake started and never saw end (a head job lost while its
    training job finished): with no Snakemake running, it trains again and is not done;
    while its job is queued it counts so; while a Snakemake holds the lock it is done
    (that Snakemake sees the job end)."""
    cfg, results = finished_study(tmp_path)
    run_id = SCALING[1]
    mark_started(tmp_path, results / "runs" / run_id / "metrics.json")
    s = status(cfg, results, [], workdir=tmp_path)
    assert s["total"]["done"] == 4 and s["total"]["not_started"] == 1
    assert "4 done, 0 running, 0 queued, 0 failed, 1 not started" in format_status(s)
    queued = [QueueJob("9", "PENDING", 0.0, 1, f"rule_train_run_wildcards_{run_id}")]
    s = status(cfg, results, queued, workdir=tmp_path)
    assert s["total"]["done"] == 4 and s["total"]["queued"] == 1
    s = status(cfg, results, None, workdir=tmp_path)  # no squeue: the same
    assert s["total"]["done"] == 4 and s["total"]["not_started"] == 1
    lock = tmp_path / ".snakemake" / "locks" / "0.output.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    for queue in ([], None):
        assert status(cfg, results, queue, workdir=tmp_path)["total"]["done"] == 5


@pytest.mark.parametrize("edit", [{"training": {"max_epochs": 4}}])
def test_status_counts_retrained_runs_as_not_started(tmp_path, edit):
    _, results = finished_study(tmp_path)
    edited = tmp_path / "edit.yaml"
    edited.write_text(yaml.safe_dump(edit))
    s = status(
        merged_config(study_config_files([TEST_CONFIG, edited])), results, [], workdir=tmp_path
    )
    assert s["total"]["done"] == 1 and s["total"]["not_started"] == 4
    assert s["total"]["retrain"] == 4
    assert "4 finished run(s) will retrain" in format_status(s)


def test_plan_and_status_read_the_study_snakemake_runs(tmp_path):
    """snakemake --configfile X extends the Snakefile's config/config.yaml: plan and status
    merge X over it too, so their slices are the jobs' slices (a key that only
    config/config.yaml sets, e.g. data.physics.noise_std, is in both)."""
    files = study_config_files([TEST_CONFIG])
    assert files[0] == ROOT / "config" / "config.yaml" and files[1:] == [TEST_CONFIG]
    assert study_config_files([ROOT / "config" / "config.yaml"]) == [
        ROOT / "config" / "config.yaml"
    ]
    base = merged_config([ROOT / "config" / "config.yaml"])
    alone = merged_config([TEST_CONFIG])
    both = merged_config(files)
    noise = [c["data"]["physics"]["noise_std"] for c in (base, alone, both)]
    assert noise[2] == noise[0] != noise[1]
