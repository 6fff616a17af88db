"""Data stage: physics, determinism, validation (pandera), split, manifest, file errors."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import build_dataset, make_data_config

from hvdscale.cli import main as cli_main
from hvdscale.data import check, h5, physics
from hvdscale.data.generate import shard_range
from hvdscale.data.split import split_dataset
from hvdscale.data.validate import CHECKS, validate_shard
from hvdscale.errors import DataError, UserError
from hvdscale.io import write_json_atomic


def params_for(cfg):
    return physics.GeneratorParams.from_config(cfg)


def copy_shard(src: Path, dst_dir: Path) -> Path:
    dst_dir.mkdir(parents=True, exist_ok=True)
    dst = dst_dir / src.name
    shutil.copyfile(src, dst)
    return dst


def run_cli(*args, cwd=None):
    """Run the real command line in a subprocess: (exit code, stdout, stderr)."""
    p = subprocess.run(
        [sys.executable, "-m", "hvdscale.cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )
    return p.returncode, p.stdout, p.stderr


# --------------------------------------------------------------------------- physics


def test_return_mapping_matches_closed_form_on_monotone_tension():
    E, sy, hh = 210000.0, np.array([300.0, 450.0]), np.array([1000.0, 15000.0])
    eps = np.linspace(0, 0.02, 401)[:, None].repeat(2, axis=1)
    sig = physics.return_mapping(eps, sy, hh, E)
    eps_y = sy / E
    e_t = E * hh / (E + hh)
    expected = np.where(eps <= eps_y, E * eps, sy + e_t * (eps - eps_y))
    np.testing.assert_allclose(sig, expected, rtol=1e-10, atol=1e-8)


def test_unloading_is_elastic_and_reverse_yield_uses_hardened_radius():
    E, sy, hh = 200000.0, np.array([400.0]), np.array([2000.0])
    path = np.concatenate([np.linspace(0, 0.01, 101), np.linspace(0.01, -0.01, 201)[1:]])[:, None]
    sig = physics.return_mapping(path, sy, hh, E)
    peak = 100
    alpha = (0.01 - 400.0 / E) * E / (E + 2000.0)  # plastic strain at the peak
    np.testing.assert_allclose(sig[peak, 0], 400.0 + 2000.0 * alpha, rtol=1e-9)
    # elastic unloading: slope E until the stress reaches -(sigma_y + H alpha)
    np.testing.assert_allclose(np.diff(sig[peak : peak + 5, 0]), E * -1e-4, rtol=1e-9)
    assert sig[:, 0].min() < -(400.0 + 2000.0 * alpha)  # then reverse plastic flow with hardening


def test_generated_curves_follow_the_documented_conventions(tiny_data_config):
    p = params_for(tiny_data_config)
    ids = np.arange(500)
    curves, labels = physics.generate_block(p, ids)
    strain, stress, flag = curves[..., 0], curves[..., 1], curves[..., 2]
    assert curves.dtype == np.float32 and curves.shape == (500, p.n_points, 3)
    assert labels.dtype == np.float32 and labels.shape == (500, 2)
    assert np.all(strain[:, 0] == 0) and np.all(flag[:, 0] == 1)
    d = np.diff(strain, axis=1)
    assert np.all((d > 0) == (flag[:, 1:] == 1)) and np.all(d != 0)
    assert np.all(np.isin(flag, [0, 1]))
    # `cycles` loading segments, each followed by an unloading segment
    starts_unloading = (flag[:, 1:-1] == 1) & (flag[:, 2:] == 0)
    assert np.all(starts_unloading.sum(axis=1) == p.cycles) and np.all(flag[:, -1] == 0)
    assert np.all(strain <= p.max_strain) and strain.max() > 0.9 * p.max_strain
    # peaks increase from cycle to cycle
    peaks = np.where(starts_unloading, strain[:, 1:-1], np.nan)
    peak_vals = np.sort(peaks[~np.isnan(peaks)].reshape(500, p.cycles), axis=1)
    assert np.all(np.diff(peak_vals, axis=1) > 0)
    # labels uniform in their ranges
    assert np.all((labels[:, 0] >= 200) & (labels[:, 0] <= 600))
    assert np.all((labels[:, 1] >= 500) & (labels[:, 1] <= 20000))
    # noise: stress minus the noise-free model is N(0, noise_std) and bounded
    sy, hh = labels[:, 0].astype(np.float64), labels[:, 1].astype(np.float64)
    clean = physics.return_mapping(
        np.ascontiguousarray(strain.T.astype(np.float64)), sy, hh, p.youngs_modulus
    ).T
    noise = stress - clean
    assert abs(noise.mean()) < 0.02 and abs(noise.std() - p.noise_std) < 0.02
    assert np.abs(noise).max() < 5.8 * p.noise_std


def test_normals_are_standard_and_bounded():
    z = physics.normals(7, np.arange(20000), physics.STREAM_NOISE, 100).astype(np.float64).ravel()
    assert abs(z.mean()) < 0.005 and abs(z.std() - 1) < 0.005
    assert abs(np.mean(z**4) - 3) < 0.05  # Gaussian kurtosis
    assert abs(np.mean(np.abs(z) > 1.959964) - 0.05) < 0.002
    assert np.abs(z).max() < 5.8


def test_generator_golden_checksum():
    """The bits of the first samples are pinned: any change to the generator shows up here."""
    p = params_for(make_data_config())
    curves, labels = physics.generate_block(p, np.arange(16))
    digest = hashlib.sha256(curves.tobytes() + labels.tobytes()).hexdigest()
    assert digest == GOLDEN_SHA256


GOLDEN_SHA256 = "3d029398eb431e5774a26358fdfac3613b895578a77a9f9209991d97e1dd3e1f"


def test_config_with_too_few_points_for_the_cycles_is_an_error():
    cfg = make_data_config(n_points=20, physics={"cycles": 10})
    with pytest.raises(UserError, match="n_points"):
        physics.GeneratorParams.from_config(cfg)


# --------------------------------------------------------------------------- determinism


def test_samples_do_not_depend_on_block_boundaries(tiny_data_config):
    p = params_for(tiny_data_config)
    whole, lab = physics.generate_block(p, np.arange(300, 700))
    parts = [physics.generate_block(p, np.arange(a, min(a + 97, 700))) for a in range(300, 700, 97)]
    assert np.array_equal(whole, np.concatenate([c for c, _ in parts]))
    assert np.array_equal(lab, np.concatenate([y for _, y in parts]))
    # a sample alone equals the same sample in a block
    one, _ = physics.generate_block(p, np.array([555]))
    assert np.array_equal(one[0], whole[255])


def test_same_config_gives_identical_checksums(tmp_path, tiny_dataset):
    again = build_dataset(tmp_path / "again", tiny_dataset["config"])
    assert again["manifest"] == tiny_dataset["manifest"]  # every sha256, count and statistic
    for a, b in zip(again["shards"], tiny_dataset["shards"]):
        assert check.sha256_file(a) == check.sha256_file(b)


def test_shard_count_does_not_change_any_sample(tmp_path, tiny_dataset):
    cfg3 = make_data_config(n_shards=3)
    other = build_dataset(tmp_path / "three", cfg3)
    assert len(other["shards"]) == 3
    c2, l2, i2 = h5.read_shards(tiny_dataset["shards"])
    c3, l3, i3 = h5.read_shards(other["shards"])
    assert np.array_equal(i2, np.arange(2000)) and np.array_equal(i3, np.arange(2000))
    assert np.array_equal(c2, c3) and np.array_equal(l2, l3)
    # the split shards, and therefore their checksums, are identical too
    assert other["manifest"]["shards"] == tiny_dataset["manifest"]["shards"]


def test_split_output_does_not_depend_on_worker_count(tmp_path, tiny_dataset):
    cfg = tiny_dataset["config"]
    m2 = split_dataset(
        cfg, tiny_dataset["shards"], tiny_dataset["validations"], tmp_path / "w2", workers=2
    )
    assert m2 == tiny_dataset["manifest"]


def test_shard_ranges_tile_the_ids():
    for n, s in [(2000, 2), (1001, 3), (16, 7), (1_000_000, 16)]:
        ranges = [shard_range(n, s, k) for k in range(s)]
        assert ranges[0][0] == 0 and ranges[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))


# --------------------------------------------------------------------------- split


def test_split_rule_ratio_on_a_million_ids():
    ids = np.arange(1_000_000)
    is_train = physics.split_is_train(20240601, ids, 0.75)
    assert abs(is_train.mean() - 0.75) < 0.005 * 0.75
    which = physics.split_assign(20240601, ids, 0.75, 0.1)
    n = {s: int((which == c).sum()) for s, c in physics.SPLIT_CODES.items()}
    assert sum(n.values()) == 1_000_000
    # the validation split is val_fraction of the train share (train + val)
    assert abs(n["val"] / (n["train"] + n["val"]) - 0.1) < 0.005
    # cut from the train share: the test split is the one without a validation split
    assert np.array_equal(which == physics.SPLIT_CODES["test"], ~is_train)


def test_split_rule_is_per_sample():
    """A sample's split depends only on (seed, id): any subset or order gives the same."""
    ids = np.arange(5000)
    whole = physics.split_assign(7, ids, 0.75, 0.2)
    perm = np.random.default_rng(0).permutation(5000)[:777]
    assert np.array_equal(physics.split_assign(7, perm, 0.75, 0.2), whole[perm])
    assert not np.array_equal(physics.split_assign(8, ids, 0.75, 0.2), whole)


