"""The run table: the scaling matrix of a config, run ids, and per-run config slices.

``run_table`` expands the sweeps (and the re-tuning candidates of ``scaling.tune``) into
one ``Run`` per training run; ``run_config`` and ``allreduce_config`` cut out the part of
the config one training run or one allreduce sweep depends on. Re-exported by
``hvdscale.config.load``.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from hvdscale.errors import ConfigError
from hvdscale.matrix import backends
from hvdscale.matrix.runid import (
    COMPILE_MODES,
    PRECISIONS,
    format_multiplier,
    parse_run_id,
    rerun_candidate_id,
    step_setting_order,
    step_setting_suffix,
)
from hvdscale.matrix.subset import parse as parse_selection
from hvdscale.matrix.subset import run_selected, sweep_selected
from hvdscale.slurm.clusters import in_scope
from hvdscale.slurm.jobspec import nodes_for, workers_per_node_for

# the kinds of run and their index in the seed derivation (run_seed)
SEED_KINDS = {"": 0, "cal": 1, "rerun": 2}


def run_seed(cfg_seed: int, repeat: int, kind: str = "") -> int:
    """The seed of a run's initial weights and shuffle, from (config seed, repeat, kind).

    Runs of the same repeat index and kind share it whatever their worker count (a
    paired design); repeats and kinds differ. The dataset never depends on it.
    """
    import numpy as np

    if kind not in SEED_KINDS:
        raise ConfigError(f"run kind {kind!r}: expected one of {', '.join(map(repr, SEED_KINDS))}")
    ss = np.random.SeedSequence([int(cfg_seed), int(repeat), SEED_KINDS[kind]])
    return int(ss.generate_state(1)[0])


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
    # '' (a scaling or tuning-candidate run), 'cal' (target calibration) or 'rerun'
    kind: str = ""
    # the config's seed (key seed); the run's own seed derives from it (property seed)
    seed_base: int = 0
    # the training framework (hvdscale.matrix.backends.FRAMEWORKS); not part of the seed, so
    # the runs of both frameworks with the same repeat are paired
    framework: str = backends.DEFAULT_FRAMEWORK
    # the step's arithmetic and compilation (issue 32: training.precision / compile, or a
    # sweep's precisions / compile_modes); not part of the seed either: paired runs
    precision: str = PRECISIONS[0]
    compile: str = COMPILE_MODES[0]

    @property
    def candidate(self) -> str:
        """'' for a run of the scaling sweeps; 'm{mult}_wu{warmup}' for a tuning candidate."""
        if self.lr_mult is None:
            return ""
        return f"m{format_multiplier(self.lr_mult)}_wu{self.tune_warmup}"

    @property
    def run_id(self) -> str:
        cand = f"_{self.candidate}" if self.candidate else ""
        kind = f"_{self.kind}" if self.kind else ""
        fw = "" if self.framework == backends.DEFAULT_FRAMEWORK else f"_{self.framework}"
        step = step_setting_suffix(self.precision, self.compile)
        return (
            f"{self.partition}{fw}_{self.backend}_n{self.nodes}_w{self.workers}_b{self.batch}"
            f"_lr{self.lr_rule}{step}{cand}{kind}_r{self.repeat}"
        )

    @property
    def seed(self) -> int:
        """Seed of the initial weights and the shuffle: run_seed(seed_base, repeat, kind)."""
        return run_seed(self.seed_base, self.repeat, self.kind)

    @property
    def global_batch(self) -> int:
        return self.workers * self.batch

    def as_dict(self) -> dict:
        d = asdict(self)
        d["run_id"] = self.run_id
        d["global_batch"] = self.global_batch
        d["candidate"] = self.candidate
        d["seed"] = self.seed
        return d


def run_table(cfg: dict) -> list[Run]:
    """Every run of the scaling matrix (union of the sweeps), the tuning candidates and,
    in calibrated target mode, the calibration runs; sorted, without duplicates.

    Scaling runs and candidates only of the config's selection (key ``select``,
    hvdscale.matrix.subset); the calibration runs always (the target needs them). With
    ``only_cluster`` only the runs on that cluster's partitions (slurm/clusters.py). The
    re-runs of the selected tuning candidates depend on the selection: rerun_runs.
    """
    sel = parse_selection(cfg.get("select"))
    runs: dict[str, Run] = {}
    parts = cfg["scaling"]["partitions"]
    seed = int(cfg.get("seed", 0))
    for sweep in cfg["scaling"]["sweeps"]:
        if not sweep_selected(sel, sweep):
            continue
        for fw, p, w, be, b, lr, (prec, comp) in itertools.product(
            sweep.get("frameworks") or [backends.DEFAULT_FRAMEWORK],
            sweep["partitions"],
            sweep["workers"],
            sweep["backends"],
            sweep["batch_sizes"],
            sweep["lr_rules"],
            step_settings(cfg, sweep),
        ):
            for r in range(sweep.get("repeats") or cfg["training"]["repeats"]):
                run = _make_run(
                    parts[p],
                    p,
                    be,
                    w,
                    b,
                    lr,
                    r,
                    seed_base=seed,
                    framework=fw,
                    precision=prec,
                    compile=comp,
                )
                if run_selected(sel, run) and in_scope(cfg, p):
                    runs[run.run_id] = run
    for run in tune_runs(cfg):
        if run_selected(sel, run) and in_scope(cfg, run.partition):
            runs[run.run_id] = run
    for run in calibration_runs(cfg):
        if in_scope(cfg, run.partition):  # only_cluster: the config check refuses others
            runs[run.run_id] = run
    return [runs[k] for k in sorted(runs, key=run_sort_key(runs))]


def step_settings(cfg: dict, sweep: dict) -> list[tuple[str, str]]:
    """(precision, compile mode) pairs of a sweep (or of scaling.tune): its keys
    ``precisions`` and ``compile_modes``, each defaulting to training.precision /
    training.compile (issue 32)."""
    tcfg = cfg["training"]
    precs = sweep.get("precisions") or [tcfg.get("precision") or PRECISIONS[0]]
    comps = sweep.get("compile_modes") or [tcfg.get("compile") or COMPILE_MODES[0]]
    return list(itertools.product(precs, comps))


def calibration_runs(cfg: dict) -> list[Run]:
    """The target calibration runs (calibrated target mode; none in absolute mode).

    One per seed of training.target.calibration: 1 worker, its framework, partition,
    backend, per-worker batch and LR rule, repeats 0..seeds-1, kind cal.
    """
    tgt = cfg["training"].get("target") or {}
    if tgt.get("mode") != "calibrated":
        return []
    cal = tgt["calibration"]
    part = cfg["scaling"]["partitions"][cal["partition"]]
    return [
        _make_run(
            part,
            cal["partition"],
            cal["backend"],
            1,
            cal["batch"],
            cal["lr_rule"],
            r,
            kind="cal",
            seed_base=int(cfg.get("seed", 0)),
            framework=cal.get("framework") or backends.DEFAULT_FRAMEWORK,
            precision=cfg["training"].get("precision") or PRECISIONS[0],
            compile=cfg["training"].get("compile") or COMPILE_MODES[0],
        )
        for r in range(cal["seeds"])
    ]


def tune_runs(cfg: dict) -> list[Run]:
    """Every candidate run of the re-tuning sweep (scaling.tune; none when it is null)."""
    tune = cfg["scaling"].get("tune")
    if not tune:
        return []
    parts = cfg["scaling"]["partitions"]
    out = []
    for fw, p, w, be, b, lr, m, wu, (prec, comp) in itertools.product(
        tune.get("frameworks") or [backends.DEFAULT_FRAMEWORK],
        tune["partitions"],
        tune["workers"],
        tune["backends"],
        tune["batch_sizes"],
        tune["lr_rules"],
        tune["lr_multipliers"],
        tune["warmup_epochs"],
        step_settings(cfg, tune),
    ):
        for r in range(tune["repeats"]):
            out.append(
                _make_run(
                    parts[p],
                    p,
                    be,
                    w,
                    b,
                    lr,
                    r,
                    lr_mult=round(float(m), 2),
                    tune_warmup=int(wu),
                    seed_base=int(cfg.get("seed", 0)),
                    framework=fw,
                    precision=prec,
                    compile=comp,
                )
            )
    return out


def _make_run(
    part: dict,
    partition: str,
    backend: str,
    workers: int,
    batch: int,
    lr_rule: str,
    repeat: int,
    **extra,
) -> Run:
    """A run on partition ``part`` (its config section), laid out by hvdscale.slurm.jobspec;
    ``extra``: the candidate (lr_mult, tune_warmup), kind, seed_base and framework."""
    return Run(
        partition=partition,
        backend=backend,
        nodes=nodes_for(workers, part),
        workers=workers,
        batch=batch,
        lr_rule=lr_rule,
        repeat=repeat,
        workers_per_node=workers_per_node_for(workers, part),
        gpus_per_node=part["gpus_per_node"],
        **extra,
    )


def run_sort_key(runs: dict[str, Run]):
    def key(run_id: str):
        r = runs[run_id]
        cand = (0, 0.0, 0) if r.lr_mult is None else (1, r.lr_mult, r.tune_warmup)
        kind = SEED_KINDS[r.kind]
        fw = backends.FRAMEWORKS.index(r.framework) if r.framework in backends.FRAMEWORKS else 9
        step = step_setting_order(r.precision, r.compile)
        return (
            r.partition,
            fw,
            r.backend,
            step,
            r.batch,
            r.lr_rule,
            cand,
            kind,
            r.workers,
            r.repeat,
        )

    return key


def find_run(cfg: dict, run_id: str, runs: dict[str, Run] | None = None) -> Run:
    """The run ``run_id`` of the config's matrix (pass ``runs``, a run_id -> Run dict, to
    avoid expanding the matrix again on every call). A re-run id (kind rerun) is found
    when its candidate is in the matrix and its repeat below scaling.tune.rerun_repeats,
    whether or not the candidate was selected."""
    if runs is None:
        runs = {r.run_id: r for r in run_table(cfg)}
    if run_id in runs:
        return runs[run_id]
    d = parse_run_id(run_id)  # raises a clear error for a malformed id
    if d["kind"] == "rerun" and d["candidate"]:
        tune = cfg["scaling"].get("tune") or {}
        cand_id = rerun_candidate_id(run_id)
        if cand_id in runs and d["repeat"] < tune.get("rerun_repeats", 0):
            return dataclasses.replace(runs[cand_id], repeat=d["repeat"], kind="rerun")
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
    The target value is not in it (train_run reads results/scaling/target.json); a
    calibration run gets training.target.calibration's max_epochs, no max_train_s and
    stop_at_target false. results_dir rides along unchanged (the params Snakemake recorded
    for existing studies carry it, so they read the same), but it is no part of the run's
    configuration: training ignores it and the run's hash sets it to its default
    (config.load.run_config_hash), so a study moved to another results_dir keeps its runs.
    """
    run = find_run(cfg, run_id, runs)
    sub = {
        k: copy.deepcopy(cfg[k])
        for k in ("seed", "results_dir", "data", "model", "training", "environment")
    }
    if cfg.get("workload", "stress-strain") != "stress-strain":  # default: slices as before
        sub["workload"] = cfg["workload"]
    # the target value reaches training as target.json (train_run's input --target), so
    # it is not part of the slice: editing the percent retrains no calibration run
    tgt = sub["training"].pop("target", None) or {}
    sub["training"].pop("target_test_loss", None)
    if run.framework != "torch-ddp":  # torch-ddp's MKL only: editing it retrains no Horovod-TF run
        sub["training"].pop("mkl_code_path", None)
    if run.kind == "cal":
        # a calibration run: until flat (or its max_epochs), no stop at a target (none yet)
        cal = copy.deepcopy(tgt["calibration"])
        if cal.get("framework") == backends.DEFAULT_FRAMEWORK:
            del cal["framework"]  # Horovod calibration runs: the slice as before issue 19
        sub["training"]["target"] = {"mode": "calibrated", "calibration": cal}
        sub["training"]["max_epochs"] = cal["max_epochs"]
        sub["training"]["max_train_s"] = None
        sub["training"]["stop_at_target"] = False
    sub["scaling"] = {
        "partitions": {run.partition: partition_slice(cfg, run.partition)},
        "sweeps": [
            {
                "name": "run",
                "partitions": [run.partition],
                "workers": [run.workers],
                "backends": [run.backend],
                "batch_sizes": [run.batch],
                "lr_rules": [run.lr_rule],
                **_frameworks_key(run),
            }
        ],
    }
    # the repeat index must stay reachable: keep the repeat count
    sub["training"]["repeats"] = cfg["training"]["repeats"]
    # the run's step setting (a sweep's precisions / compile_modes, issue 32) as the slice's
    # training defaults, so the one-point sweep finds the run again; unchanged for runs at
    # the config's own training.precision / compile
    sub["training"]["precision"] = run.precision
    sub["training"]["compile"] = run.compile
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
            **_frameworks_key(run),
            "repeats": cfg["scaling"]["tune"]["repeats"],
            "rerun_repeats": cfg["scaling"]["tune"]["rerun_repeats"],
        }
    return sub


def partition_slice(cfg: dict, partition: str) -> dict:
    """A partition's keys in a run's or sweep's config slice: not its site sbatch flags
    (mail, reservation: how the job is queued, not what it computes), so editing them
    retrains nothing and the slices of earlier configs stay as they were. ``gpu_bind``
    only on GPU partitions: there it decides where each rank computes (one GPU of its own
    under cgroup isolation, or all of the node's, which NCCL's peer-to-peer paths need), so
    a change retrains; CPU partitions ignore it, and their slices stay as they were.
    ``emulated_gpus`` only when true (a test cluster's partition: its ranks train on the
    CPU), so the slices of every other partition stay as they were."""
    part = copy.deepcopy(cfg["scaling"]["partitions"][partition])
    part.pop("sbatch_flags", None)
    if not backends.is_gpu_partition(part):
        part.pop("gpu_bind", None)
    if not part.get("emulated_gpus", False):
        part.pop("emulated_gpus", None)
    return part


def _frameworks_key(run: Run) -> dict:
    """The sweep key ``frameworks`` of a run's config slice: only for a framework other
    than the default, so the slices (and config hashes) of Horovod runs stay as they were."""
    return {} if run.framework == backends.DEFAULT_FRAMEWORK else {"frameworks": [run.framework]}
