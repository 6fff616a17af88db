"""The run record (metrics.json / history.csv / failure.json) and the timing helpers:
unit tests in the workflow env (no TensorFlow)."""

from __future__ import annotations

import csv
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hvdscale.project import git_commit
from hvdscale.record.build import (
    RecordError,
    finite_or_none,
    read_record,
    validate_record,
    write_failure,
    write_run_outputs,
)
from hvdscale.record.environment import environment_block, mpi_version
from hvdscale.record.history import HISTORY_COLUMNS, history_csv
from hvdscale.record.run_summary import summarise
from hvdscale.record.timing import TIMING_METHOD, EpochTimer, parse_timeline, split_error
from hvdscale.target import time_to


def epoch(i, wall=1.0, test=None, warmup=False, elapsed=None, val=None):
    t = EpochTimer(
        steps=100,
        timed_steps=100,
        phase_sums=[0.1, 0.5, 0.2, 0.15],
        dispatch_sum=0.02,
        train_wall=0.97,
        eval_wall=0.02,
        epoch_wall=wall,
    )
    return {
        "epoch": i,
        "warmup": warmup,
        "wall_s": wall,
        "steps": 100,
        "samples": 15000,
        "throughput": 15000 / 0.97,
        **t.record_fields(),
        "train_loss": 1.0 / (i + 1),
        "val_loss": val if val is not None else 0.45 / (i + 1),
        "test_loss": test if test is not None else 0.5 / (i + 1),
        "elapsed_s": elapsed if elapsed is not None else wall * (i + 1),
        "utilisation_mean": 90.0,
        "learning_rate": 1e-3,
        "attempt": 1,
    }


def record(epochs=None, status="completed"):
    epochs = epochs if epochs is not None else [epoch(0, 2.0, warmup=True), epoch(1), epoch(2)]
    return {
        "schema_version": 1,
        "run_id": "local_gloo_n1_w2_b75_lrnone_r0",
        "status": status,
        "exit_status": 0 if status == "completed" else 3,
        "error": None if status == "completed" else "nan",
        "config": {
            "partition": "local",
            "backend": "gloo",
            "nodes": 1,
            "workers": 2,
            "workers_per_node": 2,
            "batch_per_worker": 75,
            "global_batch": 150,
            "lr_rule": "none",
            "learning_rate_base": 1e-3,
            "learning_rate": 1e-3,
            "lr_warmup": False,
            "epochs": 3,
            "warmup_epochs": 1,
            "threads_per_worker": 1,
            "launcher": "horovodrun",
            "controller": "gloo",
            "repeat": 0,
            "seed": 1,
            "data_in_device_memory": True,
            "target_test_loss": 0.2,
            "model_parameters": 153441,
            "model_bytes": 613764,
            "horovod_env": {"HOROVOD_CPU_OPERATIONS": "gloo"},
            "steps_per_execution": 64,
            "backward_passes_per_step": 1,
            "compression": "none",
        },
        "environment": environment_block(
            config_hash="abc",
            hostnames=["h", "h"],
            devices=["CPU", "CPU"],
            tensorflow="2.15.1",
            horovod="0.28.1",
            started_utc="2026-01-01T00:00:00Z",
        ),
        "resume": {
            "resumed": False,
            "attempts": [{"started_utc": "2026-01-01T00:00:00Z", "start_epoch": 0}],
        },
        "epochs": epochs,
        "summary": summarise(epochs, 0.2),
        "utilisation": {"kind": "cpu", "interval_s": 0.5, "samples": [[0.5, 90.0], [1.0, 95.5]]},
        "timing_method": TIMING_METHOD,
        "timeline": None,
    }


def test_a_complete_record_validates():
    validate_record(record())


@pytest.mark.parametrize(
    "path",
    [
        ("status",),
        ("config", "global_batch"),
        ("environment", "hostnames"),
        ("epochs", 0, "time_sync_s"),
        ("summary", "time_to_target_s"),
        ("resume", "attempts"),
        ("utilisation", "samples"),
    ],
)
def test_a_missing_required_field_is_named(path):
    rec = record()
    d = rec
    for k in path[:-1]:
        d = d[k]
    del d[path[-1]]
    with pytest.raises(RecordError, match=re.escape(path[-1])):
        validate_record(rec)


