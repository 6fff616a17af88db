"""Workloads (the model and data of a study): the interface, the digits workload, the
refusals at check-config / snakemake -n, import-data, the default's unchanged slices, and
a user's workload defined in a module outside the package (a tiny model on NumPy arrays)
through snakemake with the local profile to a report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from required_layers import require_layer
from slurm_support import horovod_skip_reason
from test_pipeline import ROOT, pdftext, records, results_dir, snakemake  # noqa: F401

from hvdscale.config.load import data_section, validate_config
from hvdscale.data import h5
from hvdscale.data.check import verify_data_dir
from hvdscale.errors import ConfigError
from hvdscale.matrix.runtable import run_config, run_table
from hvdscale.workload.base import (
    VAL_ACCURACY,
    VAL_LOSS,
    Layout,
    check_workload,
    layers_parameter_count,
)

HVD = [sys.executable, "-m", "hvdscale.cli"]
# long training runs: in the stream "apart" of tests/run.sh, beside the rest
pytestmark = pytest.mark.stream("apart")

# a user's workload: 3 classes of 4 features, a Dense net, outside the package
USER_MODULE = """
from hvdscale.workload.arrays import ArrayWorkload

WORKLOAD = ArrayWorkload(
    "blobs", {path!r}, layers=[("dense", 8, "relu"), ("dense", 3, None)],
    sample_shape=(4,), n_classes=3,
)
WRONG_SHAPE = ArrayWorkload(
    "blobs", {path!r}, layers=[("dense", 8, "relu"), ("dense", 3, None)],
    sample_shape=(5,), n_classes=3,
)

class NoLayout:
    name = "half"
    loss = "mse"
"""


def blobs(path: Path, n: int = 600) -> Path:
    """Three separable classes of 4 features (float64, as users have them), int labels."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, size=n)
    x = rng.normal(size=(n, 4)) * 0.3 + np.eye(3, 4)[y] * 2.0
    np.savez(path, x=x, y=y)
    return path


@pytest.fixture
def user_module(tmp_path):
    data = blobs(tmp_path / "blobs.npz")
    (tmp_path / "my_workload.py").write_text(USER_MODULE.format(path=str(data)))
    return tmp_path


def check_config(tmp_path: Path, workload: str, env_path: Path) -> subprocess.CompletedProcess:
    cfg = tmp_path / f"cfg-{abs(hash(workload))}.yaml"
    cfg.write_text(yaml.safe_dump({"workload": workload}))
    env = {**os.environ, "PYTHONPATH": str(env_path)}
    return subprocess.run(
        [*HVD, "check-config", "--quiet", str(cfg)], capture_output=True, text=True, env=env
    )


# ------------------------------------------------------------------ the interface


def test_default_workload_keeps_slices_and_data_section():
    cfg = validate_config({})
    assert "workload" not in cfg  # the default stays out: full config and hashes as before
    assert "workload" not in data_section(cfg)
    for run in run_table(cfg)[:3]:
        assert "workload" not in run_config(cfg, run.run_id)
    wl = check_workload(cfg)
    assert wl.metric is VAL_LOSS and wl.loss == "mse"
    assert wl.parameter_count(cfg) == 153441  # the closed form of trainer.model


def test_digits_workload_declares_its_parts_and_is_deterministic_per_sample():
    cfg = validate_config({"workload": "digits", "data": {"n_samples": 5000}})
    wl = check_workload(cfg)
    assert wl.metric is VAL_ACCURACY and wl.loss == "cross_entropy"
    assert wl.layout(cfg) == Layout((8, 8, 1), (), "float32", "int64", 10)
    assert wl.parameter_count(cfg) == layers_parameter_count(wl.layers(cfg), (8, 8, 1)) == 10090
    x, y = wl.samples(cfg, np.arange(2000, 2010))
    x1, y1 = wl.samples(cfg, np.array([2005]))
    np.testing.assert_array_equal(x[5], x1[0])  # sample i depends on (seed, i) only
    assert y[5] == y1[0] and x.dtype == np.float32 and 0 <= x.min() and x.max() <= 1
    other = validate_config({"workload": "digits", "seed": 1})
    assert not np.array_equal(wl.samples(other, np.array([2005]))[0], x1)
    assert "workload" in data_section(cfg) and "workload" in run_config(
        cfg, run_table(cfg)[0].run_id
    )


def test_layout_problems_name_shape_dtype_finiteness_and_class_range():
    lay = Layout((4,), (), "float32", "int64", 3)
    x = np.zeros((5, 4), np.float32)
    assert lay.problems(x, np.zeros(5, np.int64), "s") == []
    assert "declared (5,)" in " ".join(
        Layout((5,), (), "float32", "int64", 3).problems(x, np.zeros(5, np.int64), "s")
    )
    bad = x.copy()
    bad[2, 1] = np.nan
    assert "NaN" in lay.problems(bad, np.zeros(5, np.int64), "s")[0]
    assert "outside the classes 0..2" in lay.problems(x, np.array([0, 1, 3, 0, 0]), "s")[0]
    assert "dtype float64" in lay.problems(x.astype(np.float64), np.zeros(5, np.int64), "s")[0]


