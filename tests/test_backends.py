"""The backend registry (hvdscale.matrix.backends) is the one home of every backend fact: a
backend added to it (here a fake one, monkeypatched in) appears in the run-id and
allreduce-id patterns, the launch spec, the label proof, the selection, the figures'
style and order, and (once the schema enums name it) the config check. The schemas
cannot import Python: their backend enums are checked against the registry here.
A partition's kind is decided in one place (backends.partition_kind)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from hvdscale.config.load import ConfigError, validate_config
from hvdscale.matrix import backends
from hvdscale.matrix.runid import parse_run_id
from hvdscale.matrix.runtable import run_table
from hvdscale.matrix.subset import check as check_selection

ROOT = Path(__file__).resolve().parents[1]
CONFIG_SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
RUN_SCHEMA = ROOT / "workflow" / "schemas" / "run.schema.json"
# every place a schema lists the backends (a new backend is added to each)
CONFIG_ENUM_PATHS = {
    "properties.training.properties.target.properties.calibration.properties.backend",
    "properties.scaling.properties.sweeps.items.properties.backends.items",
    "properties.scaling.properties.tune.properties.backends.items",
    "properties.allreduce.properties.sweeps.items.properties.backends.items",
}
RUN_ENUM_PATHS = {"properties.config.properties.backend"}
# every place a schema lists the frameworks (issue 19)
CONFIG_FRAMEWORK_PATHS = {
    "properties.training.properties.target.properties.calibration.properties.framework",
    "properties.scaling.properties.sweeps.items.properties.frameworks.items",
    "properties.scaling.properties.tune.properties.frameworks.items",
}
RUN_FRAMEWORK_PATHS = {"properties.config.properties.framework"}
FAKE = backends.Backend(
    "fake",
    cpu_operations="fakeops",
    controllers={"horovodrun": "mpi", "mpirun": "mpi", "srun": "mpi"},
    timeline_op="FAKE_ALLREDUCE",
    color="#123456",
    marker="x",
    linestyle="-.",
)


def backend_enums(node, path=""):
    """(path, values) of every enum in a schema that lists a registered backend (not the
    controller enums: gloo, mpi and 'none')."""
    if isinstance(node, dict):
        enum = node.get("enum")
        if isinstance(enum, list) and set(enum) & set(backends.names()) and "none" not in enum:
            yield path.lstrip("."), enum
        for key, sub in node.items():
            yield from backend_enums(sub, f"{path}.{key}")
    elif isinstance(node, list):
        for sub in node:
            yield from backend_enums(sub, path)


def framework_enums(node, path=""):
    """(path, values) of every enum in a schema that lists the default framework."""
    if isinstance(node, dict):
        enum = node.get("enum")
        if isinstance(enum, list) and backends.DEFAULT_FRAMEWORK in enum:
            yield path.lstrip("."), enum
        for key, sub in node.items():
            yield from framework_enums(sub, f"{path}.{key}")
    elif isinstance(node, list):
        for sub in node:
            yield from framework_enums(sub, path)


def _at(schema: dict, path: str) -> dict:
    for key in path.split("."):
        schema = schema[key]
    return schema


def _schemas() -> tuple[dict, dict]:
    return yaml.safe_load(CONFIG_SCHEMA.read_text()), json.loads(RUN_SCHEMA.read_text())


def test_schema_enums_name_exactly_the_registered_backends():
    config_schema, run_schema = _schemas()
    for schema, paths in ((config_schema, CONFIG_ENUM_PATHS), (run_schema, RUN_ENUM_PATHS)):
        found = dict(backend_enums(schema))
        assert set(found) == paths, "backend enums moved: update CONFIG/RUN_ENUM_PATHS"
        for path, enum in found.items():
            assert [v for v in enum if v is not None] == backends.names(), path
    # the run record's id pattern and controller enum
    props = run_schema["properties"]
    alternation = re.search(r"_\(([a-z|]+)\)_n", props["run_id"]["pattern"]).group(1)
    assert alternation == backends.id_alternation()
    controllers = props["config"]["properties"]["controller"]["enum"]
    # Horovod's controllers, and the process-group backends torch-ddp records there
    groups = [b.process_group for b in backends.entries(None) if b.process_group]
    assert sorted(controllers) == sorted({*backends.CONTROLLERS, *groups, "none"})


def test_schema_enums_name_exactly_the_registered_frameworks():
    config_schema, run_schema = _schemas()
    for schema, paths in (
        (config_schema, CONFIG_FRAMEWORK_PATHS),
        (run_schema, RUN_FRAMEWORK_PATHS),
    ):
        found = dict(framework_enums(schema))
        assert set(found) == paths, "framework enums moved: update *_FRAMEWORK_PATHS"
        for path, enum in found.items():
            assert [v for v in enum if v is not None] == backends.frameworks(), path
    # the run id names every framework but the default
    pattern = run_schema["properties"]["run_id"]["pattern"]
    alternation = re.search(r"\(_\(([a-z|-]+)\)\)\?", pattern).group(1)
    assert alternation == backends.framework_alternation() == "torch-ddp"


def test_registry_reproduces_the_former_constants():
    assert backends.names() == ["nccl", "mpi", "gloo"]
    assert backends.id_alternation() == "nccl|mpi|gloo"
    assert [backends.order(b) for b in ("nccl", "mpi", "gloo", "other")] == [0, 1, 2, 9]
    assert backends.cpu_backends() == ["mpi", "gloo"]
    assert {b.name: b.controller for b in backends.entries()} == {
        "nccl": None,  # gloo under horovodrun, mpi else
        "mpi": "mpi",
        "gloo": "gloo",
    }
    with pytest.raises(backends.UserError, match="expected nccl, mpi or gloo"):
        backends.get("ucx")


@pytest.fixture
def fake(monkeypatch):
    monkeypatch.setitem(backends.REGISTRY, (backends.DEFAULT_FRAMEWORK, "fake"), FAKE)
    return FAKE


def test_a_new_backend_is_in_the_id_patterns(fake):
    d = parse_run_id("local_fake_n1_w2_b75_lrnone_r0")
    assert (d["backend"], d["workers"]) == ("fake", 2)
    from hvdscale.slurm.jobspec import JobSpec

    job = JobSpec.for_allreduce_id(validate_config({}), "local_fake_n1_w2")
    assert (job.backend, job.workers) == ("fake", 2)


def test_a_new_backend_is_launched_and_proved(fake, tmp_path):
    from hvdscale.launch.launchspec import controller_for, effective_launcher, horovod_env
    from hvdscale.record.labelproof import prove
    from hvdscale.trainer.horovod_tf.step import host_reduction

    assert horovod_env({}, "fake") == {"HOROVOD_CPU_OPERATIONS": "fakeops"}
    assert host_reduction("GPU:0", {"HOROVOD_CPU_OPERATIONS": "fakeops"})
    assert controller_for("horovodrun", "fake") == "mpi"
    assert effective_launcher("mpirun", "fake") == "mpirun"
    record = {
        "config": {
            "backend": "fake",
            "workers": 2,
            "nodes": 1,
            "workers_per_node": 2,
            "controller": "gloo",
        },
        "environment": {"hostnames": ["h1", "h1"], "devices": ["CPU", "CPU"]},
    }
    events = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grads_0"}},
        {"name": "FAKE_ALLREDUCE", "ph": "X", "pid": 1, "ts": 0},
    ]
    (tmp_path / "timeline.json").write_text(json.dumps(events))
    proof = prove(record, tmp_path / "timeline.json")
    assert proof["problems"] == ["backend fake but Horovod's controller was gloo"]
    assert proof["collective"] == proof["expected_collective"] == "FAKE_ALLREDUCE"
    record["config"]["controller"] = "mpi"
    assert prove(record, tmp_path / "timeline.json")["ok"]


def test_a_new_backend_has_a_plot_style_and_an_order(fake):
    from hvdscale.analysis.view import config_order
    from hvdscale.figures.style import backend_style

    assert backend_style("fake") == {"color": "#123456", "marker": "x", "ls": "-."}
    assert backend_style("gloo") == {"color": "#7570b3", "marker": "^", "ls": ":"}
    assert backend_style("unknown") == {"color": None, "marker": "o", "ls": "-"}
    assert config_order("fake", "none") == (3, 0)


def test_a_new_backend_passes_the_config_check_once_the_schema_names_it(fake):
    cfg = {
        "scaling": {
            "sweeps": [
                {
                    "partitions": ["local"],
                    "workers": [1, 2],
                    "backends": ["fake"],
                    "batch_sizes": [75],
                    "lr_rules": ["none"],
                }
            ]
        },
        "select": "backend=fake",
    }
    config_schema, _ = _schemas()
    with pytest.raises(ConfigError, match="scaling.sweeps.0.backends.0: got 'fake'"):
        validate_config(cfg, config_schema)
    for path in CONFIG_ENUM_PATHS:  # what a new backend adds to the schema
        _at(config_schema, path)["enum"].append("fake")
    valid = validate_config(cfg, config_schema)
    assert check_selection(valid) == []
    assert "local_fake_n1_w2_b75_lrnone_r0" in [r.run_id for r in run_table(valid)]


def test_a_backend_that_needs_gpus_is_refused_on_a_cpu_partition(monkeypatch):
    gpu_fake = backends.Backend("fake", gpu_operations="FAKE", needs_gpu=True)
    monkeypatch.setitem(backends.REGISTRY, (backends.DEFAULT_FRAMEWORK, "fake"), gpu_fake)
    config_schema, _ = _schemas()
    for path in CONFIG_ENUM_PATHS:
        _at(config_schema, path)["enum"].append("fake")
    sweep = {"workers": [1], "backends": ["fake"], "batch_sizes": [75], "lr_rules": ["none"]}
    with pytest.raises(ConfigError, match="'fake' needs GPUs but partition 'local'"):
        validate_config(
            {"scaling": {"sweeps": [{"partitions": ["local"], **sweep}]}}, config_schema
        )
    assert backends.gpu_problems(["fake", "mpi"], {"gpus_per_node": 0}) == ["fake"]
    assert backends.gpu_problems(["fake"], {"gpus_per_node": 4}) == []


def test_partition_kind_is_decided_once():
    from hvdscale.slurm.jobspec import JobSpec

    assert backends.partition_kind({"gpus_per_node": 0}) == "cpu"
    assert backends.partition_kind({}) == "cpu"
    assert backends.partition_kind({"gpus_per_node": 8}) == "gpu"
    job = JobSpec("alpha", "nccl", nodes=2, workers=12, workers_per_node=8, gpus_per_node=8)
    assert backends.is_gpu_partition(job) and job.gpus == 8 and job.total_gpus == 16
    cpu = JobSpec("local", "gloo", nodes=1, workers=2, workers_per_node=2)
    assert backends.partition_kind(cpu) == "cpu" and cpu.total_gpus == 0
    assert set(backends.PARTITION_KINDS) == {"cpu", "gpu"}
