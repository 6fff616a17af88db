"""Configuration: schema validation with defaults, readable errors, the run table.

The JSON Schema in ``workflow/schemas/config.schema.yaml`` is the single source of
truth for keys, defaults and allowed values. This module is used both by the
Snakefile (after ``snakemake.utils.validate``) and by the CLI, so the same checks
run inside and outside Snakemake.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import math
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from hvdscale.common import PROJECT_ROOT
from hvdscale.errors import UserError

# the job layout (nodes and ranks per node of a run) lives in hvdscale.jobspec;
# slots_per_node and nodes_for stay importable from here
from hvdscale.jobspec import JobSpec, nodes_for, workers_per_node_for
from hvdscale.jobspec import slots_per_node as slots_per_node

# PROJECT_ROOT: HVDSCALE_ROOT, the source tree or the current directory (hvdscale.common)
SCHEMA_DIR = PROJECT_ROOT / "workflow" / "schemas"
CONFIG_SCHEMA = SCHEMA_DIR / "config.schema.yaml"
RUN_SCHEMA = SCHEMA_DIR / "run.schema.json"

# run_id: {partition}_{backend}_n{nodes}_w{workers}_b{batch}_lr{rule}_r{repeat}
RUN_ID_PATTERN = (
    r"(?P<partition>[a-z][a-z0-9-]{0,31})_(?P<backend>nccl|mpi|gloo)_n(?P<nodes>[0-9]+)"
    r"_w(?P<workers>[0-9]+)_b(?P<batch>[0-9]+)_lr(?P<lr_rule>none|linear|sqrt)_r(?P<repeat>[0-9]+)"
)


# the same without named groups (Snakemake wildcard constraints)
RUN_ID_WILDCARD = re.sub(r"\(\?P<\w+>", "(?:", RUN_ID_PATTERN)


class ConfigError(UserError, ValueError):
    """A config value is invalid; the message names the key, the value and what is allowed."""


def load_schema(path: Path = CONFIG_SCHEMA) -> dict:
    with open(path) as fh:
        return yaml.safe_load(fh)


def _with_defaults(validator_class):
    """A jsonschema validator that fills in ``default`` values while validating."""
    from jsonschema import validators

    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for prop, subschema in properties.items():
                if "default" in subschema and prop not in instance:
                    instance[prop] = copy.deepcopy(subschema["default"])
        yield from validate_properties(validator, properties, instance, schema)

    return validators.extend(validator_class, {"properties": set_defaults})


def _describe_error(err) -> str:
    key = ".".join(str(p) for p in err.absolute_path) or "(top level)"
    schema = err.schema if isinstance(err.schema, dict) else {}
    if err.validator == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        extra = sorted(set(err.instance) - set(allowed)) if isinstance(err.instance, dict) else []
        where = key if key != "(top level)" else "the top level"
        return (
            f"config key {where}: unknown key(s) {', '.join(map(repr, extra)) or err.message}; "
            f"allowed: {', '.join(allowed) if allowed else 'none'}"
        )
    allowed = ""
    if err.validator == "enum":
        allowed = f"one of {', '.join(map(repr, err.validator_value))}"
    elif err.validator == "pattern":
        allowed = (
            f"a string matching {err.validator_value!r} "
            "(letters, digits and a few safe characters; no shell syntax)"
        )
    elif err.validator in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        ops = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}
        allowed = f"a number {ops[err.validator]} {err.validator_value}"
    elif err.validator == "type":
        allowed = f"type {err.validator_value}"
    elif err.validator == "required":
        return f"config key {key}: {err.message}"
    elif err.validator == "not":
        allowed = "a relative path inside the project (no leading '/', no '..')"
    else:
        allowed = err.message
    desc = schema.get("description", "")
    desc = f" ({desc.strip()})" if desc and len(desc) < 160 else ""
    return f"config key {key}: got {err.instance!r}; expected {allowed}{desc}"


def validate_config(config: dict, schema: dict | None = None) -> dict:
    """Validate ``config`` and return a deep copy with every default filled in.

    Raises ConfigError listing every problem, each naming the key, the bad value and
    what is allowed.
    """
    from jsonschema import Draft202012Validator

    schema = schema or load_schema()
    cfg = copy.deepcopy(config) if config is not None else {}
    if not isinstance(cfg, dict):
        raise ConfigError(f"config: expected a mapping at the top level, got {type(cfg).__name__}")
    validator = _with_defaults(Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(_describe_error(e) for e in errors))
    _fill_partition_defaults(cfg, schema)
    _check_semantics(cfg)
    return cfg


def _fill_partition_defaults(cfg: dict, schema: dict) -> None:
    part_schema = schema["properties"]["scaling"]["properties"]["partitions"][
        "additionalProperties"
    ]
    for part in cfg["scaling"]["partitions"].values():
        for key, sub in part_schema["properties"].items():
            if "default" in sub and key not in part:
                part[key] = copy.deepcopy(sub["default"])
    for sweep in cfg["scaling"]["sweeps"]:
        sweep.setdefault("name", "sweep")


def _check_semantics(cfg: dict) -> None:
    problems = []
    labels = cfg["data"]["labels"]
    for name, spec in labels.items():
        if spec["min"] >= spec["max"]:
            problems.append(
                f"config key data.labels.{name}: min {spec['min']!r} "
                f"must be below max {spec['max']!r}"
            )
    if cfg["training"]["warmup_epochs"] >= cfg["training"]["epochs"]:
        problems.append(
            f"config key training.warmup_epochs: got {cfg['training']['warmup_epochs']!r}; "
            f"expected fewer than training.epochs ({cfg['training']['epochs']})"
        )
    parts = cfg["scaling"]["partitions"]
    for i, sweep in enumerate(cfg["scaling"]["sweeps"]):
        for p in sweep["partitions"]:
            if p not in parts:
                problems.append(
                    f"config key scaling.sweeps.{i}.partitions: got {p!r}; expected one of "
                    f"{', '.join(map(repr, sorted(parts)))} (keys of scaling.partitions)"
                )
                continue
            if "nccl" in sweep["backends"] and parts[p]["gpus_per_node"] == 0:
                problems.append(
                    f"config key scaling.sweeps.{i}.backends: 'nccl' needs GPUs but partition "
                    f"{p!r} has gpus_per_node 0; use 'mpi' or 'gloo'"
                )
    if not problems:
        problems += _check_select(cfg)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _check_select(cfg: dict) -> list[str]:
    """The selection (config key select) names known sweeps/partitions and keeps a run."""
    from hvdscale.study.select import check, describe

    problems = check(cfg)
    if not problems and cfg.get("select") and not run_table(cfg):
        problems.append(
            f"config key select: {describe(cfg['select'])!r} matches no run of the scaling matrix"
        )
    return problems


def read_config_file(path: str | Path) -> dict:
    """The raw mapping of a YAML or JSON config file (JSON is YAML; ``.json`` parsed as JSON)."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"config file {path}: not found") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: cannot be read: {exc}") from None
    if path.suffix == ".json":
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"config file {path}: not valid JSON: {exc}") from None
    else:
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path}: not valid YAML: {exc}") from None
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(
            f"config file {path}: expected a mapping of keys, got {type(raw).__name__}"
        )
    return raw


