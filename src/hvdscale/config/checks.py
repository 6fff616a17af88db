"""The config's cross-key checks (what the schema cannot say): labels, sweeps against
partitions and backends (GPU backends on GPU partitions, each framework's backends), the
calibration, tuning, precision and selection keys, SLURM site flags and clusters. Run by
``hvdscale.config.load.validate_config`` after the schema's defaults are filled in."""

from __future__ import annotations

from hvdscale.errors import ConfigError
from hvdscale.matrix import backends
from hvdscale.matrix.backends import DEFAULT_FRAMEWORK
from hvdscale.matrix.runtable import run_table
from hvdscale.matrix.subset import check as check_selection
from hvdscale.matrix.subset import describe as describe_selection
from hvdscale.slurm.clusters import only_cluster, only_cluster_problems
from hvdscale.slurm.gpu_support import unsupported_gpu_problems
from hvdscale.slurm.jobspec import sbatch_flag_problems


def check_semantics(cfg: dict) -> None:
    """The cross-key checks of a validated config (defaults filled in): one ConfigError
    naming every problem."""
    problems = []
    labels = cfg["data"]["labels"]
    for name, spec in labels.items():
        if spec["min"] >= spec["max"]:
            problems.append(
                f"config key data.labels.{name}: min {spec['min']!r} "
                f"must be below max {spec['max']!r}"
            )
    tr = cfg["training"]
    if tr["warmup_epochs"] >= tr["max_epochs"]:
        problems.append(
            f"config key training.warmup_epochs: got {tr['warmup_epochs']!r}; "
            f"expected fewer than training.max_epochs ({tr['max_epochs']})"
        )
    parts = cfg["scaling"]["partitions"]
    for name, part in parts.items():
        problems += sbatch_flag_problems(name, part.get("sbatch_flags") or "")
    problems += _calibration_problems(cfg)
    for i, sweep in enumerate(cfg["scaling"]["sweeps"]):
        for p in sweep["partitions"]:
            if p not in parts:
                problems.append(
                    f"config key scaling.sweeps.{i}.partitions: got {p!r}; expected one of "
                    f"{', '.join(map(repr, sorted(parts)))} (keys of scaling.partitions)"
                )
                continue
            for fw in sweep["frameworks"]:
                problems += _gpu_problems(
                    f"scaling.sweeps.{i}.backends", sweep["backends"], p, parts, fw
                )
        problems += _framework_problems(
            f"scaling.sweeps.{i}.backends",
            sweep.get("name"),
            sweep["frameworks"],
            sweep["backends"],
        )
    problems += _tune_problems(cfg)
    problems = list(dict.fromkeys(problems))  # a problem of both frameworks once
    if not problems:
        problems += _precision_problems(cfg)
    if not problems:  # GPUs the pinned TensorFlow cannot run (gpu_support)
        problems += unsupported_gpu_problems(cfg, [r.partition for r in run_table(cfg)])
    if not problems:
        problems += _check_select(cfg)
    if not problems:
        problems += only_cluster_problems(cfg) or _only_cluster_select_problems(cfg)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))


def _gpu_problems(
    key: str, backend_names, partition: str, parts: dict, framework: str = DEFAULT_FRAMEWORK
) -> list[str]:
    """A backend that needs GPUs (hvdscale.matrix.backends) on a partition without them."""
    others = " or ".join(map(repr, backends.cpu_backends(framework)))
    return [
        f"config key {key}: {b!r} needs GPUs but partition {partition!r} has "
        f"gpus_per_node 0; use {others}"
        for b in backends.gpu_problems(backend_names, parts[partition], framework)
    ]


def _framework_problems(key: str, name: str | None, frameworks, backend_names) -> list[str]:
    """A backend that a framework of the sweep (tuning sweep, calibration) does not have,
    e.g. torch-ddp with mpi."""
    where = f" (sweep {name!r})" if name else ""
    return [
        f"config key {key}{where}: framework {fw!r} has no backend {b!r}; "
        f"{fw} runs with {' or '.join(map(repr, backends.names(fw)))}"
        for fw in frameworks
        for b in backends.framework_problems(fw, backend_names)
    ]


