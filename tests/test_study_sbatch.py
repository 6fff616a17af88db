"""The head job's script (scripts/study.sbatch) without SLURM: a SIGTERM to its shell (what
scancel or the time limit sends) ends the script only after its Snakemake has ended, so a
head job never leaves the queue while its Snakemake still acts on the study beside the
next head job's. squeue is a stand-in that lists no job; Snakemake is a stand-in that
takes a while to shut down after SIGTERM, as Snakemake does while it waits for its jobs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAKE_SNAKEMAKE = """
import signal, sys, time
from pathlib import Path
here = Path(sys.argv[1])
def on_term(*_):
    time.sleep(1.5)  # shutting down: waits for its running jobs
    (here / "snakemake.stopped").write_text("stopped")
    sys.exit(1)
signal.signal(signal.SIGTERM, on_term)
(here / "snakemake.pid").write_text(str(__import__("os").getpid()))
time.sleep(120)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead too
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def test_sigterm_ends_the_head_job_only_after_its_snakemake(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text("#!/bin/sh\nexit 0\n")  # no job in the queue
    squeue.chmod(0o755)
    fake = tmp_path / "fake_snakemake.py"
    fake.write_text(FAKE_SNAKEMAKE)
    work = tmp_path / "study"
    work.mkdir()
    (work / ".venv").symlink_to(ROOT / ".venv")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SNAKEMAKE": f"{sys.executable} {fake} {tmp_path}",
        "SLURM_SUBMIT_DIR": str(work),
        "SLURM_JOB_ID": "4711",
    }
    log = tmp_path / "head.log"  # a file: Snakemake outliving the shell keeps no pipe open
    with open(log, "w") as fh:
        proc = subprocess.Popen(
            ["bash", str(ROOT / "scripts" / "study.sbatch"), str(ROOT / "config" / "config.yaml")],
            cwd=work,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    pid_file = tmp_path / "snakemake.pid"
    deadline = time.time() + 60
    while not pid_file.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert pid_file.exists(), log.read_text()
    snakemake_pid = int(pid_file.read_text())
    marker = work / ".snakemake" / "hvdscale-head.jobid"
    assert marker.read_text().strip() == "4711"

    proc.send_signal(signal.SIGTERM)  # to the batch shell only
    try:
        proc.wait(timeout=60)
        # the shell passed the signal on and waited for Snakemake's shutdown
        assert not alive(snakemake_pid), log.read_text()
    finally:
        if alive(snakemake_pid):
            os.kill(snakemake_pid, signal.SIGKILL)
    out = log.read_text()
    assert (tmp_path / "snakemake.stopped").exists(), out
    assert proc.returncode == 1, out  # Snakemake's status
    assert "Snakemake exited with status 1" in out
    assert not marker.exists()  # Snakemake ended by itself: it released its lock