def test_wrong_values_are_rejected():
    rec = record()
    rec["epochs"][1]["wall_s"] = 0
    with pytest.raises(RecordError, match="wall_s"):
        validate_record(rec)
    rec = record()
    rec["status"] = "crashed"
    with pytest.raises(RecordError, match="status"):
        validate_record(rec)


def test_summary_excludes_warmup_epochs():
    eps = [epoch(0, 10.0, warmup=True), epoch(1, 1.0), epoch(2, 3.0), epoch(3, 2.0)]
    s = summarise(eps, 0.2)
    assert s["epoch_time_median_s"] == 2.0  # not 2.5 (with the warm-up epoch)
    assert s["epochs_completed"] == 4
    assert s["sync_share"] == pytest.approx(0.2 / 0.95, rel=1e-4)
    assert s["data_share"] + s["compute_share"] + s["sync_share"] + s[
        "update_share"
    ] == pytest.approx(1.0)
    assert s["final_test_loss"] == eps[-1]["test_loss"] and s["best_test_loss"] == min(
        e["test_loss"] for e in eps
    )


def test_time_to_target_is_the_elapsed_time_of_the_first_epoch_below_target():
    eps = [
        epoch(0, 2.0, val=0.5, test=0.01, elapsed=2.0),  # the test loss never decides
        epoch(1, 1.0, val=0.19, elapsed=3.0),
        epoch(2, 1.0, val=0.1, elapsed=4.0),
    ]
    assert time_to(eps, 0.2)[0] == 3.0
    assert time_to(eps, 0.19)[0] == 3.0  # at or below
    assert time_to(eps, 0.01)[0] is None and time_to(eps, None)[0] is None
    eps[1]["val_loss"] = None  # nan_loss epochs have no loss
    assert time_to(eps, 0.2)[0] == 4.0


def test_non_finite_numbers_become_null():
    assert finite_or_none(float("nan")) is None and finite_or_none(float("inf")) is None
    assert finite_or_none(None) is None and finite_or_none(1) == 1.0
    rec = record([epoch(0)], status="nan_loss")
    rec["epochs"][0]["train_loss"] = finite_or_none(float("nan"))
    rec["summary"] = summarise(rec["epochs"], 0.2)
    validate_record(rec)


def test_write_run_outputs(tmp_path):
    rec = record()
    path = write_run_outputs(tmp_path, rec)
    assert json.loads(path.read_text()) == rec
    assert read_record(path) == rec
    rows = list(csv.DictReader((tmp_path / "history.csv").open()))
    assert list(rows[0]) == HISTORY_COLUMNS
    assert [int(r["epoch"]) for r in rows] == [0, 1, 2] and rows[0]["warmup"] == "1"
    assert float(rows[2]["time_sync_s"]) == rec["epochs"][2]["time_sync_s"]


def test_an_invalid_record_writes_nothing(tmp_path):
    rec = record()
    del rec["summary"]
    with pytest.raises(RecordError):
        write_run_outputs(tmp_path, rec)
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "metrics.json").write_text("{}")
    assert read_record(tmp_path / "metrics.json") is None


def test_history_csv_leaves_missing_values_empty():
    e = epoch(0)
    e["test_loss"] = None
    text = history_csv([e])
    assert text.splitlines()[1].split(",")[HISTORY_COLUMNS.index("test_loss")] == ""


def test_failure_json(tmp_path):
    p = write_failure(
        tmp_path / "failure.json",
        run_id="r",
        exit_status=137,
        error_tail="x" * 20000,
        launcher="mpirun",
        command=["mpirun"],
        message="rank 1 failed first",
    )
    f = json.loads(p.read_text())
    assert f["status"] == "failed" and f["exit_status"] == 137 and f["run_id"] == "r"
    assert (
        len(f["error_tail"]) == 8000
        and f["message"] == "rank 1 failed first"
        and f["time_utc"].endswith("Z")
    )


