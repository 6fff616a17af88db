"""Helpers and fixtures for the training tests (imported by tests/test_train.py and
tests/test_horovod_smoke.py).

The tiny datasets are made by the real data pipeline through the workflow env's CLI
(write-config, generate-shard, validate-shard, split-dataset), once per session.
Training runs start in the train env (.venv-train) through `hvdscale launch`, as
Snakemake starts them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from required_layers import layer_skipif

PROJECT_ROOT = Path(__file__).resolve().parents[1]
TRAIN_PY = PROJECT_ROOT / ".venv-train" / "bin" / "python"
HVD = [sys.executable, "-m", "hvdscale.cli"]  # the workflow env's CLI

needs_train_env = layer_skipif(
    "train-env", None if TRAIN_PY.exists() else "train env .venv-train missing"
)

# a config whose scaling matrix has every run the tests start
SWEEP = {
    "partitions": ["local"],
    "workers": [1, 2],
    "backends": ["gloo", "mpi"],
    "batch_sizes": [1, 8, 75, 150],
    "lr_rules": ["none"],
}
PARTITIONS = {
    "local": {
        "gpus_per_node": 0,
        "cores_per_node": 2,
        "mem_mb_per_node": 8000,
        "workers_per_node": 2,
        "runtime_min": 30,
    }
}


def sub_env() -> dict:
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.pop("HOROVOD_TIMELINE", None)
    return env


#: the fault hook (sitecustomize.py): Python loads it at start-up from PYTHONPATH
HOOKS = Path(__file__).parent / "hooks"
G_SQ = ("g_local_sq", "g_global_sq")  # the noise-scale sums of an epoch (means per update)


def fault_env(delay: str, env: dict | None = None) -> dict:
    """``env`` (default sub_env()) with HVDSCALE_FAULT_DELAY=``delay`` (<phase>:<seconds>)
    and the fault hook of tests/hooks ahead on PYTHONPATH, which the launcher passes to
    every rank: each training step sleeps that long inside that phase."""
    env = dict(sub_env() if env is None else env)
    path = [str(HOOKS), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(PYTHONPATH=os.pathsep.join(path), HVDSCALE_FAULT_DELAY=delay)
    return env


def train_code_env(**extra: str) -> dict:
    """The environment of an inline train-env snippet: the source tree on the path."""
    env = sub_env()
    env["PYTHONPATH"] = str(PROJECT_ROOT / "src")
    env.update(extra)
    return env


def run_train_code(code: str, timeout=120, **extra_env: str) -> subprocess.CompletedProcess:
    """Run ``code`` with the train env's interpreter (``python -c``); fail with its output
    unless it exits 0."""
    r = subprocess.run(
        [str(TRAIN_PY), "-c", code],
        capture_output=True,
        text=True,
        env=train_code_env(**extra_env),
        timeout=timeout,
    )
    assert r.returncode == 0, f"train-env snippet failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def hvd(*args, check=True, timeout=300, **kw) -> subprocess.CompletedProcess:
    """Run the workflow env's `hvdscale ARGS`."""
    r = subprocess.run(
        [*HVD, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=sub_env(),
        **kw,
    )
    if check and r.returncode != 0:
        raise AssertionError(
            f"hvdscale {' '.join(map(str, args))} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
        )
    return r


def base_config(n_samples=6000, train_shards=4, test_shards=2, seed=11, **training) -> dict:
    """A small config; ``training`` keys override (``epochs`` is read as max_epochs, the
    budget; without a --target file every run trains it)."""
    # a checkpoint after every epoch: the resume tests kill a run after its first epochs
    t = {"max_epochs": 4, "warmup_epochs": 1, "learning_rate": 1e-3, "checkpoint_every_s": 0}
    if "epochs" in training:
        training["max_epochs"] = training.pop("epochs")
    t.update(training)
    return {
        "seed": seed,
        "data": {
            "n_samples": n_samples,
            "n_shards": 2,
            "split_shards": {"train": train_shards, "test": test_shards},
            "chunk_samples": 256,
        },
        "training": t,
        "scaling": {"partitions": PARTITIONS, "sweeps": [dict(SWEEP)]},
    }


def write_config(path: Path, cfg: dict) -> Path:
    """The validated full config snapshot, as `hvdscale write-config` writes it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    hvd("write-config", "--json", json.dumps(cfg), "--out", path)
    return path


def build_data(workdir: Path, cfg: dict) -> Path:
    """generate-shard -> validate-shard -> split-dataset with the CLI; returns the data dir."""
    workdir = Path(workdir)
    data_cfg = workdir / "data.json"
    hvd("write-config", "--json", json.dumps(cfg), "--section", "data", "--out", data_cfg)
    raw = workdir / "raw"
    shards, vals = [], []
    for k in range(cfg["data"]["n_shards"]):
        shard = raw / f"shard-{k:04d}.h5"
        val = raw / f"shard-{k:04d}.validation.json"
        hvd("generate-shard", "--config", data_cfg, "--shard", k, "--out", shard)
        hvd("validate-shard", "--config", data_cfg, "--shard", shard, "--out", val)
        shards.append(shard)
        vals.append(val)
    data = workdir / "data"
    hvd(
        "split-dataset",
        "--config",
        data_cfg,
        "--shards",
        *shards,
        "--validations",
        *vals,
        "--outdir",
        data,
    )
    if "val" not in json.loads((data / "manifest.json").read_text())["shards"]:
        add_val_split(data)
    return data


VAL_EVERY = 10  # shim: every 10th train sample (by sample id) becomes validation


def add_val_split(data: Path) -> None:
    """Until the data stage writes a validation split (helper "flow", data.val_fraction):
    move the train samples with sample_id % VAL_EVERY == 0 into val/shard-0000.h5 and list
    them as shards.val in the manifest (the contract's layout). The manifest's
    normalisation stays that of the whole train share; counts.total stays train + test
    for the current manifest check (the val split is listed beside them)."""
    import h5py
    import numpy as np

    from hvdscale.data import h5
    from hvdscale.data.check import sha256_file

    manifest = json.loads((data / "manifest.json").read_text())
    taken = {"curves": [], "labels": [], "sample_id": []}
    for e in manifest["shards"]["train"]:
        path = data / e["file"]
        with h5py.File(path, "r") as fh:
            arrs = {k: fh[k][()] for k in taken}
            attrs = dict(fh.attrs)
        val = arrs["sample_id"] % VAL_EVERY == 0
        for k in taken:
            taken[k].append(arrs[k][val])
        keep = {k: v[~val] for k, v in arrs.items()}
        _write_shard(path, keep, attrs, h5)
        e.update(_entry(data, e["file"], keep["sample_id"], sha256_file))
    val_arrs = {k: np.concatenate(v) for k, v in taken.items()}
    (data / "val").mkdir()
    with h5py.File(data / manifest["shards"]["train"][0]["file"], "r") as fh:
        attrs = {**dict(fh.attrs), "split": "val", "kind": "val"}
    _write_shard(data / "val" / "shard-0000.h5", val_arrs, attrs, h5)
    manifest["shards"]["val"] = [
        _entry(data, "val/shard-0000.h5", val_arrs["sample_id"], sha256_file)
    ]
    counts = manifest["counts"]
    counts["val"] = len(val_arrs["sample_id"])
    counts["train"] -= counts["val"]
    counts["total"] = counts["train"] + counts["test"]
    (data / "manifest.json").write_text(json.dumps(manifest, indent=1))


def _write_shard(path: Path, arrs: dict, attrs: dict, h5) -> None:
    n, n_points = arrs["curves"].shape[:2]
    ids = arrs["sample_id"]
    attrs = {
        k: list(v) if getattr(getattr(v, "dtype", None), "kind", "") == "O" else v
        for k, v in attrs.items()
    }
    attrs.update(first_sample_id=int(ids[0]), last_sample_id=int(ids[-1]))
    tmp = path.with_suffix(".tmp")
    w = h5.ShardWriter(tmp, n, n_points, attrs, chunk_samples=256, writeback=False)
    w.append(arrs["curves"], arrs["labels"], arrs["sample_id"])
    w.close()
    os.replace(tmp, path)


def _entry(data: Path, file: str, ids, sha256_file) -> dict:
    path = data / file
    return {
        "file": file,
        "n_samples": int(len(ids)),
        "first_sample_id": int(ids[0]),
        "last_sample_id": int(ids[-1]),
        "bytes": path.stat().st_size,
        "sha256": sha256_file(path),
    }


_DATA: dict = {}


def cached_data(tmp_path_factory, **kw) -> Path:
    """A data directory for base_config(**kw), built once per session."""
    key = tuple(sorted(kw.items()))
    if key not in _DATA:
        _DATA[key] = build_data(tmp_path_factory.mktemp("data"), base_config(**kw))
    return _DATA[key]


@pytest.fixture(scope="session")
def train_data(tmp_path_factory) -> Path:
    """6000 curves: about 4050 train samples in 4 shards, 450 validation samples in 1,
    1500 test samples in 2 shards."""
    return cached_data(tmp_path_factory)


def launch_cmd(config: Path, run_id: str, data: Path, out: Path, *extra) -> list[str]:
    return [
        *HVD,
        "launch",
        "--config",
        str(config),
        "--run-id",
        run_id,
        "--data-dir",
        str(data),
        "--out-dir",
        str(out),
        "--train-python",
        str(TRAIN_PY),
        *map(str, extra),
    ]


def launch(
    config: Path, run_id: str, data: Path, out: Path, *extra, timeout=300, env=None
) -> subprocess.CompletedProcess:
    """`hvdscale launch` a training run and wait for it (``env``: extra variables)."""
    return subprocess.run(
        launch_cmd(config, run_id, data, out, *extra),
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**sub_env(), **(env or {})},
    )


def start_launch(config: Path, run_id: str, data: Path, out: Path, *extra) -> subprocess.Popen:
    """Start `hvdscale launch` in its own process group (so the test can kill the group)."""
    return subprocess.Popen(
        launch_cmd(config, run_id, data, out, *extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=sub_env(),
        start_new_session=True,
    )


def wait_for(
    predicate, timeout: float, what: str, proc: subprocess.Popen | None = None, interval=0.02
):
    t0 = time.time()
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"process ended ({proc.returncode}) before {what}:\n{out[-4000:]}")
        if time.time() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def train_processes(out_dir: Path) -> list[int]:
    """PIDs of live training processes started for ``out_dir`` (via /proc)."""
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"train" in cmd and str(out_dir.resolve()).encode() in cmd:
            pids.append(int(d.name))
    return pids


def load_record(out: Path) -> dict:
    from hvdscale.record.build import validate_record

    rec = json.loads((Path(out) / "metrics.json").read_text())
    validate_record(rec)
    return rec


def check_plausible(rec: dict, workers: int, epochs: int, decreasing: bool = True) -> None:
    """Every field present (schema) and plausible. No wall-clock tolerance: whether time
    lands in the right phase is shown by the fault-injection test, not by sums that a busy
    machine can push past any bound."""
    assert rec["status"] == "completed" and rec["exit_status"] == 0 and rec["error"] is None
    assert rec["config"]["workers"] == workers
    assert len(rec["environment"]["hostnames"]) == workers
    assert len(rec["environment"]["devices"]) == workers
    assert rec["environment"]["config_hash"] and rec["environment"]["git_commit"]
    assert (
        rec["config"]["model_parameters"] == 153441 and rec["config"]["model_bytes"] == 4 * 153441
    )
    assert len(rec["epochs"]) == epochs == rec["summary"]["epochs_completed"]
    for e in rec["epochs"]:
        assert e["wall_s"] > 0 and e["throughput"] > 0 and e["time_train_s"] > 0
        assert e["samples"] == e["steps"] * rec["config"]["global_batch"]
        assert e["time_compute_s"] > 0 and e["time_update_s"] > 0 and e["time_data_s"] > 0
        assert e["time_dispatch_s"] >= 0
        if workers > 1:
            assert e["time_sync_s"] > 0
        assert e["train_loss"] is not None and e["val_loss"] is not None
    # the test split is evaluated once, after the stop decision: the last epoch only
    assert [e["test_loss"] is None for e in rec["epochs"]] == [True] * (epochs - 1) + [False]
    assert rec["summary"]["final_test_loss"] == rec["epochs"][-1]["test_loss"]
    assert [e["warmup"] for e in rec["epochs"]] == [
        i < rec["config"]["warmup_epochs"] for i in range(epochs)
    ]
    ela = [e["elapsed_s"] for e in rec["epochs"]]
    assert ela == sorted(ela)
    if decreasing:
        tr = [e["train_loss"] for e in rec["epochs"]]
        te = [e["val_loss"] for e in rec["epochs"]]
        assert tr[-1] < 0.5 * tr[0], tr
        assert te[-1] < te[0], te
    s = rec["summary"]
    assert s["epoch_time_median_s"] > 0 and s["throughput_median"] > 0
    assert (
        abs(s["sync_share"] + s["data_share"] + s["compute_share"] + s["update_share"] - 1) < 1e-3
    )
    assert rec["utilisation"]["kind"] in ("cpu", "gpu")
    assert rec["config"]["seed_base"] != rec["config"]["seed"]  # derived per repeat
    assert len(rec["initial_weights_sha256"]) == 64
    t = rec["target"]
    assert t["stop_reason"] in ("max_epochs", "target") and t["budget"]["max_epochs"] >= epochs
    assert t["best_val_loss"] == min(e["val_loss"] for e in rec["epochs"])
    inst = rec["timing"]["instrumentation"]
    assert inst["instrumented_steps"] == sum(e["timed_steps"] for e in rec["epochs"])
    # the gradient noise scale's sums: per epoch, only where ranks average gradients
    noisy = [e for e in rec["epochs"] if not e["warmup"] and e["noise_steps"]]
    assert bool(noisy) == (workers > 1), [e["noise_steps"] for e in rec["epochs"]]
    if noisy:  # averaging over ranks cuts the noise
        local, reduced = (sum(e[k] * e["noise_steps"] for e in noisy) for k in G_SQ)
        assert local > reduced > 0, noisy
    if rec["config"]["timeline_steps"] and workers > 1:  # the collective proven
        assert rec["label_proof"]["ok"] and rec["label_proof"]["collective"], rec["label_proof"]


def python_without_horovod(folder: Path, train_python: Path | str = TRAIN_PY) -> Path:
    """``folder/bin/python``: the train env's python, for which ``import horovod`` fails
    (a shadow package on its PYTHONPATH raises ImportError), as in an env without it."""
    shadow = folder / "shadow" / "horovod"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'horovod'\")\n")
    python = folder / "bin" / "python"
    python.parent.mkdir()
    python.write_text(
        f"#!/bin/sh\nexport PYTHONPATH={shadow.parent}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        f'exec {train_python} "$@"\n'
    )
    python.chmod(0o755)
    return python