def load_config(path: str | Path) -> dict:
    """Read a YAML or JSON config file, validate it and fill defaults (the one loader)."""
    path = Path(path)
    raw = read_config_file(path)
    try:
        return validate_config(raw)
    except ConfigError as exc:
        raise ConfigError(f"config file {path}: {exc}") from None


def config_hash(cfg: dict) -> str:
    """sha256 of the canonical JSON form of a (validated) config."""
    return hashlib.sha256(
        json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def data_section(cfg: dict) -> dict:
    """The part of the config the data stage depends on.

    Training edits leave it unchanged, so they don't regenerate data.
    """
    return {"seed": cfg["seed"], "data": cfg["data"]}


# --------------------------------------------------------------------------- run table


@dataclass(frozen=True)
class Run:
    partition: str
    backend: str
    nodes: int
    workers: int
    batch: int
    lr_rule: str
    repeat: int
    workers_per_node: int
    gpus_per_node: int

    @property
    def run_id(self) -> str:
        return (
            f"{self.partition}_{self.backend}_n{self.nodes}_w{self.workers}_b{self.batch}"
            f"_lr{self.lr_rule}_r{self.repeat}"
        )

    @property
    def global_batch(self) -> int:
        return self.workers * self.batch

    def as_dict(self) -> dict:
        d = asdict(self)
        d["run_id"] = self.run_id
        d["global_batch"] = self.global_batch
        return d


def run_table(cfg: dict) -> list[Run]:
    """Every run of the scaling matrix (union of the sweeps), sorted, without duplicates;
    only those of the config's selection (key ``select``, hvdscale.study.select)."""
    from hvdscale.study.select import parse, run_selected, sweep_selected

    sel = parse(cfg.get("select"))
    runs: dict[str, Run] = {}
    parts = cfg["scaling"]["partitions"]
    for sweep in cfg["scaling"]["sweeps"]:
        if not sweep_selected(sel, sweep):
            continue
        for p, w, be, b, lr in itertools.product(
            sweep["partitions"],
            sweep["workers"],
            sweep["backends"],
            sweep["batch_sizes"],
            sweep["lr_rules"],
        ):
            part = parts[p]
            for r in range(cfg["training"]["repeats"]):
                run = Run(
                    partition=p,
                    backend=be,
                    nodes=nodes_for(w, part),
                    workers=w,
                    batch=b,
                    lr_rule=lr,
                    repeat=r,
                    workers_per_node=workers_per_node_for(w, part),
                    gpus_per_node=part["gpus_per_node"],
                )
                if run_selected(sel, run):
                    runs[run.run_id] = run
    return [runs[k] for k in sorted(runs, key=_run_sort_key(runs))]


def _run_sort_key(runs: dict[str, Run]):
    def key(run_id: str):
        r = runs[run_id]
        return (r.partition, r.backend, r.batch, r.lr_rule, r.workers, r.repeat)

    return key


def parse_run_id(run_id: str) -> dict:
    m = re.fullmatch(RUN_ID_PATTERN, run_id)
    if not m:
        raise ConfigError(
            f"run_id {run_id!r}: expected "
            "{partition}_{backend}_n{nodes}_w{workers}_b{batch}"
            "_lr{none|linear|sqrt}_r{repeat}, e.g. local_gloo_n1_w2_b75_lrnone_r0"
        )
    d = m.groupdict()
    for k in ("nodes", "workers", "batch", "repeat"):
        d[k] = int(d[k])
    return d


def find_run(cfg: dict, run_id: str, runs: dict[str, Run] | None = None) -> Run:
    """The run ``run_id`` of the config's matrix (pass ``runs``, a run_id -> Run dict, to
    avoid expanding the matrix again on every call)."""
    if runs is None:
        runs = {r.run_id: r for r in run_table(cfg)}
    if run_id in runs:
        return runs[run_id]
    parse_run_id(run_id)  # raises a clear error for a malformed id
    raise ConfigError(f"run_id {run_id!r}: not in the scaling matrix of this config")


def learning_rate_for(base: float, rule: str, workers: int) -> float:
    if rule == "none":
        return base
    if rule == "linear":
        return base * workers
    if rule == "sqrt":
        return base * math.sqrt(workers)
    raise ConfigError(f"lr_rule {rule!r}: expected none, linear or sqrt")


def iter_run_ids(cfg: dict) -> Iterable[str]:
    return (r.run_id for r in run_table(cfg))


def run_config(cfg: dict, run_id: str, runs: dict[str, Run] | None = None) -> dict:
    """The part of the config one training run depends on.

    It is itself a valid config (one partition, one single-point sweep), so the training
    code reads it with validate_config/find_run. Editing another sweep, another
    partition or the report settings leaves it, and so the completed run, untouched.
    """
    run = find_run(cfg, run_id, runs)
    sub = {
        k: copy.deepcopy(cfg[k])
        for k in ("seed", "results_dir", "data", "model", "training", "environment")
    }
    sub["scaling"] = {
        "partitions": {run.partition: copy.deepcopy(cfg["scaling"]["partitions"][run.partition])},
        "sweeps": [
            {
                "name": "run",
                "partitions": [run.partition],
                "workers": [run.workers],
                "backends": [run.backend],
                "batch_sizes": [run.batch],
                "lr_rules": [run.lr_rule],
            }
        ],
    }
    # the repeat index must stay reachable: keep the repeat count
    sub["training"]["repeats"] = cfg["training"]["repeats"]
    return sub


# training keys an allreduce sweep depends on (launcher, OMP threads, Horovod knobs)
ALLREDUCE_TRAINING_KEYS = ("launcher", "threads_per_worker", "horovod")


def allreduce_config(cfg: dict, allreduce_id: str) -> dict:
    """The part of the config one allreduce sweep depends on.

    A valid config in itself: the sweep's partition, the train environment, the
    training keys of ALLREDUCE_TRAINING_KEYS and one sweep naming the job's backend
    and worker count (batch size and LR rule are placeholders: the sweep trains
    nothing). Editing the report, other sweeps, data or other training settings
    leaves it, and so the measured sweep, untouched.
    """
    job = JobSpec.for_allreduce_id(cfg, allreduce_id)
    return {
        "environment": copy.deepcopy(cfg["environment"]),
        "training": {k: copy.deepcopy(cfg["training"][k]) for k in ALLREDUCE_TRAINING_KEYS},
        "scaling": {
            "partitions": {
                job.partition: copy.deepcopy(cfg["scaling"]["partitions"][job.partition])
            },
            "sweeps": [
                {
                    "name": "allreduce",
                    "partitions": [job.partition],
                    "workers": [job.workers],
                    "backends": [job.backend],
                    "batch_sizes": [1],
                    "lr_rules": ["none"],
                }
            ],
        },
    }


def allreduce_jobs(cfg: dict) -> list[dict]:
    """One allreduce size sweep per (partition, backend, nodes, workers >= 2) of the run table."""
    seen = {}
    for r in run_table(cfg):
        if r.workers < 2:
            continue
        key = f"{r.partition}_{r.backend}_n{r.nodes}_w{r.workers}"
        seen.setdefault(
            key,
            {
                "id": key,
                "partition": r.partition,
                "backend": r.backend,
                "nodes": r.nodes,
                "workers": r.workers,
                "workers_per_node": r.workers_per_node,
                "gpus_per_node": r.gpus_per_node,
            },
        )
    return [seen[k] for k in sorted(seen)]


def count_parameters(cfg: dict) -> int:
    """Trainable parameters of the configured Dense network (no TensorFlow needed)."""
    sizes = [cfg["data"]["n_points"] * 3, *cfg["model"]["hidden_units"], 2]
    return sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:]))