def test_dirty_ignores_the_named_paths_only(tmp_path):
    """A benchmark's own CSVs do not make the tree dirty for the next benchmark; any other
    tracked change does."""
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "results").mkdir()
    for f in ("results/a.csv", "code.py"):
        (tmp_path / f).write_text("1\n")
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    (tmp_path / "results" / "a.csv").write_text("2\n")
    assert git_commit(tmp_path, ignore=("results",)) == head.strip()
    assert git_commit(tmp_path) == head.strip() + "+dirty"
    (tmp_path / "code.py").write_text("2\n")
    assert git_commit(tmp_path, ignore=("results",)) == head.strip() + "+dirty"


def test_environment_facts(tmp_path):
    commit = git_commit()
    # a run record names the commit, and "+dirty" when tracked files differ from it; in a
    # git checkout (CI's fresh clone) that is HEAD, never "unknown"
    root = Path(__file__).resolve().parents[1]
    if (root / ".git").exists():
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        assert commit == head + ("+dirty" if dirty else "")
        assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", commit)
    else:  # an unpacked release without git
        assert commit == "unknown"
    assert git_commit(tmp_path) == "unknown"
    v = mpi_version()
    assert v == "none" or "MPI" in v or "mpi" in v.lower()
    env = environment_block(
        config_hash="h",
        hostnames=["a"],
        devices=["CPU"],
        tensorflow="t",
        horovod="h",
        started_utc="s",
    )
    assert env["python"] and env["numpy"] and env["cpu_model"]
    assert "slurm_job_id" in env and "slurm_nodelist" in env


# --------------------------------------------------------------------------- timing


def test_epoch_timer_scales_timed_steps_to_the_epoch():
    t = EpochTimer(
        steps=100,
        timed_steps=25,
        phase_sums=[0.1, 0.5, 0.2, 0.1],
        dispatch_sum=0.01,
        train_wall=3.7,
        eval_wall=0.1,
        epoch_wall=4.0,
    )
    f = t.record_fields()
    assert f["time_compute_s"] == pytest.approx(2.0) and f["time_data_s"] == pytest.approx(0.4)
    assert f["time_dispatch_s"] == pytest.approx(0.04)
    assert f["time_other_s"] == pytest.approx(4.0 - 3.6)
    assert split_error(f) == pytest.approx(abs(3.6 - 3.7) / 3.7)
    assert EpochTimer(steps=10).totals()["time_sync_s"] == 0.0


def _timeline_events():
    ev = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grads_0"}},
        {"name": "process_name", "ph": "M", "pid": 2, "args": {"name": "grads_1"}},
        {"name": "process_name", "ph": "M", "pid": 3, "args": {"name": "epoch_metrics_0"}},
    ]
    for pid, (a, b) in ((1, (100, 300)), (2, (150, 320)), (3, (1000, 1100))):
        ev += [
            {"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": a - 50, "pid": pid},
            {"ph": "E", "ts": a - 10, "pid": pid},
            {"ph": "B", "name": "ALLREDUCE", "ts": a, "pid": pid},
            {"ph": "B", "name": "GLOO_ALLREDUCE", "ts": a + 5, "pid": pid},
            {"ph": "E", "ts": b - 5, "pid": pid},
            {"ph": "E", "ts": b, "pid": pid},
        ]
    return ev


def test_parse_timeline_unions_fused_tensors(tmp_path):
    p = tmp_path / "timeline.json"
    p.write_text(json.dumps(_timeline_events()))
    tl = parse_timeline(p, tensor_filter="grads")
    assert tl["allreduce_s"] == pytest.approx((320 - 100) / 1e6)  # union of 100-300 and 150-320
    assert tl["allreduce_per_tensor_sum_s"] == pytest.approx((200 + 170) / 1e6)
    assert tl["negotiate_s"] == pytest.approx(80 / 1e6)  # 50-90 and 100-140
    assert tl["allreduce_ops"] == 2 and tl["tensors"] == ["grads_0", "grads_1"]
    assert tl["span_s"] == pytest.approx((320 - 50) / 1e6)  # negotiation start .. allreduce end
    # nested activities: their own unions (105-295 and 155-315)
    assert tl["activities_s"] == {"GLOO_ALLREDUCE": pytest.approx(210 / 1e6)}
    assert parse_timeline(p)["allreduce_ops"] == 3