@pytest.mark.slow
def test_split_ratio_end_to_end(tmp_path):
    # 120000 samples: the binomial std of the fraction is 0.0013, so 0.5 % is > 3 sigma
    cfg = make_data_config(
        n_samples=120_000,
        n_shards=2,
        split_shards={"train": 3, "val": 1, "test": 1},
        chunk_samples=1024,
    )
    ds = build_dataset(tmp_path, cfg)
    c = ds["manifest"]["counts"]
    assert c["train"] + c["val"] + c["test"] == 120_000
    assert abs((c["train"] + c["val"]) / 120_000 - 0.75) < 0.005
    assert abs(c["val"] / (c["train"] + c["val"]) - 0.1) < 0.005
    assert abs(c["test"] / 120_000 - 0.25) < 0.005


def test_every_sample_in_exactly_one_split_in_order(tiny_dataset):
    m = tiny_dataset["manifest"]
    d = tiny_dataset["data_dir"]
    ids = {}
    for s in ("train", "val", "test"):
        paths = check.shard_paths(d, s, m)
        assert [p.name for p in paths] == [f"shard-{i:04d}.h5" for i in range(len(paths))]
        assert all(p.parent.name == s for p in paths)
        sizes = [h5.inspect_shard(p)["n"] for p in paths]
        assert max(sizes) - min(sizes) <= 1
        _, _, ids[s] = h5.read_shards(paths)
        assert np.all(np.diff(ids[s]) > 0)  # ascending, no duplicates
        assert m["counts"][s] == len(ids[s]) == sum(sizes) > 0
    every = np.concatenate([ids["train"], ids["val"], ids["test"]])
    assert np.array_equal(np.sort(every), np.arange(2000))  # each sample exactly once
    which = physics.split_assign(m["seed"], np.arange(2000), m["train_fraction"], m["val_fraction"])
    for s, code in physics.SPLIT_CODES.items():
        assert np.array_equal(np.flatnonzero(which == code), ids[s])
    # about val_fraction of the train share (2000 curves: 1500 +- 17 in the train share)
    share = m["counts"]["val"] / (m["counts"]["train"] + m["counts"]["val"])
    assert abs(share - m["val_fraction"]) < 0.03
    assert len(m["shards"]["val"]) == tiny_dataset["config"]["data"]["split_shards"]["val"]


