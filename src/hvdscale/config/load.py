"""Configuration: schema validation with defaults, readable errors, the config hash;
the cross-key checks are ``hvdscale.config.checks``.

The JSON Schema in ``workflow/schemas/config.schema.yaml`` is the single source of
truth for keys, defaults and allowed values. This module is used both by the
Snakefile (after ``snakemake.utils.validate``) and by the CLI, so the same checks
run inside and outside Snakemake.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import tempfile
from pathlib import Path

import yaml

from hvdscale.config import smoke
from hvdscale.config.checks import check_semantics
from hvdscale.errors import ConfigError
from hvdscale.project import PROJECT_ROOT
from hvdscale.workload.base import workload_for

# PROJECT_ROOT: HVDSCALE_ROOT, the source tree or the current directory (hvdscale.project)
SCHEMA_DIR = PROJECT_ROOT / "workflow" / "schemas"
CONFIG_SCHEMA = SCHEMA_DIR / "config.schema.yaml"
RUN_SCHEMA = SCHEMA_DIR / "run.schema.json"


def load_schema(path: Path = CONFIG_SCHEMA) -> dict:
    """The config schema (a copy: callers may change it). Parsed once per file and
    process: parsing the YAML is 95 % of a validate_config call (170 ms of 176)."""
    return copy.deepcopy(_parsed_schema(str(path)))


@functools.lru_cache(maxsize=8)
def _parsed_schema(path: str) -> dict:
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


# a schema bound keyword -> its operator in an error message
BOUND_OPS = {"minimum": ">=", "exclusiveMinimum": ">", "maximum": "<=", "exclusiveMaximum": "<"}


def _alternative(sub: dict) -> str:
    """One branch of a oneOf/anyOf in words ('' when it has no simple wording)."""
    if "const" in sub:
        return repr(sub["const"])
    if sub.get("type") == "null":
        return "null"
    if sub.get("type") in ("number", "integer"):
        bounds = [f"{op} {sub[k]}" for k, op in BOUND_OPS.items() if k in sub]
        return f"a{'n' if sub['type'] == 'integer' else ''} {sub['type']}" + (
            f" {' and '.join(bounds)}" if bounds else ""
        )
    return ""


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
    elif err.validator in BOUND_OPS:
        allowed = f"a number {BOUND_OPS[err.validator]} {err.validator_value}"
    elif err.validator == "type":
        allowed = f"type {err.validator_value}"
    elif err.validator == "required":
        return f"config key {key}: {err.message}"
    elif err.validator == "not" and "^/" not in json.dumps(err.validator_value):
        allowed = "a path without '..' (relative to the project directory, or absolute)"
    elif err.validator == "not":
        allowed = "a relative path inside the project (no leading '/', no '..')"
    elif err.validator in ("oneOf", "anyOf") and all(
        words := [_alternative(s) for s in err.validator_value]
    ):
        allowed = " or ".join(words)
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
    _reject_renamed(cfg)
    _migrate_target(cfg)
    validator = _with_defaults(Draft202012Validator)(schema)
    errors = sorted(validator.iter_errors(cfg), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        raise ConfigError("invalid config:\n  " + "\n  ".join(_describe_error(e) for e in errors))
    _fill_partition_defaults(cfg, schema)
    if cfg["smoke"]:  # the config's smoke study (hvdscale.config.smoke)
        smoke.apply(cfg)
    _drop_later_defaults(cfg)
    _fill_calibration(cfg)
    _sync_target(cfg)
    check_semantics(cfg)
    return cfg


def _drop_later_defaults(cfg: dict) -> None:
    """Keys added after studies were run stay out of the validated config at their
    default (the workload stress-strain, smoke false, a partition's emulated_gpus false),
    so the full config, its hash and every run's config slice and hash of those studies
    are what they were: their records match, and hvdscale plan retrains none of them."""
    if cfg.get("workload") == DEFAULT_WORKLOAD:
        del cfg["workload"]
    if cfg.get("smoke") is False:
        del cfg["smoke"]
    for part in cfg["scaling"]["partitions"].values():
        if part.get("emulated_gpus") is False:
            del part["emulated_gpus"]


DEFAULT_TARGET_TEST_LOSS = 0.05  # the schema default of the deprecated key


def _reject_renamed(cfg: dict) -> None:
    """Keys of earlier versions whose meaning changed: a clear error instead of a guess."""
    tr = cfg.get("training")
    if not isinstance(tr, dict):
        return
    problems = []
    if "epochs" in tr:
        problems.append(
            f"config key training.epochs: renamed to training.max_epochs (the budget: a run "
            f"trains until its validation loss reaches the target or this many epochs); "
            f"write training.max_epochs: {tr['epochs']!r}"
        )
    tgt = tr.get("target")
    if isinstance(tgt, dict) and tgt.get("mode") == "relative":
        problems.append(
            "config key training.target.mode: 'relative' (a target from the test loss of the "
            "scaling runs themselves) was removed; use 'calibrated' (value: percent above the "
            "median best validation loss of the calibration runs, "
            "training.target.calibration) or 'absolute' (value: a validation loss)"
        )
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


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
    mode, value = tgt.get("mode", "calibrated"), tgt.get("value", 5.0)
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


def _fill_calibration(cfg: dict) -> None:
    """training.target.calibration: framework, partition, backend, batch and LR rule left
    null default to the first entries of the first sweep (the study's reference point),
    max_epochs to twice training.max_epochs."""
    cal = cfg["training"]["target"]["calibration"]
    first = cfg["scaling"]["sweeps"][0]
    for key, sweep_key in (
        ("framework", "frameworks"),
        ("partition", "partitions"),
        ("backend", "backends"),
        ("batch", "batch_sizes"),
        ("lr_rule", "lr_rules"),
    ):
        if cal.get(key) is None:
            cal[key] = first[sweep_key][0]
    if cal.get("max_epochs") is None:
        cal["max_epochs"] = 2 * cfg["training"]["max_epochs"]


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


# results_dir's schema default: the value a run's hash sees, wherever the study lives
DEFAULT_RESULTS_DIR = "results"


def run_config_hash(cfg: dict) -> str:
    """The config hash a training run records: that of its (validated) slice of the config
    with ``results_dir`` at its default. Where a study's files live is no part of a run's
    configuration, so a study moved to another results_dir keeps matching its records; a
    run of a study in the default ``results`` records the hash it recorded before."""
    return config_hash({**cfg, "results_dir": DEFAULT_RESULTS_DIR})


def check_results_dir(results_dir: str | Path, key: str = "results_dir") -> None:
    """ConfigError unless ``results_dir`` (relative to the working directory, or absolute)
    is a directory this user can write to, or can be made in one: tried by creating a file
    in it or in its nearest existing parent (what the jobs will do; the mode bits alone say
    nothing for root or on a read-only mount). Creates nothing that stays."""
    path = Path(results_dir)
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    where = "" if probe == path else f" (not there yet; its nearest existing parent is {probe})"
    fix = (
        "give a results_dir you can write to, relative to the project directory or absolute "
        "(e.g. a workspace on the cluster's scratch file system): --config results_dir=PATH "
        "or the key results_dir in your config file"
    )
    if not probe.is_dir():
        raise ConfigError(f"config key {key}: {path}: {probe} is not a directory{where}; {fix}")
    try:
        fd, tmp = tempfile.mkstemp(prefix=".hvdscale-write-check-", dir=probe)
    except OSError as exc:
        raise ConfigError(
            f"config key {key}: {path}: cannot create a file in {probe}{where} "
            f"({exc.strerror or exc}); {fix}"
        ) from None
    os.close(fd)
    os.unlink(tmp)


def data_section(cfg: dict) -> dict:
    """The part of the config the data stage depends on.

    Training edits leave it unchanged, so they don't regenerate data. The workload is in
    it only when it is not the default (stress-strain studies keep their data section).
    """
    sec = {"seed": cfg["seed"], "data": cfg["data"]}
    if cfg.get("workload", DEFAULT_WORKLOAD) != DEFAULT_WORKLOAD:
        sec["workload"] = cfg["workload"]
    return sec


#: the schema default of ``workload`` (hvdscale.workload.base.DEFAULT)
DEFAULT_WORKLOAD = "stress-strain"


def count_parameters(cfg: dict) -> int:
    """Trainable parameters of the configured network (no TensorFlow needed)."""
    if cfg.get("workload", DEFAULT_WORKLOAD) != DEFAULT_WORKLOAD:
        return workload_for(cfg).parameter_count(cfg)
    sizes = [cfg["data"]["n_points"] * 3, *cfg["model"]["hidden_units"], 2]
    return sum((a + 1) * b for a, b in zip(sizes[:-1], sizes[1:]))
