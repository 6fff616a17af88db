"""The whole pipeline end to end: data -> Horovod training runs -> aggregation ->
plots -> PDF report, with the local profile and through a real SLURM cluster
(scripts/slurm-cluster.sh) with the official executor plugin. No mocks: real
Snakemake, real horovodrun/mpirun/srun, real sbatch/squeue/scancel.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from required_layers import require_layer
from slurm_support import horovod_skip_reason, slurm_cluster  # noqa: F401  (fixture used by name)
from streams import again_after_lock_race

from hvdscale.report import fmt

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

pytestmark = [pytest.mark.slow, pytest.mark.horovod]


@pytest.fixture(autouse=True)
def _needs_horovod():
    require_layer("horovod", horovod_skip_reason())


@pytest.fixture
def results_dir(request):
    """A results directory inside the project (results_dir must be relative), removed afterwards."""
    name = f"results-test-{request.node.name.replace('[', '-').replace(']', '')}"
    path = ROOT / name
    shutil.rmtree(path, ignore_errors=True)
    yield name
    shutil.rmtree(path, ignore_errors=True)


def write_config(tmp_path: Path, overrides: dict) -> Path:
    path = tmp_path / "override.yaml"
    path.write_text(yaml.safe_dump(overrides))
    return path


def snakemake(
    args: list[str], env: dict | None = None, timeout: float = 900
) -> subprocess.CompletedProcess:
    return again_after_lock_race(
        lambda: subprocess.run(
            [*SNAKEMAKE, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=timeout,
        )
    )


def read_status(results: str) -> dict[str, str]:
    with open(ROOT / results / "scaling" / "status.csv") as fh:
        return {row["run_id"]: row["status"] for row in csv.DictReader(fh)}


def records(results: str) -> dict[str, dict]:
    out = {}
    for path in sorted((ROOT / results / "runs").glob("*/metrics.json")):
        out[path.parent.name] = json.loads(path.read_text())
    return out


def pdftext(path: Path) -> str:
    return subprocess.run(
        ["pdftotext", "-layout", str(path), "-"], capture_output=True, text=True, check=True
    ).stdout


RUN_IDS = [
    "local_gloo_n1_w1_b75_lrnone_r0",
    "local_gloo_n1_w2_b75_lrnone_r0",
    "local_mpi_n1_w1_b75_lrnone_r0",
    "local_mpi_n1_w2_b75_lrnone_r0",
]
# the target's calibration run (training.target.calibration: 1 seed, the first sweep's
# partition and backend), before every scaling run
CAL_IDS = ["local_gloo_n1_w1_b75_lrnone_cal_r0"]


# --------------------------------------------------------------------------- local profile


# a minimal re-tuning sweep: one 1-worker candidate (rule select_tuned, tuned.csv)
TUNE = {
    "scaling": {
        "tune": {
            "partitions": ["local"],
            "workers": [1],
            "backends": ["gloo"],
            "batch_sizes": [75],
            "lr_multipliers": [2],
            "warmup_epochs": [1],
            "rerun_repeats": 1,
        }
    }
}
CANDIDATES = ["local_gloo_n1_w1_b75_lrlinear_m2_wu1_r0"]
# a hang guard, not a tolerance: a shared 2-core machine under load needs more than 900 s
LOCAL_TIMEOUT_S = 1800


def test_local_pipeline_end_to_end_then_partial_report(results_dir, tmp_path):
    tune = write_config(tmp_path, TUNE)
    out = snakemake(
        [
            "--profile",
            "profiles/local",
            "--configfile",
            ".test/config/config.yaml",
            str(tune),
            "--config",
            f"results_dir={results_dir}",
        ],
        timeout=LOCAL_TIMEOUT_S,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    res = ROOT / results_dir
    # data stage
    manifest = json.loads((res / "data" / "manifest.json").read_text())
    counts = manifest["counts"]
    assert counts["total"] == 3000 == counts["train"] + counts["val"] + counts["test"]
    assert counts["val"] > 0
    # every run completed, with a valid record (calibration, tuning candidates and the
    # re-run of a selected candidate too)
    with open(res / "scaling" / "selection.csv") as fh:
        chosen = list(csv.DictReader(fh))
    with open(res / "scaling" / "tuned.csv") as fh:
        tuned = list(csv.DictReader(fh))
    # selection.csv is the checkpoint's selection, written before the winner's re-runs;
    # tuned.csv (aggregate_runs) comes after them and holds their figures
    assert len(chosen) == 1 and chosen[0]["status"] in ("selected", "none_reached")
    picked = chosen[0]["status"] == "selected"
    assert len(tuned) == 1 and tuned[0]["status"] == chosen[0]["status"]
    assert tuned[0]["candidate"] == chosen[0]["candidate"]
    if picked:
        assert int(tuned[0]["n_repeats"]) >= 1  # the re-run's figures, reached or not
    reruns = [CANDIDATES[0].replace("_r0", "_rerun_r0")] if picked else []
    expected = RUN_IDS + CAL_IDS + CANDIDATES + reruns
    status = read_status(results_dir)
    assert {r: status.get(r) for r in expected} == {r: "completed" for r in expected}
    recs = records(results_dir)
    assert sorted(recs) == sorted(expected)
    target = json.loads((res / "scaling" / "target.json").read_text())
    for rid, rec in recs.items():
        # the default config's launcher; Gloo needs horovodrun's rendezvous
        launcher = "horovodrun" if rec["config"]["backend"] == "gloo" else "mpirun"
        assert rec["status"] == "completed" and rec["config"]["launcher"] == launcher
        # Gloo ranks ran with hvdscale.native's library (gloo_yield_when_spinning), MPI ranks not
        assert rec["config"]["gloo_epoll_yield"] is (rec["config"]["backend"] == "gloo")
        n = rec["summary"]["epochs_completed"]
        if rid in CAL_IDS:  # trains its whole budget: it sets the target
            assert n == 3 and rec["target"]["value"] is None
        else:  # stops at the target (validation loss) or at max_epochs
            assert rec["target"]["value"] == pytest.approx(target["value"])
            assert 1 <= n <= 3
            reached = rec["target"]["reached"]
            assert n == 3 or reached, rid
    # summary has the speedups against the 1-worker baseline of each backend
    with open(res / "scaling" / "summary.csv") as fh:
        rows = [r for r in csv.DictReader(fh) if r["workers"] == "2"]
    assert {r["backend"] for r in rows} == {"gloo", "mpi"}
    for r in rows:
        assert float(r["speedup"]) > 0 and r["has_baseline"] in ("True", "true", "1")
    # plots and the report from real records
    for name in (
        "speedup_efficiency",
        "sync_time",
        "epoch_time_batch",
        "loss_vs_time",
        "time_breakdown",
        "utilisation",
        "costmodel",
    ):
        for ext in ("pdf", "png"):
            assert (res / "plots" / f"{name}.{ext}").stat().st_size > 1000
    text = pdftext(res / "report.pdf")
    # the measured numbers of summary.csv in their rows of the report's configuration
    # table: each backend's group header with its speedup per GPU, and the 2-worker row's
    # first cells (workers, nodes, runs, epoch time, samples/s, speedup)
    flat = " ".join(text.split())
    for r in rows:
        head = (
            f"local / {r['backend']} / batch 75 per worker / LR none | speedup per GPU "
            f"{fmt.slope(r['speedup_per_gpu'])} | baseline ok"
        )
        assert head in flat, head
        block = flat.split(head, 1)[1]
        cells = [
            "2",
            r["nodes"],
            f"{r['n_completed']}/{r['n_expected']}",
            fmt.spread(
                fmt.seconds(r["epoch_time_s"]),
                fmt.seconds(r["epoch_time_min_s"]),
                fmt.seconds(r["epoch_time_max_s"]),
            ),
            fmt.rate(r["throughput"]),
            fmt.speedup(r["speedup"]),
        ]
        assert " ".join(cells) in block, (cells, block[:300])
    assert "0.53" in text and "0.74" in text  # the side-by-side with the reference study
    # the tuning sweep: its candidates' record, tuned.csv and the report's section
    assert recs[CANDIDATES[0]]["config"]["warmup_epochs"] == 1
    assert recs[CANDIDATES[0]]["config"]["learning_rate"] == pytest.approx(2 * 4.7331e-4)
    assert tuned[0]["candidate"] == "m2_wu1"
    assert "Speedup at equal accuracy" in text and "Learning-rate re-tuning" in text

    # partial results: one run's record is gone, the report is built from the others
    # and names the missing run
    missing = "local_gloo_n1_w2_b75_lrnone_r0"
    (res / "runs" / missing / "metrics.json").unlink()
    out = snakemake(
        [
            "--profile",
            "profiles/local",
            "--configfile",
            ".test/config/config.yaml",
            str(tune),
            "config/partial.yaml",
            "--config",
            f"results_dir={results_dir}",
            "--",
            f"{results_dir}/report.pdf",
        ]
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert read_status(results_dir)[missing] == "missing"
    text = pdftext(res / "report.pdf")
    assert missing in text
    assert "missing" in text.lower()


# --------------------------------------------------------------------------- real SLURM


def squeue_jobs(env: dict) -> list[dict]:
    out = subprocess.run(
        ["squeue", "-h", "-a", "-t", "all", "-o", "%i|%T|%k|%j"],
        capture_output=True,
        text=True,
        env=env,
    )
    jobs = []
    for line in out.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 4:
            jobs.append({"id": parts[0], "state": parts[1], "comment": parts[2], "name": parts[3]})
    return jobs


def squeue_steps(env: dict) -> list[tuple[str, str]]:
    """(job id, step id) of every job step squeue shows (steps such as batch included)."""
    out = subprocess.run(
        ["squeue", "-h", "-s", "-o", "%i"], capture_output=True, text=True, env=env
    )
    return [tuple(x.split(".", 1)) for x in out.stdout.split() if "." in x]


@pytest.mark.slurm
def test_slurm_pipeline_runs_every_job_through_slurm(slurm_cluster, results_dir, tmp_path):  # noqa: F811
    env = dict(slurm_cluster)
    override = write_config(tmp_path, {"training": {"launcher": "srun"}})
    before = {j["id"] for j in squeue_jobs(env)}
    log = tmp_path / "snakemake.log"
    proc = subprocess.Popen(
        [
            *SNAKEMAKE,
            "--profile",
            "profiles/test-slurm",
            "--configfile",
            ".test/config/config.yaml",
            str(override),
            "--config",
            f"results_dir={results_dir}",
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        text=True,
    )
    seen_running: dict[str, str] = {}
    seen_steps: dict[str, set[str]] = {}  # job id -> the job steps squeue showed
    deadline = time.time() + 900
    while proc.poll() is None and time.time() < deadline:
        for job in squeue_jobs(env):
            if job["state"] == "RUNNING" and "train_run" in job["comment"]:
                seen_running[job["id"]] = job["comment"]
        for job, step in squeue_steps(env):
            seen_steps.setdefault(job, set()).add(step)
        time.sleep(0.5)
    proc.wait(timeout=60)
    output = log.read_text()
    assert proc.returncode == 0, output[-4000:]
    assert read_status(results_dir) == {r: "completed" for r in RUN_IDS + CAL_IDS}
    recs = records(results_dir)
    assert sorted(recs) == sorted(RUN_IDS + CAL_IDS)
    job_ids = {run_id: rec["environment"]["slurm_job_id"] for run_id, rec in recs.items()}
    assert all(job_ids.values()), job_ids
    assert len(set(job_ids.values())) == 5, "every run is its own SLURM job"
    for run_id, job_id in job_ids.items():
        assert job_id not in before
        # the job is known to the controller, ran on partition local, and belongs to this run
        show = subprocess.run(
            ["scontrol", "show", "job", job_id], capture_output=True, text=True, env=env
        )
        assert show.returncode == 0, show.stderr
        assert "JobState=COMPLETED" in show.stdout and "Partition=local" in show.stdout
        assert run_id in show.stdout  # the plugin's comment names the rule's wildcards
    # squeue showed the training jobs while they were running
    assert set(job_ids.values()) & set(seen_running), (job_ids, seen_running)
    # the 2-rank MPI run's ranks were started by srun --mpi=pmix inside the job
    run_id = "local_mpi_n1_w2_b75_lrnone_r0"
    assert recs[run_id]["config"]["launcher"] == "srun"
    log = (ROOT / results_dir / "logs" / "train_run" / f"{run_id}.log").read_text()
    assert "srun --mpi=pmix" in log
    # issue 29: a 1-worker run (MPI, Gloo, the calibration run) starts no srun: its rank
    # runs in the plugin's job step (the job's one task, step 0), the launcher's own, and
    # squeue never showed a second step of its job
    for run_id in [r for r in RUN_IDS + CAL_IDS if "_w1_" in r]:
        assert recs[run_id]["config"]["launcher"] == "srun"
        job_id = job_ids[run_id]
        log = (ROOT / results_dir / "logs" / "train_run" / f"{run_id}.log").read_text()
        launch_line = next(ln for ln in log.splitlines() if ln.startswith("hvdscale launch: "))
        assert "srun" not in launch_line.split("HVDSCALE_LAUNCHER=srun")[-1], launch_line
        assert "--overlap" not in log
        assert (
            f"1 worker: rank 0 runs as a child of this launcher in SLURM job step {job_id}.0, "
            "the launcher's own"
        ) in log, log[-3000:]
        steps = {s for s in seen_steps.get(job_id, set()) if s.isdigit()}
        assert steps == {"0"}, (run_id, job_id, seen_steps.get(job_id))
    assert (ROOT / results_dir / "report.pdf").stat().st_size > 10000


@pytest.mark.slurm
def test_slurm_cancelled_job_is_retried_and_resumes_while_others_continue(
    slurm_cluster,
    results_dir,  # noqa: F811
    tmp_path,
):
    env = dict(slurm_cluster)
    victim = "local_mpi_n1_w2_b75_lrnone_r0"
    override = write_config(
        tmp_path,
        {
            "data": {"n_samples": 8000},
            # 30 epochs, no early stop and no calibration runs: the victim trains long
            # enough to be cancelled, the status lists the two runs
            "training": {
                "launcher": "srun",
                "max_epochs": 30,
                "warmup_epochs": 1,
                "stop_at_target": False,
                "target": {"mode": "absolute", "value": 0.05},
                "checkpoint_every_s": 0,  # the victim is cancelled after its first checkpoint
            },
            "scaling": {
                "sweeps": [
                    {
                        "name": "cancel",
                        "partitions": ["local"],
                        "workers": [1, 2],
                        "backends": ["mpi"],
                        "batch_sizes": [75],
                        "lr_rules": ["none"],
                    }
                ]
            },
        },
    )
    log = tmp_path / "snakemake.log"
    proc = subprocess.Popen(
        [
            *SNAKEMAKE,
            "--profile",
            "profiles/test-slurm",
            "--configfile",
            ".test/config/config.yaml",
            str(override),
            "--config",
            f"results_dir={results_dir}",
            "--jobs",
            "1",
        ],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=open(log, "w"),
        stderr=subprocess.STDOUT,
        text=True,
    )
    latest = ROOT / results_dir / "runs" / victim / "checkpoint" / "LATEST"
    cancelled = None
    deadline = time.time() + 600
    while proc.poll() is None and time.time() < deadline and cancelled is None:
        if latest.exists():
            for job in squeue_jobs(env):
                if job["state"] == "RUNNING" and victim in job["comment"]:
                    subprocess.run(["scancel", job["id"]], env=env, check=True)
                    cancelled = job["id"]
        time.sleep(0.2)
    assert cancelled, "the training job of the victim run was never seen running with a checkpoint"
    proc.wait(timeout=900)
    output = log.read_text()
    assert proc.returncode == 0, output[-4000:]
    show = subprocess.run(
        ["scontrol", "show", "job", cancelled], capture_output=True, text=True, env=env
    )
    assert "JobState=CANCELLED" in show.stdout
    status = read_status(results_dir)
    assert status == {"local_mpi_n1_w1_b75_lrnone_r0": "completed", victim: "completed"}
    rec = records(results_dir)[victim]
    assert rec["resume"]["resumed"] is True
    attempts = rec["resume"]["attempts"]
    assert attempts[0]["slurm_job_id"] == cancelled
    assert attempts[-1]["slurm_job_id"] != cancelled
    assert attempts[-1]["start_epoch"] >= 1, (
        "the retry resumed from the checkpoint, not from epoch 0"
    )
    assert rec["summary"]["epochs_completed"] == 30 and len(rec["epochs"]) == 30