def test_parse_timeline_tolerates_a_file_cut_off_mid_run(tmp_path):
    text = "[\n" + ",\n".join(json.dumps(e) for e in _timeline_events()) + ',\n{"ph": "B", "na'
    p = tmp_path / "timeline.json"
    p.write_text(text)
    assert parse_timeline(p, "grads")["allreduce_ops"] == 2


def test_timeline_check_reports_the_allreduce_to_sync_ratio(tmp_path):
    from hvdscale.record.timing import timeline_check

    p = tmp_path / "timeline.json"
    p.write_text(json.dumps(_timeline_events()))
    tc = timeline_check(p, measured_sync_s=440e-6, epochs=2, workers=2)
    assert tc["timeline_allreduce_s"] == pytest.approx(220e-6)
    assert tc["allreduce_to_sync_ratio"] == pytest.approx(0.5)
    assert tc["timeline_allreduce_ops"] == 2 and tc["epochs"] == 2
    assert timeline_check(p, 0.0, 2, 2)["allreduce_to_sync_ratio"] is None
    assert timeline_check(p, 1.0, 2, 1) is None  # one worker: no allreduce to compare
    assert timeline_check(tmp_path / "missing.json", 1.0, 2, 2) is None
    assert timeline_check(None, 1.0, 2, 2) is None
    rec = record()
    rec["timeline_check"] = tc
    validate_record(rec)
    rec["timeline_check"]["allreduce_to_sync_ratio"] = -1.0
    with pytest.raises(RecordError, match="allreduce_to_sync_ratio"):
        validate_record(rec)


def test_split_error_of_a_real_looking_epoch():
    e = epoch(1)
    assert split_error(e) == pytest.approx(abs(0.95 - 0.97) / 0.97)
    assert not math.isnan(e["time_other_s"])


# --------------------------------------------------------------------------- build_record


def built_record(system=None, attempts=None):
    """A record made by record.build.build_record (as hvdscale train makes it) for a run of a
    validated config."""
    from hvdscale.config.load import validate_config
    from hvdscale.matrix.runtable import find_run
    from hvdscale.record.build import build_record, epoch_entry

    cfg = validate_config({"training": {"max_epochs": 3, "warmup_epochs": 1}})
    run = find_run(cfg, "local_gloo_n1_w2_b75_lrnone_r0")
    t = EpochTimer(30, 30, [0.01, 0.05, 0.02, 0.01], 0.001, train_wall=0.09, epoch_wall=0.1)
    eps = [
        epoch_entry(
            epoch=i,
            warmup=i < 1,
            wall_s=0.1,
            steps=30,
            samples=4500,
            throughput=45000.0,
            timing=t.record_fields(),
            train_loss=0.1 / (i + 1),
            val_loss=0.2 / (i + 1),
            test_loss=float("nan") if i == 2 else None,
            elapsed_s=0.1 * (i + 1),
            utilisation_mean=None,
            learning_rate=1e-3,
            attempt=1,
        )
        for i in range(3)
    ]
    env = record()["environment"]
    return build_record(
        run=run,
        cfg=cfg,
        workers=2,
        controller="gloo",
        launcher="horovodrun",
        status="completed",
        error=None,
        learning_rate_base=1e-3,
        learning_rate=1e-3,
        model_parameters=153441,
        steps_per_epoch=30,
        environment=env,
        attempts=attempts or [{"started_utc": "2026-01-01T00:00:00Z", "start_epoch": 0}],
        epochs=eps,
        utilisation={"kind": "cpu", "interval_s": 0.25, "samples": []},
        timeline=None,
        timeline_check=None,
        data={"counts": {"train": 4500, "test": 1500}, "test_values": 3000},
        system=system,
        seed=12345,
        target={"mode": "absolute", "value": 0.1},
        stop_reason="target",
        initial_weights_sha256="0" * 64,
    )