# ------------------------------------------------------------------ refusals


def test_check_config_refuses_a_workload_that_cannot_be_imported(tmp_path):
    out = check_config(tmp_path, "no_such_module_xyz:WORKLOAD", tmp_path)
    assert out.returncode != 0
    assert "cannot import module 'no_such_module_xyz'" in out.stderr


def test_check_config_refuses_a_workload_lacking_a_part(user_module):
    out = check_config(user_module, "my_workload:NoLayout", user_module)
    assert out.returncode != 0
    assert "my_workload:NoLayout" in out.stderr and "lacks" in out.stderr
    out = check_config(user_module, "my_workload:MISSING", user_module)
    assert out.returncode != 0 and "has no object 'MISSING'" in out.stderr


def test_check_config_refuses_data_that_do_not_match_the_declared_shapes(user_module):
    out = check_config(user_module, "my_workload:WRONG_SHAPE", user_module)
    assert out.returncode != 0
    assert "do not match its declared layout" in out.stderr and "declared (5,)" in out.stderr
    ok = check_config(user_module, "my_workload:WORKLOAD", user_module)
    assert ok.returncode == 0, ok.stderr
    assert "workload blobs" in ok.stdout and "67 parameters" in ok.stdout


def test_snakemake_dry_run_refuses_a_workload_that_cannot_be_imported(tmp_path):
    over = tmp_path / "bad.yaml"
    over.write_text(yaml.safe_dump({"workload": "no_such_module_xyz:WORKLOAD"}))
    out = snakemake(["-n", "--configfile", ".test/config/config.yaml", str(over)])
    assert out.returncode != 0
    assert "cannot import module 'no_such_module_xyz'" in out.stdout + out.stderr


def test_check_workload_in_process_names_the_key():
    with pytest.raises(ConfigError, match="config key workload"):
        check_workload(validate_config({"workload": "no_such_module_xyz:W"}))


def test_digits_split_is_decided_per_source_image(tmp_path):
    """Shifted, noisy copies of one load_digits image share a split (decided from (seed,
    k) for source image k), so no image is in two splits; the split is the same again."""
    from hvdscale.data.physics import SPLIT_CODES, split_assign
    from hvdscale.workload import shards

    cfg = validate_config(
        {"workload": "digits", "data": {"n_samples": 4000, "n_shards": 1,
         "split_shards": {"train": 1, "val": 1, "test": 1}}}
    )  # fmt: skip
    wl = check_workload(cfg)
    raw, rep = tmp_path / "raw.h5", tmp_path / "raw.json"
    shards.generate_shard(cfg, wl, 0, raw)
    shards.validate_shard(cfg, wl, raw, rep)

    def split_ids(outdir):
        m = shards.split(cfg, wl, [raw], [rep], outdir)
        return m, {s: h5.read_shard(outdir / m["shards"][s][0]["file"])[2] for s in m["shards"]}

    m, ids = split_ids(tmp_path / "data")
    images = {s: set((v % 1797).tolist()) for s, v in ids.items()}
    assert not images["train"] & images["val"] and not images["train"] & images["test"]
    assert not images["val"] & images["test"]  # no source image in two splits
    assert sum(len(v) for v in ids.values()) == 4000 and min(map(len, ids.values())) > 100
    for s, v in ids.items():  # each sample's split: split_assign of its source image
        d = cfg["data"]
        codes = split_assign(int(cfg["seed"]), v % 1797, d["train_fraction"], d["val_fraction"])
        assert (codes == SPLIT_CODES[s]).all()
    assert "source image" in m["split_rule"]
    m2, ids2 = split_ids(tmp_path / "again")
    assert all(np.array_equal(ids[s], ids2[s]) for s in ids)
    verify_data_dir(tmp_path / "data", verify_checksums=True)


# ------------------------------------------------------------------ import-data


