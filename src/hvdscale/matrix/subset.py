"""Selection of a subset of the scaling matrix without editing the sweeps.

The config key ``select`` (``snakemake --config select="partition=alpha workers=1-8"``)
is either a string of ``key=values`` items separated by spaces or ``;``, or a mapping
of the same keys (in a config file). Keys:

  sweep      sweep names (scaling.sweeps[].name)
  partition  partition names
  backend    backend names (hvdscale.matrix.backends: nccl, mpi, gloo)
  lr         none, linear, sqrt
  workers    worker counts and ranges: ``1,2,4`` or ``1-8`` or ``16-`` (16 and more)
  batch      per-worker batch sizes and ranges
  repeat     repeat indices and ranges (``0`` runs the first repeat only)

Values are comma-separated; a run is selected when it matches every given key. The
schema checks the syntax (the key ``select``), ``check`` the names against the config.
An empty selection (null, "" or {}) selects every run.
"""

from __future__ import annotations

import re

from hvdscale.matrix import backends

KEYS = ("sweep", "partition", "backend", "lr", "workers", "batch", "repeat")
NUMERIC = ("workers", "batch", "repeat")
# the schema's patterns (workflow/schemas/config.schema.yaml repeats them)
NAME_LIST = r"^[a-z][a-z0-9-]{0,31}(,[a-z][a-z0-9-]{0,31})*$"
RANGE_LIST = r"^([0-9]+|[0-9]+-[0-9]*)(,([0-9]+|[0-9]+-[0-9]*))*$"
ITEM = r"(sweep|partition|backend|lr|workers|batch|repeat)=[a-z0-9,-]+"
STRING = rf"^[ ;]*({ITEM}([ ;]+{ITEM})*)?[ ;]*$"


class SelectError(ValueError):
    """A selection names something the config does not have (message names the key)."""


def parse(select) -> dict[str, list]:
    """``select`` (string, mapping or None) -> {key: [names] or [(lo, hi), ...]}."""
    if not select:
        return {}
    if isinstance(select, str):
        if not re.fullmatch(STRING, select):
            raise SelectError(
                f"config key select: got {select!r}; expected items key=values "
                f"(keys {', '.join(KEYS)}), e.g. 'partition=alpha workers=1-8 repeat=0'"
            )
        items = dict(item.split("=", 1) for item in re.split(r"[ ;]+", select.strip(" ;")))
    else:
        items = {k: str(v) for k, v in select.items()}
    out: dict[str, list] = {}
    for key, value in items.items():
        if key not in KEYS:
            raise SelectError(f"config key select.{key}: unknown; allowed: {', '.join(KEYS)}")
        if key in NUMERIC:
            if not re.fullmatch(RANGE_LIST, value):
                raise SelectError(
                    f"config key select.{key}: got {value!r}; expected numbers and ranges "
                    "like 1,2,4 or 1-8 or 16-"
                )
            ranges = []
            for part in value.split(","):
                lo, _, hi = part.partition("-")
                if "-" in part:
                    ranges.append((int(lo), int(hi) if hi else None))
                else:
                    ranges.append((int(lo), int(lo)))
            out[key] = ranges
        else:
            if not re.fullmatch(NAME_LIST, value):
                raise SelectError(
                    f"config key select.{key}: got {value!r}; expected comma-separated names"
                )
            out[key] = value.split(",")
    return out


def _in(ranges: list, x: int) -> bool:
    return any(lo <= x and (hi is None or x <= hi) for lo, hi in ranges)


def sweep_selected(sel: dict, sweep: dict) -> bool:
    return "sweep" not in sel or sweep.get("name", "sweep") in sel["sweep"]


def run_selected(sel: dict, run) -> bool:
    """Whether a run (hvdscale.matrix.runtable.Run) matches every key of the parsed selection."""
    names = {"partition": run.partition, "backend": run.backend, "lr": run.lr_rule}
    for key, value in names.items():
        if key in sel and value not in sel[key]:
            return False
    nums = {"workers": run.workers, "batch": run.batch, "repeat": run.repeat}
    return all(key not in sel or _in(sel[key], value) for key, value in nums.items())


def check(cfg: dict) -> list[str]:
    """Problems of the config's selection against its sweeps and partitions."""
    try:
        sel = parse(cfg.get("select"))
    except SelectError as exc:
        return [str(exc)]
    problems = []
    known = {
        "sweep": {s.get("name", "sweep") for s in cfg["scaling"]["sweeps"]},
        "partition": set(cfg["scaling"]["partitions"]),
        "backend": set(backends.names()),
        "lr": {"none", "linear", "sqrt"},
    }
    for key, allowed in known.items():
        for name in sel.get(key, []):
            if name not in allowed:
                problems.append(
                    f"config key select.{key}: got {name!r}; expected one of "
                    f"{', '.join(map(repr, sorted(allowed)))}"
                )
    return problems


def describe(select) -> str:
    """The selection in its canonical string form ('' for everything)."""
    sel = parse(select)
    parts = []
    for key in KEYS:
        if key not in sel:
            continue
        if key in NUMERIC:
            vals = [
                str(lo) if lo == hi else f"{lo}-{'' if hi is None else hi}" for lo, hi in sel[key]
            ]
        else:
            vals = sel[key]
        parts.append(f"{key}={','.join(vals)}")
    return " ".join(parts)