def test_val_fraction_leaves_the_test_split_unchanged(tmp_path, tiny_dataset):
    cfg = make_data_config(val_fraction=0.3)
    other = build_dataset(tmp_path / "val30", cfg)
    m0, m1 = tiny_dataset["manifest"], other["manifest"]
    # the same test samples (the files differ only in their val_fraction attribute)
    a = h5.read_shards(check.shard_paths(tiny_dataset["data_dir"], "test", m0))
    b = h5.read_shards(check.shard_paths(other["data_dir"], "test", m1))
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert (
        m1["counts"]["train"] + m1["counts"]["val"] == m0["counts"]["train"] + m0["counts"]["val"]
    )
    assert m1["counts"]["val"] > m0["counts"]["val"]


def test_check_data_counts_the_validation_split(tmp_path, tiny_dataset):
    m = check.verify_data_dir(tiny_dataset["data_dir"], verify_checksums=True)
    assert set(m["shards"]) == {"train", "val", "test"}
    bad = json.loads((tiny_dataset["data_dir"] / check.MANIFEST_NAME).read_text())
    bad["counts"]["val"] += 1
    d = tmp_path / "bad"
    d.mkdir()
    (d / check.MANIFEST_NAME).write_text(json.dumps(bad))
    with pytest.raises(DataError, match="shards.val"):
        check.load_manifest(d)


