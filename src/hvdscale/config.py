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

# run_id: {partition}_{backend}_n{nodes}_w{workers}_b{batch}_lr{rule}[_m{mult}_wu{warmup}]_r{repeat}
# The optional _m{mult}_wu{warmup} component marks a candidate of the learning-rate
# re-tuning sweep (scaling.tune): LR multiplier (decimal point written as "p", e.g. 0p5)
# and warm-up epochs.
RUN_ID_PATTERN = (
    r"(?P<partition>[a-z][a-z0-9-]{0,31})_(?P<backend>nccl|mpi|gloo)_n(?P<nodes>[0-9]+)"
    r"_w(?P<workers>[0-9]+)_b(?P<batch>[0-9]+)_lr(?P<lr_rule>none|linear|sqrt)"
    r"(?:_m(?P<lr_mult>[0-9]+(?:p[0-9]{1,2})?)_wu(?P<tune_warmup>[0-9]+))?_r(?P<repeat>[0-9]+)"
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
    _migrate_target(cfg)
    validator = _with_defaults(Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(_describe_error(e) for e in errors))
    _fill_partition_defaults(cfg, schema)
    _sync_target(cfg)
    _check_semantics(cfg)
    return cfg


DEFAULT_TARGET_TEST_LOSS = 0.05  # the schema default of the deprecated key


def _migrate_target(cfg: dict) -> None:
    """training.target_test_loss (before training.target existed) -> an absolute target.

    A validated config carries both (target_test_loss mirrors an absolute target, else
    the schema default), so validating it again is a no-op; a config that sets both to
    different targets is an error."""
    tr = cfg.get("training")
    if not isinstance(tr, dict) or "target_test_loss" not in tr:
        return
    loss = tr["target_test_loss"]
    if "target" not in tr:
        tr.pop("target_test_loss")
        tr["target"] = {"mode": "absolute", "value": loss}
        return
    tgt = tr["target"] if isinstance(tr["target"], dict) else {}
    mode, value = tgt.get("mode", "relative"), tgt.get("value", 5.0)
    if (mode == "absolute" and loss != value) or (
        mode != "absolute" and loss != DEFAULT_TARGET_TEST_LOSS
    ):
        raise ConfigError(
            "invalid config:\n  config key training.target_test_loss: replaced by "
            "training.target; set only one of them (the old key as the new one: "
            f"training.target: {{mode: absolute, value: {loss!r}}})"
        )


def _sync_target(cfg: dict) -> None:
    tr = cfg["training"]
    absolute = tr["target"]["mode"] == "absolute"
    tr["target_test_loss"] = tr["target"]["value"] if absolute else DEFAULT_TARGET_TEST_LOSS


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
    tune = cfg["scaling"].get("tune")
    if tune is not None:
        props = schema["properties"]["scaling"]["properties"]["tune"]["properties"]
        for key, sub in props.items():
            if "default" in sub and key not in tune:
                tune[key] = copy.deepcopy(sub["default"])


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
    problems += _tune_problems(cfg)
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


def _tune_problems(cfg: dict) -> list[str]:
    tune = cfg["scaling"].get("tune")
    if tune is None:
        return []
    problems = []
    parts = cfg["scaling"]["partitions"]
    for p in tune["partitions"]:
        if p not in parts:
            problems.append(
                f"config key scaling.tune.partitions: got {p!r}; expected one of "
                f"{', '.join(map(repr, sorted(parts)))} (keys of scaling.partitions)"
            )
        elif "nccl" in tune["backends"] and parts[p]["gpus_per_node"] == 0:
            problems.append(
                f"config key scaling.tune.backends: 'nccl' needs GPUs but partition {p!r} "
                "has gpus_per_node 0; use 'mpi' or 'gloo'"
            )
    for m in tune["lr_multipliers"]:
        if abs(round(m * 100) - m * 100) > 1e-6:
            problems.append(
                f"config key scaling.tune.lr_multipliers: got {m!r}; expected at most 2 decimals"
            )
    for w in tune["warmup_epochs"]:
        if w >= cfg["training"]["epochs"]:
            problems.append(
                f"config key scaling.tune.warmup_epochs: got {w!r}; expected fewer than "
                f"training.epochs ({cfg['training']['epochs']})"
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
    # a candidate of the re-tuning sweep: LR multiplier and warm-up epochs (else None)
    lr_mult: float | None = None
    tune_warmup: int | None = None

    @property
    def candidate(self) -> str:
        """'' for a run of the scaling sweeps; 'm{mult}_wu{warmup}' for a tuning candidate."""
        if self.lr_mult is None:
            return ""
        return f"m{format_multiplier(self.lr_mult)}_wu{self.tune_warmup}"

    @property
    def run_id(self) -> str:
        cand = f"_{self.candidate}" if self.candidate else ""
        return (
            f"{self.partition}_{self.backend}_n{self.nodes}_w{self.workers}_b{self.batch}"
            f"_lr{self.lr_rule}{cand}_r{self.repeat}"
        )

    @property
    def global_batch(self) -> int:
        return self.workers * self.batch

    def as_dict(self) -> dict:
        d = asdict(self)
        d["run_id"] = self.run_id
        d["global_batch"] = self.global_batch
        d["candidate"] = self.candidate
        return d


def format_multiplier(m: float) -> str:
    """An LR multiplier as a run_id component: 0.5 -> '0p5', 2 -> '2', 1.25 -> '1p25'."""
    text = f"{round(float(m), 2):.2f}".rstrip("0").rstrip(".")
    return text.replace(".", "p")


def parse_multiplier(text: str) -> float:
    return float(text.replace("p", "."))


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
    for run in tune_runs(cfg):
        if run_selected(sel, run):
            runs[run.run_id] = run
    return [runs[k] for k in sorted(runs, key=_run_sort_key(runs))]


def tune_runs(cfg: dict) -> list[Run]:
    """Every candidate run of the re-tuning sweep (scaling.tune; none when it is null)."""
    tune = cfg["scaling"].get("tune")
    if not tune:
        return []
    parts = cfg["scaling"]["partitions"]
    out = []
    for p, w, be, b, lr, m, wu in itertools.product(
        tune["partitions"],
        tune["workers"],
        tune["backends"],
        tune["batch_sizes"],
        tune["lr_rules"],
        tune["lr_multipliers"],
        tune["warmup_epochs"],
    ):
        part = parts[p]
        for r in range(tune["repeats"]):
            out.append(
                Run(
                    partition=p,
                    backend=be,
                    nodes=nodes_for(w, part),
                    workers=w,
                    batch=b,
                    lr_rule=lr,
                    repeat=r,
                    workers_per_node=workers_per_node_for(w, part),
                    gpus_per_node=part["gpus_per_node"],
                    lr_mult=round(float(m), 2),
                    tune_warmup=int(wu),
                )
            )
    return out


def _run_sort_key(runs: dict[str, Run]):
    def key(run_id: str):
        r = runs[run_id]
        cand = (0, 0.0, 0) if r.lr_mult is None else (1, r.lr_mult, r.tune_warmup)
        return (r.partition, r.backend, r.batch, r.lr_rule, cand, r.workers, r.repeat)

    return key


def parse_run_id(run_id: str) -> dict:
    m = re.fullmatch(RUN_ID_PATTERN, run_id)
    if not m:
        raise ConfigError(
            f"run_id {run_id!r}: expected {{partition}}_{{backend}}_n{{nodes}}_w{{workers}}"
            "_b{batch}_lr{none|linear|sqrt}[_m{lr multiplier}_wu{warm-up}]_r{repeat}, "
            "e.g. local_gloo_n1_w2_b75_lrnone_r0 or local_gloo_n1_w2_b75_lrlinear_m0p5_wu1_r0"
        )
    d = m.groupdict()
    for k in ("nodes", "workers", "batch", "repeat"):
        d[k] = int(d[k])
    d["candidate"] = f"m{d['lr_mult']}_wu{d['tune_warmup']}" if d["lr_mult"] is not None else ""
    if d["lr_mult"] is not None:
        d["lr_mult"] = parse_multiplier(d["lr_mult"])
        d["tune_warmup"] = int(d["tune_warmup"])
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
    # the target is resolved at aggregation time: editing it retrains nothing
    sub["training"].pop("target", None)
    sub["training"].pop("target_test_loss", None)
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
    if run.lr_mult is not None:
        # a tuning candidate: its own base rate and warm-up, reachable as a one-point tune
        sub["training"]["learning_rate"] = cfg["training"]["learning_rate"] * run.lr_mult
        sub["training"]["warmup_epochs"] = run.tune_warmup
        sub["training"]["lr_warmup"] = run.tune_warmup > 0
        sub["scaling"]["tune"] = {
            "partitions": [run.partition],
            "workers": [run.workers],
            "backends": [run.backend],
            "batch_sizes": [run.batch],
            "lr_rules": [run.lr_rule],
            "lr_multipliers": [run.lr_mult],
            "warmup_epochs": [run.tune_warmup],
            "repeats": cfg["scaling"]["tune"]["repeats"],
        }
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