def test_import_data_writes_a_checksummed_split_dataset(tmp_path):
    src = blobs(tmp_path / "blobs.npz")
    out = subprocess.run(
        [*HVD, "import-data", "--input", str(src), "--n-classes", "3", "--seed", "7",
         "--out", str(tmp_path / "data")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    m = verify_data_dir(tmp_path / "data", verify_checksums=True)
    assert m["counts"]["total"] == 600 and m["layout"]["sample_shape"] == [4]
    ids = np.concatenate([
        h5.read_shard(tmp_path / "data" / e["file"])[2] for s in ("train", "val", "test")
        for e in m["shards"][s]
    ])  # fmt: skip
    assert sorted(ids.tolist()) == list(range(600))  # every sample in exactly one split
    x, y, _ = h5.read_shard(tmp_path / "data" / m["shards"]["train"][0]["file"])
    assert x.dtype == np.float32 and y.dtype == np.int64 and set(np.unique(y)) <= {0, 1, 2}
    again = subprocess.run(
        [*HVD, "import-data", "--input", str(src), "--n-classes", "3", "--seed", "7",
         "--out", str(tmp_path / "data2")], capture_output=True, text=True,
    )  # fmt: skip
    assert again.returncode == 0
    m2 = json.loads((tmp_path / "data2" / "manifest.json").read_text())
    assert [e["sha256"] for e in m2["shards"]["train"]] == [
        e["sha256"] for e in m["shards"]["train"]
    ]  # the same input and seed: the same bytes
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.ones((10, 4)), y=np.arange(10))
    refused = subprocess.run(
        [*HVD, "import-data", "--input", str(bad), "--n-classes", "3",
         "--out", str(tmp_path / "d3")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode != 0 and "outside the classes 0..2" in refused.stderr


def test_imported_data_pass_check_data_and_are_the_study_data_stage(
    user_module,
    results_dir,  # noqa: F811
):
    """import-data runs a study's data stage: its directory passes check-data, and a study
    whose workload reads the same arrays (snakemake -n plans it; its data stage runs)
    makes the same shards, byte for byte, from the same seed and shard counts."""
    imported = user_module / "imported"
    out = subprocess.run(
        [*HVD, "import-data", "--input", str(user_module / "blobs.npz"), "--n-classes", "3",
         "--name", "blobs", "--seed", "11", "--shards", "2", "1", "1", "--out", str(imported)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    check = subprocess.run(
        [*HVD, "check-data", "--data-dir", str(imported), "--verify-checksums"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert check.returncode == 0, check.stderr
    over = user_module / "overlay.yaml"
    over.write_text(
        yaml.safe_dump(
            {"seed": 11, "workload": "my_workload:WORKLOAD", "model": {"expected_parameters": None},
             "data": {"n_shards": 1, "split_shards": {"train": 2, "val": 1, "test": 1}},
             "training": {"target": {"mode": "absolute", "value": 0.9}}}
        )
    )  # fmt: skip
    env = {"PYTHONPATH": str(user_module)}
    base = ["--configfile", ".test/config/config.yaml", str(over), "--config",
            f"results_dir={results_dir}"]  # fmt: skip
    plan = snakemake(["-n", "--profile", "profiles/local", *base], env=env)
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
    manifest = f"{results_dir}/data/manifest.json"
    made = snakemake(["--profile", "profiles/local", *base, "--", manifest], env=env)
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-2000:]
    study = json.loads((ROOT / manifest).read_text())
    mine = json.loads((imported / "manifest.json").read_text())
    for key in ("counts", "layout", "split_rule", "normalisation", "workload"):
        assert study[key] == mine[key], key
    sums = {s: [e["sha256"] for e in mine["shards"][s]] for s in mine["shards"]}
    assert sums == {s: [e["sha256"] for e in study["shards"][s]] for s in study["shards"]}


# ------------------------------------------------------------------ through the pipeline


@pytest.mark.slow
@pytest.mark.horovod
def test_user_workload_outside_the_package_through_snakemake_to_a_report(
    user_module,
    results_dir,  # noqa: F811
):
    require_layer("horovod", horovod_skip_reason())
    over = user_module / "overlay.yaml"
    over.write_text(
        yaml.safe_dump(
            {
                "workload": "my_workload:WORKLOAD",
                "model": {"expected_parameters": None},
                "data": {"n_shards": 1, "split_shards": {"train": 2, "val": 1, "test": 1}},
                "training": {"max_epochs": 3, "warmup_epochs": 1, "repeats": 1,
                             "target": {"mode": "absolute", "value": 0.9}},
                "scaling": {"sweeps": [{"name": "user", "partitions": ["local"],
                            "workers": [1, 2], "backends": ["gloo"], "batch_sizes": [32],
                            "lr_rules": ["none"]}], "tune": None},
            }
        )
    )  # fmt: skip
    env = {"PYTHONPATH": str(user_module)}
    report = f"{results_dir}/report.pdf"
    out = snakemake(
        ["--profile", "profiles/local", "--configfile", ".test/config/config.yaml", str(over),
         "--config", f"results_dir={results_dir}", "--", report], env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    manifest = json.loads((ROOT / results_dir / "data" / "manifest.json").read_text())
    assert manifest["workload"] == "blobs" and manifest["counts"]["total"] == 600
    recs = records(results_dir)
    assert sorted(recs) == ["local_gloo_n1_w1_b32_lrnone_r0", "local_gloo_n1_w2_b32_lrnone_r0"]
    for rec in recs.values():
        assert rec["status"] == "completed" and rec["config"]["workload"] == "my_workload:WORKLOAD"
        assert rec["config"]["model_parameters"] == 67
        assert rec["target"]["metric"] == "val_accuracy"
        accs = [e["val_accuracy"] for e in rec["epochs"]]
        assert all(0.0 <= a <= 1.0 for a in accs)
        # reached exactly when an epoch's validation accuracy is at or above 0.9
        assert rec["target"]["reached"] == any(a >= 0.9 for a in accs)
    target = json.loads((ROOT / results_dir / "scaling" / "target.json").read_text())
    assert target["metric"] == "val_accuracy" and target["value"] == 0.9
    text = pdftext(ROOT / report)
    assert "validation accuracy 0.9" in text and "blobs" in text and "67" in text
