"""Shared pytest fixtures (generic: usable by the data, training and workflow tests)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from required_layers import pytest_configure as required_layers_configure
from required_layers import (  # noqa: F401  (hooks: HVDSCALE_REQUIRE_LAYERS, issue 29)
    pytest_make_collect_report,
    pytest_report_header,
    pytest_runtest_makereport,
)
from streams import select_stream, wanted_stream

from hvdscale.config.load import data_section, validate_config


def pytest_configure(config: pytest.Config) -> None:
    required_layers_configure(config)
    wanted_stream()  # a bad HVDSCALE_TEST_STREAM stops the run before any test


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Only the stream HVDSCALE_TEST_STREAM names, if set (tests/streams.py, tests/run.sh)."""
    select_stream(config, items)


def make_data_config(**data) -> dict:
    """A validated data-section config ``{"seed", "data"}``; ``data`` overrides the defaults.

    ``seed`` may be passed too. Small defaults: 2000 curves in 2 generation shards,
    split into 2 train and 1 test shard, HDF5 chunks of 256 samples.
    """
    seed = data.pop("seed", 20240601)
    base = {
        "n_samples": 2000,
        "n_shards": 2,
        "split_shards": {"train": 2, "test": 1},
        "chunk_samples": 256,
    }
    base.update(data)
    return data_section(validate_config({"seed": seed, "data": base}))


def write_data_config(path: Path, cfg: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(cfg, indent=2))
    return path


def build_dataset(workdir: Path, cfg: dict) -> dict:
    """Run generate -> validate -> split in-process; returns the paths involved."""
    from hvdscale.data.generate import generate_shard
    from hvdscale.data.split import split_dataset
    from hvdscale.data.validate import validate_shard
    from hvdscale.io import write_json_atomic

    workdir = Path(workdir)
    raw = workdir / "raw"
    shards, validations = [], []
    for k in range(cfg["data"]["n_shards"]):
        shard = raw / f"shard-{k:04d}.h5"
        generate_shard(cfg, k, shard)
        report = validate_shard(cfg, shard)
        vpath = raw / f"shard-{k:04d}.validation.json"
        write_json_atomic(vpath, report)
        shards.append(shard)
        validations.append(vpath)
    data_dir = workdir / "data"
    manifest = split_dataset(cfg, shards, validations, data_dir)
    return {
        "config": cfg,
        "config_file": write_data_config(workdir / "data.json", cfg),
        "raw_dir": raw,
        "shards": shards,
        "validations": validations,
        "data_dir": data_dir,
        "manifest": manifest,
    }


@pytest.fixture
def tiny_data_config() -> dict:
    """A validated data-section config with 2000 curves (2 generation shards)."""
    return make_data_config()


@pytest.fixture
def tiny_data_config_file(tmp_path, tiny_data_config) -> Path:
    """``tiny_data_config`` written as JSON.

    (What ``hvdscale write-config --section data`` writes.)
    """
    return write_data_config(tmp_path / "config" / "data.json", tiny_data_config)


@pytest.fixture(scope="session")
def tiny_dataset(tmp_path_factory) -> dict:
    """A complete small data directory (2000 curves), built once per session. Read-only:
    copy files before changing them. Keys: config, config_file, raw_dir, shards,
    validations, data_dir, manifest."""
    return build_dataset(tmp_path_factory.mktemp("tiny_dataset"), make_data_config())