def _calibration_problems(cfg: dict) -> list[str]:
    """training.target.calibration names a known partition and fits its budget."""
    tgt = cfg["training"]["target"]
    if tgt["mode"] != "calibrated":
        return []
    cal, parts = tgt["calibration"], cfg["scaling"]["partitions"]
    problems = []
    if cal["partition"] not in parts:
        problems.append(
            f"config key training.target.calibration.partition: got {cal['partition']!r}; "
            f"expected one of {', '.join(map(repr, sorted(parts)))} (keys of scaling.partitions)"
        )
    else:
        problems += _gpu_problems(
            "training.target.calibration.backend",
            [cal["backend"]],
            cal["partition"],
            parts,
            cal["framework"],
        )
    problems += _framework_problems(
        "training.target.calibration.backend", None, [cal["framework"]], [cal["backend"]]
    )
    if cfg["training"]["warmup_epochs"] >= cal["max_epochs"]:
        problems.append(
            f"config key training.target.calibration.max_epochs: got {cal['max_epochs']!r}; "
            f"expected more than training.warmup_epochs ({cfg['training']['warmup_epochs']})"
        )
    return problems


#: training.precision values that need a GPU (issue 32): fp16 autocast and TF32 matmuls
GPU_PRECISIONS = ("fp16", "tf32")


def _precision_problems(cfg: dict) -> list[str]:
    """The precisions of the matrix's runs (training.precision, or a sweep's or the tune's
    precisions) against their partitions: fp16 and tf32 only on partitions with GPUs
    (both frameworks have every precision and compile mode)."""
    parts = cfg["scaling"]["partitions"]
    bad = sorted(
        {
            (r.precision, r.partition)
            for r in run_table(cfg)
            if r.precision in GPU_PRECISIONS and not parts[r.partition]["gpus_per_node"]
        }
    )
    return [
        f"config key {_precision_key(cfg, prec)}: got {prec!r}, which needs a GPU, but "
        f"partition {part!r} has gpus_per_node 0; on a CPU use fp32 or bf16"
        for prec, part in bad
    ]


def _precision_key(cfg: dict, prec: str) -> str:
    """Where a precision of the matrix comes from: the first sweep (or the tune) that lists
    it in its precisions, else training.precision."""
    for i, sweep in enumerate(cfg["scaling"]["sweeps"]):
        if prec in (sweep.get("precisions") or []):
            return f"scaling.sweeps.{i}.precisions"
    if prec in ((cfg["scaling"].get("tune") or {}).get("precisions") or []):
        return "scaling.tune.precisions"
    return "training.precision"


def _check_select(cfg: dict) -> list[str]:
    """The selection (config key select) names known sweeps/partitions and keeps a run."""
    problems = check_selection(cfg)
    # the calibration runs belong to every selection: they alone do not count
    if not problems and cfg.get("select") and all(r.kind == "cal" for r in run_table(cfg)):
        problems.append(
            f"config key select: {describe_selection(cfg['select'])!r} matches no run of the "
            "scaling matrix"
        )
    return problems


def _only_cluster_select_problems(cfg: dict) -> list[str]:
    """only_cluster and select together keep a run of the scaling matrix (the
    calibration runs alone do not count)."""
    name = only_cluster(cfg)
    if name and cfg.get("select") and all(r.kind == "cal" for r in run_table(cfg)):
        return [
            f"config key only_cluster: cluster {name!r} and config key select together "
            "keep no run of the scaling matrix"
        ]
    return []


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
        else:
            for fw in tune["frameworks"]:
                problems += _gpu_problems("scaling.tune.backends", tune["backends"], p, parts, fw)
    problems += _framework_problems(
        "scaling.tune.backends", None, tune["frameworks"], tune["backends"]
    )
    for m in tune["lr_multipliers"]:
        if abs(round(m * 100) - m * 100) > 1e-6:
            problems.append(
                f"config key scaling.tune.lr_multipliers: got {m!r}; expected at most 2 decimals"
            )
    for w in tune["warmup_epochs"]:
        if w >= cfg["training"]["max_epochs"]:
            problems.append(
                f"config key scaling.tune.warmup_epochs: got {w!r}; expected fewer than "
                f"training.max_epochs ({cfg['training']['max_epochs']})"
            )
    return problems
