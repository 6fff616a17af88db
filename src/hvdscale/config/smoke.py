"""The smoke study of a config (config key ``smoke: true``, ``config/smoke.yaml``).

A small first study that goes through every stage the real one does, on the same
partitions, launcher, environment and SLURM profile, before hundreds of node-hours are
spent: every partition the sweeps use, 1 and 2 workers, every backend and framework the
sweeps name, one per-worker batch and LR rule (the first sweep's first), one repeat, a
small dataset, a few epochs, the target from one short calibration run (or the config's
absolute target), the allreduce sweeps over small messages, the preflight per
partition, and a full report, in ``<results_dir>/smoke`` so it never mixes with the
study. Short time limits keep its worst case under one node-hour per partition for
config/thesis.yaml (``hvdscale plan config/thesis.yaml config/smoke.yaml``).

``apply`` is the one place that says what the smoke study is; ``validate_config`` calls
it, so Snakemake, ``hvdscale plan``/``status`` and the Makefile see the same study. It is
idempotent: a validated smoke config validates to itself.
"""

from __future__ import annotations

from pathlib import PurePosixPath

#: the worker counts of every sweep
WORKERS = [1, 2]
#: training.max_epochs (warm-up epochs: at most one less)
EPOCHS = 3
#: data.n_samples at most
SAMPLES = 10_000
#: data.n_shards (generation jobs) at most; the dataset does not depend on it
GENERATION_SHARDS = 2
#: a partition's runtime_min (and its retry's) at most: 10 jobs of config/thesis.yaml's
#: alpha (6 training runs, 1 calibration run, 3 allreduce sweeps) and its preflight fit
#: in 55 node-minutes
RUNTIME_MIN = 5
RUNTIME_MIN_RETRY = 10
#: training.time_limit_margin_s at most (SIGUSR1 this long before the short limit)
TIME_LIMIT_MARGIN_S = 60
#: the allreduce sweeps: messages up to 4 MiB (the gradient is 0.61 MB), few iterations
ALLREDUCE_SIZES = "8:4Mi:x4"
ALLREDUCE_ITERATIONS = 5
#: the report's title starts with it
TITLE_PREFIX = "Smoke study"
#: the folder under the config's results_dir
SUBDIR = "smoke"


def results_dir(results: str) -> str:
    """``<results>/smoke``; a results_dir that already ends in ``smoke`` stays."""
    path = PurePosixPath(results)
    return str(path if path.name == SUBDIR else path / SUBDIR)


def apply(cfg: dict) -> None:
    """Turn a config whose schema defaults are filled in into its smoke study (in place).

    Keeps the partitions, environment, launcher, model, data generator, references and
    ``select``; changes the sweeps, data size, epochs, repeats, target calibration, time
    limits, allreduce sweeps, results_dir and report title; drops the tuning sweep, the
    extra allreduce sweeps and strict (a smoke study's speedups are no regression test).
    """
    sweeps = cfg["scaling"]["sweeps"]
    batch, lr_rule = sweeps[0]["batch_sizes"][0], sweeps[0]["lr_rules"][0]
    cfg["scaling"]["sweeps"] = [
        {
            "name": sweep["name"],
            "partitions": list(sweep["partitions"]),
            "workers": list(WORKERS),
            "frameworks": list(sweep["frameworks"]),
            "backends": list(sweep["backends"]),
            "batch_sizes": [batch],
            "lr_rules": [lr_rule],
            "repeats": None,
        }
        for sweep in sweeps
    ]
    cfg["scaling"]["tune"] = None
    used = {p for sweep in sweeps for p in sweep["partitions"]}
    for name, part in cfg["scaling"]["partitions"].items():
        if name in used:
            part["runtime_min"] = min(part["runtime_min"], RUNTIME_MIN)
            retry = part.get("runtime_min_retry") or RUNTIME_MIN_RETRY
            part["runtime_min_retry"] = min(retry, RUNTIME_MIN_RETRY)

    data = cfg["data"]
    data["n_samples"] = min(data["n_samples"], SAMPLES)
    data["n_shards"] = min(data["n_shards"], GENERATION_SHARDS)

    tr = cfg["training"]
    tr["max_epochs"] = min(tr["max_epochs"], EPOCHS)
    tr["warmup_epochs"] = min(tr["warmup_epochs"], tr["max_epochs"] - 1)
    tr["repeats"] = 1
    tr["time_limit_margin_s"] = min(tr["time_limit_margin_s"], TIME_LIMIT_MARGIN_S)
    tgt = tr["target"]
    if tgt["mode"] == "calibrated":
        tgt["calibration"]["seeds"] = 1
        tgt["calibration"]["max_epochs"] = tr["max_epochs"]

    ar = cfg["allreduce"]
    ar.update(sizes=ALLREDUCE_SIZES, iterations=ALLREDUCE_ITERATIONS, sweeps=[])
    ar["fit_max_workers"] = None

    cfg["results_dir"] = results_dir(cfg["results_dir"])
    title = cfg["report"]["title"]
    if not title.startswith(TITLE_PREFIX):
        cfg["report"]["title"] = f"{TITLE_PREFIX}: {title}"[:120]
    cfg["strict"] = False
