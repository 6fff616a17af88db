"""`hvdscale launch` of torch-ddp run ids (issue 19): 1 and 2 ranks through torchrun,
records valid against the run schema, and a failing run that ends with the failing
rank's own exit status and a clear message instead of torchrun's 1."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest_train import (
    TRAIN_PY,
    base_config,
    cached_data,
    check_plausible,
    kill_group,
    launch,
    load_record,
    start_launch,
    sub_env,
    wait_for,
    write_config,
)
from test_torch_ddp import TORCH_SWEEP, needs_torch

pytestmark = [pytest.mark.slow, needs_torch]


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, Path]:
    data = cached_data(tmp_path_factory, n_samples=400, train_shards=2, test_shards=1)
    cfg = base_config(n_samples=400, train_shards=2, test_shards=1, epochs=2)
    cfg["scaling"]["sweeps"].append(dict(TORCH_SWEEP))
    d = tmp_path_factory.mktemp("torch_launch")
    return write_config(d / "config.json", cfg), data


@pytest.mark.parametrize("workers", [1, 2])
def test_launch_trains_a_torch_run_with_torchrun(tmp_path, setup, workers):
    config, data = setup
    rid = f"local_torch-ddp_gloo_n1_w{workers}_b8_lrnone_r0"
    out = tmp_path / rid
    r = launch(config, rid, data, out, env={"OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert "torch.distributed.run --standalone" in r.stderr
    assert f"--nproc-per-node={workers}" in r.stderr and f"{rid}: completed" in r.stderr
    assert "torch-ddp starts with torchrun" in r.stderr  # the config's launcher: horovodrun
    rec = load_record(out)  # valid against run.schema.json
    check_plausible(rec, workers, epochs=2)
    assert rec["run_id"] == rid and rec["config"]["framework"] == "torch-ddp"
    assert rec["config"]["launcher"] == "torchrun" and rec["config"]["controller"] == "gloo"
    assert rec["label_proof"]["ok"], rec["label_proof"]["problems"]
    assert rec["label_proof"]["process_group_world_size"] == workers
    assert rec["timing"]["startup_s"] > 0  # the launcher's stamp reached torchrun's workers
    assert not (out / "failure.json").exists()


def test_a_failing_torch_run_reports_the_rank_s_own_status(tmp_path, setup):
    """Every rank stops with a UserError (exit 2: the data directory has no manifest);
    torchrun says 1, the launcher says 2 and names the ranks' statuses."""
    config, _ = setup
    empty = tmp_path / "nodata"
    empty.mkdir()
    rid = "local_torch-ddp_gloo_n1_w2_b8_lrnone_r0"
    out = tmp_path / rid
    r = launch(config, rid, empty, out)
    assert r.returncode == 2, r.stdout + r.stderr
    failure = json.loads((out / "failure.json").read_text())
    assert failure["exit_status"] == 2 and failure["launcher"] == "torchrun"
    assert "exit status by rank: rank 0: 2, rank 1: 2" in failure["message"]
    assert "failed first (exit code 2)" in failure["message"]
    assert "exit status 2: the failing rank's" in failure["message"]
    assert f"ERROR: {rid}: failed" in r.stderr


def test_hvdscale_train_s_errors_for_a_torch_run_name_the_command(tmp_path, setup):
    """The ranks of a torch-ddp run execute ``hvdscale train`` like Horovod's: a backend
    the framework lacks (the run id names both) is refused before torch is imported, and a
    torch rank's bad input ends it with exit status 2, its exit marker and one line."""
    config, data = setup
    train = [str(TRAIN_PY), "-m", "hvdscale.cli", "train", "--config", str(config)]
    out = tmp_path / "run"
    rid = "local_torch-ddp_mpi_n1_w1_b8_lrnone_r0"
    cmd = [*train, "--run-id", rid, "--data-dir", str(data), "--out-dir", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=sub_env())
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(f"hvdscale train: error: run_id '{rid}': framework torch-ddp ")
    assert "has no backend 'mpi'" in r.stderr and not out.exists()
    rid = "local_torch-ddp_gloo_n1_w1_b8_lrnone_r0"
    cmd = [*train, "--run-id", rid, "--data-dir", str(tmp_path / "nodata"), "--out-dir", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=sub_env())
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("hvdscale train: error: "), r.stderr
    assert (out / ".pids" / "rank-0.exit").read_text().strip() == "2"


def test_a_killed_rank_ends_the_launch_with_its_signal_and_no_orphans(tmp_path, setup):
    config, data = setup
    cfg = json.loads(config.read_text())
    cfg["training"]["max_epochs"] = 500
    long = tmp_path / "long.json"
    long.write_text(json.dumps(cfg))
    rid = "local_torch-ddp_gloo_n1_w2_b8_lrnone_r0"
    out = tmp_path / rid
    proc = start_launch(long, rid, data, out)
    try:
        wait_for(lambda: (out / "checkpoint" / "LATEST").exists(), 120, "an epoch", proc)
        pids = [int((out / ".pids" / f"rank-{k}.pid").read_text()) for k in (0, 1)]
        os.kill(pids[1], signal.SIGKILL)
        output, _ = proc.communicate(timeout=90)
    finally:
        kill_group(proc)
    assert proc.returncode == 137, output[-3000:]
    msg = json.loads((out / "failure.json").read_text())["message"]
    assert "rank 1 failed first (exit code -9: signal 9)" in msg
    # rank 0 ends by torchrun's SIGTERM (default action: no marker either)
    assert re.search(r"no exit marker \(killed or crashed\) from rank\(s\) (0, )?1;", msg), msg
    t0 = time.time()
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.time() - t0 < 30:
        time.sleep(0.2)
    assert not [p for p in pids if Path(f"/proc/{p}").exists()], "orphaned ranks"