def test_split_shards_keep_the_samples_and_attributes(tiny_dataset):
    raw_c, raw_l, raw_i = h5.read_shards(tiny_dataset["shards"])
    p = check.shard_paths(tiny_dataset["data_dir"], "test")[0]
    c, y, i = h5.read_shard(p)
    assert np.array_equal(c, raw_c[i]) and np.array_equal(y, raw_l[i])
    attrs = h5.inspect_shard(p)["attrs"]
    assert attrs["format_version"] == 1 and attrs["seed"] == 20240601
    assert attrs["channel_names"] == ["strain", "stress", "flag"]
    assert attrs["label_names"] == ["yield_stress", "hardening_modulus"]
    assert attrs["label_units"] == ["MPa", "MPa"]
    assert attrs["label_min"] == [200.0, 500.0] and attrs["label_max"] == [600.0, 20000.0]
    with h5py.File(p) as fh:
        assert fh["curves"].chunks[0] == 256 and fh["curves"].compression is None


def test_read_range_reads_a_slice_across_shards(tiny_dataset):
    paths = check.shard_paths(tiny_dataset["data_dir"], "train")
    c_all, l_all, i_all = h5.read_shards(paths)
    n0 = h5.inspect_shard(paths[0])["n"]
    for a, b in [
        (0, 10),
        (n0 - 5, n0 + 7),
        (0, len(i_all)),
        (n0, n0),
        (len(i_all) - 3, len(i_all)),
    ]:
        c, y, i = h5.read_range(paths, a, b)
        assert (
            np.array_equal(c, c_all[a:b])
            and np.array_equal(y, l_all[a:b])
            and np.array_equal(i, i_all[a:b])
        )
    with pytest.raises(DataError, match="outside"):
        h5.read_range(paths, 0, len(i_all) + 1)


