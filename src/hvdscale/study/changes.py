"""Which finished runs an edited config retrains, and which keys made them.

Snakemake reruns a finished training run when the run's config slice changed: the slice
(``hvdscale.matrix.runtable.run_config``) is a param of rule write_run_config, so a new
slice rewrites ``RUNS/<run_id>/config.json``, which is newer than the run's record, so
train_run runs again. The same holds for the study's target (``target_config``, rule
write_target_config -> calibrate_target): a new target slice rewrites target.json, which
every run but the calibration runs reads. This module compares the slices stored by
those rules with the slices the current config gives, through the same functions, and
names the config keys that differ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from hvdscale.config.load import validate_config
from hvdscale.matrix.runkinds import target_config
from hvdscale.matrix.runtable import run_config


@dataclass
class Retrain:
    """Finished runs (a record exists) that the current config trains again."""

    # run_id -> why: the changed keys (dotted), or one sentence
    runs: dict[str, list[str]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.runs)

    def keys(self) -> list[str]:
        """Every changed key or reason, in first-seen order."""
        out: dict[str, None] = {}
        for why in self.runs.values():
            out.update(dict.fromkeys(why))
        return list(out)

    def by_reason(self) -> list[tuple[tuple[str, ...], list[str]]]:
        """(reasons, run ids) groups, the largest group first."""
        groups: dict[tuple[str, ...], list[str]] = {}
        for run_id, why in self.runs.items():
            groups.setdefault(tuple(why), []).append(run_id)
        return sorted(groups.items(), key=lambda g: (-len(g[1]), g[0]))


def changed_keys(old, new, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two configs (lists compare whole)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            key = f"{prefix}.{k}" if prefix else str(k)
            if k not in old or k not in new:
                out.append(key)
            else:
                out += changed_keys(old[k], new[k], key)
        return out
    return [] if old == new else [prefix or "(whole config)"]


def _stored(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def slice_keys(stored: dict | None, current: dict) -> list[str]:
    """Why a stored slice (as written: validated, defaults filled in) differs from the
    current one; [] when it does not. Keys the slice itself does not hold (defaults
    that validation derives from another key) are named only when nothing else is."""
    if stored is None:
        return ["config.json missing or unreadable (rewritten)"]
    keys = changed_keys(stored, validate_config(current))
    # a results_dir other than the one the slice was written for is a moved study:
    # Snakemake has no params record at the new paths, and the run's hash ignores it
    keys = [k for k in keys if k != "results_dir"]
    own = [k for k in keys if _holds(current, k)]
    return own or keys


def _holds(cfg: dict, key: str) -> bool:
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def target_keys(cfg: dict, results: Path) -> list[str]:
    """Changed keys of the target's slice (results/config/target.json); [] when unchanged
    or not written yet (no run read a target then)."""
    path = results / "config" / "target.json"
    if not path.exists():
        return []
    return [f"target: {k}" for k in slice_keys(_stored(path), target_config(cfg))]


def retrained_runs(cfg: dict, runs, results: str | Path) -> Retrain:
    """The runs of ``runs`` with a record (metrics.json) that Snakemake trains again."""
    results = Path(results)
    by_id = {r.run_id: r for r in runs}
    target = None  # computed once, only when some run has a record
    out = Retrain()
    for run in runs:
        rdir = results / "runs" / run.run_id
        metrics = rdir / "metrics.json"
        if not metrics.exists():
            continue
        cfg_json = rdir / "config.json"
        why = slice_keys(_stored(cfg_json), run_config(cfg, run.run_id, by_id))
        if not why and cfg_json.stat().st_mtime > metrics.stat().st_mtime:
            why = ["config.json is newer than the record"]
        if run.kind != "cal":
            if target is None:
                target = target_keys(cfg, results)
            why += target
        if why:
            out.runs[run.run_id] = why
    return out


def describe(retrain: Retrain, limit: int | None = None) -> list[str]:
    """Lines naming the runs that retrain, grouped by the keys that changed; ``limit``
    run ids per group at most (None: all)."""
    if not retrain:
        return []
    lines = [
        f"{len(retrain)} finished run(s) will retrain: their config slice changed "
        f"({', '.join(retrain.keys())})"
    ]
    for why, ids in retrain.by_reason():
        shown = ids if limit is None else ids[:limit]
        more = f" and {len(ids) - len(shown)} more" if len(ids) > len(shown) else ""
        lines.append(f"    {', '.join(why)}: {', '.join(shown)}{more}")
    return lines