def test_build_record_matches_the_schema_and_the_runs_table():
    from hvdscale.analysis.columns import RUNS_COLUMNS, TARGET_COLUMNS
    from hvdscale.analysis.records import record_row

    rec = built_record()
    validate_record(rec)
    assert rec["config"]["global_batch"] == 150 and rec["config"]["samples_per_epoch"] == 4500
    assert rec["config"]["model_bytes"] == 4 * 153441
    assert rec["epochs"][2]["test_loss"] is None  # non-finite -> null
    assert set(HISTORY_COLUMNS) <= set(rec["epochs"][0])
    row, epoch_rows = record_row(rec, "metrics.json")
    # the target columns are resolved at aggregation time (hvdscale.target), not per record
    assert set(RUNS_COLUMNS) - {"config_hash_match", *TARGET_COLUMNS} <= set(row)
    assert len(epoch_rows) == 3
    c = rec["config"]
    assert (c["seed"], c["seed_base"], c["kind"]) == (12345, cfg_seed(), "")
    assert c["max_epochs"] == 3 and c["stop_at_target"] is True
    t = rec["target"]
    assert (t["reached"], t["epoch"], t["time_to_target_s"]) == (True, 1, 0.2)
    assert rec["summary"]["best_val_loss"] == pytest.approx(0.2 / 3)
    assert "noise_scale" not in rec  # the sums are per epoch (analysis.noise_scale)
    # a record written before carries a whole-run noise_scale block: still valid, read alike
    old = {**rec, "noise_scale": {"b_local": 75, "b_global": 150, "steps": 9, "g_local_sq": 2.0}}
    validate_record(old)
    assert record_row(old, "metrics.json")[0] == row
    assert rec["timing"]["instrumentation"]["instrumented_steps"] == 90
    assert "system" not in rec  # optional: records without it stay valid


def cfg_seed():
    from hvdscale.config.load import validate_config

    return validate_config({})["seed"]


def test_a_record_with_the_system_description_validates():
    """Rank 0's system_block (collect_system on this machine) goes into the record as
    the optional ``system``, and a broken or schema-violating description never raises."""
    from hvdscale.record.build import system_block

    system = system_block(["node2", "node1", "node2"])
    assert system["nodes"] == ["node1", "node2"] and system["errors"] == {}
    rec = built_record(system=system)
    validate_record(rec)
    assert rec["system"]["cpu_model"] and isinstance(rec["system"]["interfaces"], list)
    with pytest.raises(RecordError, match="system"):
        validate_record({**rec, "system": {"errors": {}, "gpus": "A100"}})


def test_system_block_never_raises(monkeypatch):
    from hvdscale.record import system as system_mod
    from hvdscale.record.build import system_block

    monkeypatch.setattr(system_mod, "collect_system", lambda nodes: 1 / 0)
    broken = system_block(["n1"])
    assert "ZeroDivisionError" in broken["errors"]["collect_system"]
    validate_record(built_record(system=broken))
    monkeypatch.setattr(system_mod, "collect_system", lambda nodes: {"cores": "two"})
    bad = system_block(["n1"])
    assert bad["nodes"] == ["n1"] and "cores" in bad["errors"]["schema"]
    validate_record(built_record(system=bad))


def test_a_torch_rank_describes_the_cuda_cudnn_and_nccl_it_was_built_with(monkeypatch):
    """Issue 33: without TensorFlow and Horovod (a torch-ddp rank) the build versions come
    from torch; TensorFlow's and Horovod's stay first where they are imported."""
    import sys
    import types

    from hvdscale.record import system as system_mod

    def fake_torch(cuda, available):
        t = types.SimpleNamespace(version=types.SimpleNamespace(cuda=cuda))
        nccl = types.SimpleNamespace(version=lambda: (2, 28, 9))
        t.cuda = types.SimpleNamespace(is_available=lambda: available, nccl=nccl)
        t.backends = types.SimpleNamespace(cudnn=types.SimpleNamespace(version=lambda: 91002))
        return t

    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    monkeypatch.delitem(sys.modules, "horovod.tensorflow", raising=False)
    monkeypatch.setitem(sys.modules, "torch", fake_torch("13.0", True))
    info = system_mod.collect_system(["n1"])
    assert (info["cuda_build"], info["cudnn"], info["nccl"]) == ("13.0", "91002", "2.28.9")
    monkeypatch.setitem(sys.modules, "torch", fake_torch(None, False))  # a CPU build
    info = system_mod.collect_system(["n1"])
    assert (info["cuda_build"], info["cudnn"], info["nccl"]) == ("", "", "")
    monkeypatch.setitem(sys.modules, "torch", fake_torch("13.0", True))
    monkeypatch.setattr(system_mod, "_tf_build", lambda: {"cuda_build": "12.2", "cudnn": "8"})
    info = system_mod.collect_system(["n1"])
    assert (info["cuda_build"], info["cudnn"], info["nccl"]) == ("12.2", "8", "2.28.9")