def test_normalisation_statistics_come_from_the_train_split(tiny_dataset):
    m = tiny_dataset["manifest"]
    c, y, _ = h5.read_shards(check.shard_paths(tiny_dataset["data_dir"], "train", m))
    c64, l64 = c.astype(np.float64), y.astype(np.float64)
    nm = check.normalisation(m)
    np.testing.assert_allclose(nm["curve_mean"], c64.mean(axis=(0, 1)), rtol=1e-6)
    np.testing.assert_allclose(nm["curve_std"], c64.std(axis=(0, 1)), rtol=1e-6)
    np.testing.assert_allclose(nm["label_mean"], l64.mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(nm["label_std"], l64.std(axis=0), rtol=1e-6)
    assert m["normalisation"]["source"] == "train split"


# --------------------------------------------------------------------------- validation


def _set(name, index, value):
    def mutate(fh):
        ds = fh[name]
        ds[index] = value

    return mutate


def _flip_flag_inside_loading(fh):
    c = fh["curves"][8]
    j = int(np.flatnonzero(c[1:, 2] == 1)[3]) + 1  # a loading point
    fh["curves"][8, j, 2] = 0.0


def _duplicate_id(fh):
    fh["sample_id"][3] = fh["sample_id"][2]


CORRUPTIONS = {
    "nan_stress": (_set("curves", (5, 10, 1), np.nan), "all_values_finite", 5),
    "inf_label": (_set("labels", (6, 1), np.inf), "all_values_finite", 6),
    "bad_flag_value": (_set("curves", (7, 20, 2), 0.5), "flag_in_0_1", 7),
    "flag_inconsistent_with_strain": (
        _flip_flag_inside_loading,
        "flag_consistent_with_strain_path",
        8,
    ),
    "non_physical_stress": (_set("curves", (11, 50, 1), 5.0e4), "stress_within_physical_bound", 11),
    "yield_stress_out_of_range": (_set("labels", (13, 0), 700.0), "yield_stress_in_range", 13),
    "hardening_out_of_range": (_set("labels", (14, 1), 25000.0), "hardening_modulus_in_range", 14),
    "strain_beyond_max": (_set("curves", (15, 199, 0), 0.05), "strain_within_max_strain", 15),
    "first_point_moved": (_set("curves", (16, 0, 0), -1e-3), "first_point_at_origin", 16),
    "duplicate_sample_id": (_duplicate_id, "sample_id_unique", 2),
}


def test_validation_accepts_clean_data(tiny_dataset):
    report = validate_shard(tiny_dataset["config"], tiny_dataset["shards"][1])
    assert report["passed"] is True and report["n_samples"] == 1000
    assert report["id_start"] == 1000 and report["id_stop"] == 2000
    assert set(report["checks"]) == set(CHECKS)
    assert report["sha256"] == check.sha256_file(tiny_dataset["shards"][1])


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
def test_validation_rejects_corruption(kind, tmp_path, tiny_dataset):
    mutate, check_name, row = CORRUPTIONS[kind]
    src = tiny_dataset["shards"][1]  # ids 1000..1999
    shard = copy_shard(src, tmp_path)
    with h5py.File(shard, "r+") as fh:
        mutate(fh)
    with pytest.raises(DataError) as exc:
        validate_shard(tiny_dataset["config"], shard)
    msg = str(exc.value)
    assert str(shard) in msg and check_name in msg
    assert str(1000 + row) in msg.split(check_name, 1)[1].split(";")[0]  # the offending sample id


def test_validate_cli_failure_writes_nothing(tmp_path, tiny_dataset):
    shard = copy_shard(tiny_dataset["shards"][0], tmp_path)
    with h5py.File(shard, "r+") as fh:
        fh["curves"][42, 3, 1] = np.nan
    out = tmp_path / "v.json"
    rc, _, err = run_cli(
        "validate-shard", "--config", tiny_dataset["config_file"], "--shard", shard, "--out", out
    )
    assert rc == 2
    assert "all_values_finite" in err and "42" in err and str(shard) in err
    assert "Traceback" not in err
    assert not out.exists() and not list(tmp_path.glob(".v.json*"))


def test_validation_rejects_shard_from_another_config(tmp_path, tiny_dataset):
    other = make_data_config(seed=1)
    with pytest.raises(DataError, match="seed"):
        validate_shard(other, tiny_dataset["shards"][0])


# --------------------------------------------------------------------------- file errors


def _truncated(tmp_path, tiny_dataset):
    p = copy_shard(tiny_dataset["shards"][0], tmp_path)
    size = p.stat().st_size
    with open(p, "r+b") as fh:
        fh.truncate(size // 2)
    return p


def _not_hdf5(tmp_path, tiny_dataset):
    p = tmp_path / "shard-0000.h5"
    p.write_text("this is not an HDF5 file\n" * 100)
    return p


def _missing_dataset(tmp_path, tiny_dataset):
    p = tmp_path / "shard-0000.h5"
    with h5py.File(p, "w") as fh:
        fh["curves"] = np.zeros((4, 200, 3), np.float32)
        fh["labels"] = np.zeros((4, 2), np.float32)
    return p


def _wrong_dtype(tmp_path, tiny_dataset):
    p = tmp_path / "shard-0000.h5"
    with h5py.File(p, "w") as fh:
        fh["curves"] = np.zeros((4, 200, 3), np.float64)
        fh["labels"] = np.zeros((4, 2), np.float32)
        fh["sample_id"] = np.arange(4)
    return p


def _wrong_shape(tmp_path, tiny_dataset):
    p = tmp_path / "shard-0000.h5"
    with h5py.File(p, "w") as fh:
        fh["curves"] = np.zeros((4, 200, 2), np.float32)
        fh["labels"] = np.zeros((4, 2), np.float32)
        fh["sample_id"] = np.arange(4)
    return p


def _empty_file(tmp_path, tiny_dataset):
    p = tmp_path / "shard-0000.h5"
    p.write_bytes(b"")
    return p


BAD_FILES = {
    "truncated": (_truncated, "truncated"),
    "not_hdf5": (_not_hdf5, "not a readable HDF5 file"),
    "empty": (_empty_file, "not a readable HDF5 file"),
    "missing_dataset": (_missing_dataset, "sample_id"),
    "wrong_dtype": (_wrong_dtype, "dtype float64"),
    "wrong_shape": (_wrong_shape, "shape"),
}


@pytest.mark.parametrize("kind", sorted(BAD_FILES))
def test_bad_file_is_a_data_error_naming_the_file(kind, tmp_path, tiny_dataset):
    make, words = BAD_FILES[kind]
    p = make(tmp_path, tiny_dataset)
    for fn in (h5.read_shard, h5.inspect_shard, lambda x: h5.read_shards([x])):
        with pytest.raises(DataError) as exc:
            fn(p)
        assert str(p) in str(exc.value) and words in str(exc.value)
    with pytest.raises(DataError, match=str(p)):
        validate_shard(tiny_dataset["config"], p)


@pytest.mark.parametrize("kind", ["truncated", "not_hdf5", "missing_dataset"])
def test_bad_file_via_cli_exits_2_without_traceback(kind, tmp_path, tiny_dataset):
    make, words = BAD_FILES[kind]
    p = make(tmp_path, tiny_dataset)
    out = tmp_path / "out.json"
    rc, _, err = run_cli(
        "validate-shard", "--config", tiny_dataset["config_file"], "--shard", p, "--out", out
    )
    assert rc == 2, err
    assert "Traceback" not in err and str(p) in err and words in err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_missing_file_and_nan_are_data_errors(tmp_path, tiny_dataset):
    with pytest.raises(DataError, match="not found"):
        h5.read_shard(tmp_path / "nope.h5")
    p = copy_shard(tiny_dataset["shards"][0], tmp_path)
    with h5py.File(p, "r+") as fh:
        fh["curves"][17, 5, 0] = np.nan
    with pytest.raises(DataError) as exc:
        h5.read_shard(p)
    assert str(p) in str(exc.value) and "sample_id 17" in str(exc.value)
    c, _, _ = h5.read_shard(p, check=False)  # validation reads without the check
    assert np.isnan(c[17, 5, 0])


def test_generate_cli_bad_shard_index(tmp_path, tiny_data_config_file):
    rc, _, err = run_cli(
        "generate-shard",
        "--config",
        tiny_data_config_file,
        "--shard",
        "5",
        "--out",
        tmp_path / "x.h5",
    )
    assert rc == 2 and "--shard 5" in err and "Traceback" not in err
    assert not (tmp_path / "x.h5").exists()


def test_generate_cli_writes_a_valid_shard(tmp_path, tiny_data_config_file, tiny_dataset):
    out = tmp_path / "raw" / "shard-0001.h5"
    assert (
        cli_main(
            [
                "generate-shard",
                "--config",
                str(tiny_data_config_file),
                "--shard",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert check.sha256_file(out) == check.sha256_file(tiny_dataset["shards"][1])
    assert [f.name for f in out.parent.iterdir()] == ["shard-0001.h5"]  # no temporary file left


# --------------------------------------------------------------------------- split refusals


def _outputs(outdir: Path) -> list[str]:
    return (
        sorted(str(p.relative_to(outdir)) for p in outdir.rglob("*") if p.is_file())
        if outdir.exists()
        else []
    )


def test_split_refuses_shard_without_validation(tmp_path, tiny_dataset):
    out = tmp_path / "data"
    with pytest.raises(DataError, match="no validation report") as exc:
        split_dataset(
            tiny_dataset["config"], tiny_dataset["shards"], tiny_dataset["validations"][:1], out
        )
    assert str(tiny_dataset["shards"][1]) in str(exc.value)
    assert _outputs(out) == []


def test_split_refuses_failed_or_stale_validation(tmp_path, tiny_dataset):
    raw = tmp_path / "raw"
    shards = [copy_shard(s, raw) for s in tiny_dataset["shards"]]
    vals = []
    for v in tiny_dataset["validations"]:
        rep = json.loads(v.read_text())
        rep["mtime_ns"] = (raw / rep["shard_file"]).stat().st_mtime_ns
        vals.append(raw / v.name)
        write_json_atomic(vals[-1], rep)
    out = tmp_path / "data"
    # a failed validation
    rep = json.loads(vals[0].read_text())
    write_json_atomic(vals[0], dict(rep, passed=False))
    with pytest.raises(DataError, match="did not pass"):
        split_dataset(tiny_dataset["config"], shards, vals, out)
    write_json_atomic(vals[0], rep)
    # the shard changed after validation (same size, new content)
    with h5py.File(shards[0], "r+") as fh:
        fh["curves"][0, 1, 1] = 1e6
    with pytest.raises(DataError, match="changed since validation"):
        split_dataset(tiny_dataset["config"], shards, vals, out)
    assert _outputs(out) == []


def test_split_refuses_incomplete_shard_set_and_via_cli(tmp_path, tiny_dataset):
    out = tmp_path / "data"
    rc, _, err = run_cli(
        "split-dataset",
        "--config",
        tiny_dataset["config_file"],
        "--shards",
        tiny_dataset["shards"][1],
        "--validations",
        *tiny_dataset["validations"],
        "--outdir",
        out,
    )
    assert rc == 2 and "sample ids 0..999 missing" in err and "Traceback" not in err
    assert _outputs(out) == []


def test_split_failure_midway_leaves_no_output(tmp_path, tiny_dataset, monkeypatch):
    from hvdscale.data import split as split_mod

    real = h5.iter_blocks
    calls = []

    def failing(path, *a, **kw):
        calls.append(path)
        if len(calls) == 2:
            raise DataError(f"{path}: simulated read failure")
        yield from real(path, *a, **kw)

    monkeypatch.setattr(split_mod.h5, "iter_blocks", failing)
    out = tmp_path / "data"
    with pytest.raises(DataError, match="simulated"):
        split_dataset(
            tiny_dataset["config"], tiny_dataset["shards"], tiny_dataset["validations"], out
        )
    assert _outputs(out) == []


# --------------------------------------------------------------------------- check-data


def test_check_data_accepts_the_dataset(tiny_dataset, capsys):
    assert (
        cli_main(["check-data", "--data-dir", str(tiny_dataset["data_dir"]), "--verify-checksums"])
        == 0
    )
    assert "OK" in capsys.readouterr().err
    m = check.verify_data_dir(tiny_dataset["data_dir"], verify_checksums=True)
    assert m["counts"]["total"] == 2000


def test_check_data_names_the_bad_file(tmp_path, tiny_dataset):
    d = tmp_path / "data"
    shutil.copytree(tiny_dataset["data_dir"], d)
    victim = d / "train" / "shard-0001.h5"
    with open(victim, "r+b") as fh:  # flip one data byte: only the checksum can tell
        fh.seek(victim.stat().st_size - 1000)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0xFF]))
    check.verify_data_dir(d)  # structure still fine
    with pytest.raises(DataError, match="sha256") as exc:
        check.verify_data_dir(d, verify_checksums=True)
    assert str(victim) in str(exc.value)
    victim.unlink()
    rc, _, err = run_cli("check-data", "--data-dir", d)
    assert rc == 2 and str(victim) in err and "missing" in err and "Traceback" not in err


def test_check_data_without_manifest(tmp_path):
    with pytest.raises(DataError, match="manifest.json: not found"):
        check.load_manifest(tmp_path)


def test_training_side_modules_import_without_pandas():
    code = (
        "import sys, hvdscale.data.h5, hvdscale.data.check; "
        "bad = [m for m in sys.modules "
        "if m.split('.')[0] in ('pandas', 'pandera', 'jsonschema', 'yaml')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