TORCH_CONFIG = """PyTorch built with:
  - Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build 20240605 for Intel(R) 64
  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa71049cd69a3df32adcccb623b12cd7baa22)
  - CPU capability usage: AVX512
  - Build settings: BLAS_INFO=mkl, BUILD_TYPE=Release, LAPACK_INFO=mkl, USE_MKL=ON,
"""


def test_the_cpu_kernel_path_of_torch_names_mkl_and_its_code_path(monkeypatch):
    """Issue 32: the record says which GEMM a torch rank's CPU matrix products use: MKL
    takes its Intel code path on Intel CPUs only (the fp32 gap measured on the AMD EPYC)."""
    from hvdscale.record.system import cpu_kernels

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)
    amd = cpu_kernels(TORCH_CONFIG, vendor="AuthenticAMD")
    assert amd == (
        "PyTorch: fp32 GEMM MKL 2024.2, non-Intel code path (AuthenticAMD); oneDNN 3.12.0; "
        "ATen CPU capability AVX512"
    )
    assert "MKL 2024.2, Intel code path;" in cpu_kernels(TORCH_CONFIG, vendor="GenuineIntel")
    monkeypatch.setenv("LD_PRELOAD", "/opt/x/libmkl_intel_cpu_true.so")
    assert "vendor check overridden by LD_PRELOAD /opt/x/libmkl_intel_cpu_true.so" in (
        cpu_kernels(TORCH_CONFIG, vendor="AuthenticAMD")
    )
    other = TORCH_CONFIG.replace("BLAS_INFO=mkl", "BLAS_INFO=open").replace("MKL-DNN", "x")
    assert cpu_kernels(other, vendor="AuthenticAMD") == (
        "PyTorch: fp32 GEMM open; no oneDNN; ATen CPU capability AVX512"
    )


# --------------------------------------------------------------------------- start-up (issue 30)


def test_startup_from_a_synthetic_launch_stamp():
    """The launcher's stamp (HVDSCALE_LAUNCH_START) to the start of the epoch loop; no
    stamp, a malformed one or a clock behind the launcher's: no figure (null), never a
    wrong one."""
    from hvdscale.record.startup import (
        LAUNCH_START_ENV,
        launch_stamp,
        stamp_env,
        startup_since,
    )

    env = stamp_env(1_700_000_000.25)
    assert env == {LAUNCH_START_ENV: "1700000000.25"} and stamp_env(None) == {}
    stamp = launch_stamp(env)
    assert stamp == 1_700_000_000.25
    assert startup_since(stamp, 1_700_000_005.5) == pytest.approx(5.25)
    assert launch_stamp({}) is None and startup_since(None, 1_700_000_005.5) is None
    assert launch_stamp({LAUNCH_START_ENV: "soon"}) is None
    assert launch_stamp({LAUNCH_START_ENV: "nan"}) is None
    assert startup_since(stamp, stamp - 1.0) is None


def test_the_record_sums_startup_over_attempts_and_adds_it_to_the_time_to_target():
    """timing.startup_s is the sum over the attempts; target.launch_to_target_s is the
    start-up of the attempts up to the target epoch + the time to target (0.2 s here, the
    end of epoch 1); a later attempt's start-up is not in it."""
    from hvdscale.record.startup import launch_to_target
    from hvdscale.trainer.checkpoint import ResumeState

    progress = ResumeState()
    progress.begin_attempt("2026-01-01T00:00:00Z")
    progress.loop_started(4.5)
    rec = built_record(attempts=progress.attempts)
    validate_record(rec)
    assert rec["resume"]["attempts"][0]["startup_s"] == 4.5
    assert rec["timing"]["startup_s"] == 4.5
    assert rec["target"]["launch_to_target_s"] == pytest.approx(4.5 + 0.2)

    two = [
        {"started_utc": "a", "start_epoch": 0, "startup_s": 4.0},
        {"started_utc": "b", "start_epoch": 1, "startup_s": 6.0},
        {"started_utc": "c", "start_epoch": 2, "startup_s": 5.0},
    ]
    rec = built_record(attempts=two)
    validate_record(rec)
    assert rec["resume"]["resumed"] and rec["timing"]["startup_s"] == pytest.approx(15.0)
    assert rec["target"]["launch_to_target_s"] == pytest.approx(4.0 + 6.0 + 0.2)
    assert launch_to_target(two, None, None) is None  # not reached
    assert launch_to_target(two, 0, 0.1) == pytest.approx(4.1)


def test_a_rank_without_the_stamp_records_null_and_older_records_stay_valid():
    from hvdscale.record.startup import total_startup

    no_stamp = [{"started_utc": "a", "start_epoch": 0, "startup_s": None}]
    rec = built_record(attempts=no_stamp)
    validate_record(rec)
    assert rec["timing"]["startup_s"] is None and rec["target"]["launch_to_target_s"] is None
    # an older checkpoint's attempt without the field: the total is unknown, not smaller
    mixed = [
        {"started_utc": "a", "start_epoch": 0},
        {"started_utc": "b", "start_epoch": 1, "startup_s": 5.0},
    ]
    assert total_startup(mixed) is None
    old = built_record()
    del old["timing"]["startup_s"], old["target"]["launch_to_target_s"]
    validate_record(old)  # records written before issue 30 item 7
    with pytest.raises(RecordError, match="startup_s"):
        validate_record({**old, "timing": {**old["timing"], "startup_s": -1.0}})


# --------------------------------------------------------- issue 29: cores per rank


def test_compact_core_strings():
    from hvdscale.record.labelproof import compact_cores, parse_cores

    assert compact_cores([0, 1, 2, 3]) == "0-3" and compact_cores([2, 0]) == "0,2"
    assert compact_cores([8, 0, 1, 2, 3, 10, 11]) == "0-3,8,10-11" and compact_cores([]) == ""
    assert compact_cores({5}) == "5"
    for cores in ([0, 1, 2, 3], [0, 2], [1, 2, 3, 7, 9, 10]):
        assert parse_cores(compact_cores(cores)) == set(cores)


def test_each_ranks_cores_are_in_the_record(monkeypatch):
    """describe_environment gathers (host, device, cores) in its one collective; rank 0's
    environment block has environment.cores (this process's affinity), which validates;
    records without it (before issue 29) stay valid."""
    import os

    from hvdscale.record.labelproof import compact_cores
    from hvdscale.trainer import rank
    from hvdscale.trainer.worker import WorkerInfo

    calls = []
    worker = WorkerInfo(hostname="n1")
    real = worker.allgather_object
    monkeypatch.setattr(worker, "allgather_object", lambda o, name=None: calls.append(o) or real(o))
    monkeypatch.setattr(rank, "system_block", lambda hosts: None)

    class Fw:
        def versions(self):
            return {"tensorflow": "t", "horovod": "h"}

    env, _ = rank.describe_environment(worker, "CPU (1 thread)", "abc", {"started_utc": "s"}, Fw())
    assert len(calls) == 1  # still one collective
    want = compact_cores(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else ""
    assert env["cores"] == [want] and env["hostnames"] == ["n1"]
    assert env["devices"] == ["CPU (1 thread)"]
    rec = record()
    assert "cores" not in rec["environment"]
    validate_record(rec)  # an older record without environment.cores
    rec["environment"]["cores"] = ["0-3", "4-7"]
    validate_record(rec)
    with pytest.raises(RecordError, match="cores"):
        validate_record({**rec, "environment": {**rec["environment"], "cores": [0, 1]}})
