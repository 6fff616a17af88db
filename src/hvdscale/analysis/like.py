"""Like against like: what two sets of runs share before one is compared with the other.

One definition, used by every grouping, baseline and pairing of the analysis (summary,
headline, tuning, the fastest 1-worker configuration, the frameworks and step-settings
sections) and by ``hvdscale compare``:

- the system and step setting (``LIKE_KEYS``): partition, framework, backend, precision,
  compile. A baseline is always of the same system and setting: a bf16 or compiled
  n-worker run is never compared with fp32 or eager 1-worker runs;
- the scaling group (``GROUP_KEYS``): those plus the per-worker batch and the LR rule;
  a configuration (``CONFIG_KEYS``) adds the workers;
- the tuning state and run kind: untuned scaling runs (``plain``: no tuning candidate,
  no calibration run, no re-run) are compared with untuned runs; tuned figures come
  from the selected candidates' re-runs (analysis/tuning.py) and are compared with
  tuned 1-worker re-runs. Tuning groups are ``TUNE_KEYS`` (the setting, batch, workers);
- pairs: within one group two runs are paired only where they share a seed
  (``seed_ids``: kind and repeat); a group holding two runs of one seed is not like
  against like, and the bootstrap refuses it (analysis/stats.py).
"""

from __future__ import annotations

import pandas as pd

from hvdscale.analysis.columns import FRAMEWORK_DEFAULT, with_framework
from hvdscale.matrix.runid import (
    COMPILE_MODES,
    CONFIG_KEYS,
    GROUP_KEYS,
    PRECISIONS,
    step_setting_suffix,
)
from hvdscale.matrix.runtable import SEED_KINDS

#: the step setting of a run (training.precision, training.compile)
SETTING_KEYS = ["precision", "compile"]
#: what every comparison holds fixed: the system and the step setting
LIKE_KEYS = ["partition", "framework", "backend", *SETTING_KEYS]
#: a tuning group: the candidates of one setting, per-worker batch and worker count
TUNE_KEYS = [*LIKE_KEYS, "batch_per_worker", "workers"]
#: the default step setting (a study without the axes has only it)
DEFAULT_SETTING = (PRECISIONS[0], COMPILE_MODES[0])

__all__ = [
    "CONFIG_KEYS",
    "DEFAULT_SETTING",
    "GROUP_KEYS",
    "LIKE_KEYS",
    "SETTING_KEYS",
    "TUNE_KEYS",
    "like_key",
    "plain",
    "seed_ids",
    "setting_label",
    "stream_tag",
]


def plain(runs: pd.DataFrame) -> pd.DataFrame:
    """The untuned scaling runs of ``runs`` (any status): no tuning candidate, no
    calibration run, no re-run. Columns framework, precision and compile filled where a
    frame written before them lacks them (analysis.columns.with_framework)."""
    r = with_framework(runs)
    cand = r["candidate"].fillna("").astype(str) if "candidate" in r else ""
    kind = r["kind"].fillna("").astype(str) if "kind" in r else ""
    return r[(cand == "") & (kind == "")]


def like_key(row, keys: list[str] = LIKE_KEYS) -> tuple:
    """The values of ``keys`` of one row (a mapping, a Series or an itertuples row)."""
    get = row.get if hasattr(row, "get") else lambda k: getattr(row, k)
    return tuple(get(k) for k in keys)


def seed_ids(runs: pd.DataFrame) -> list[int]:
    """One id per run's seed (kind, repeat): the bootstrap pairs two runs only where they
    share a seed (a paired design), never a re-run with a scaling run of the same index."""
    kinds = runs["kind"].fillna("").astype(str) if "kind" in runs else [""] * len(runs)
    return [SEED_KINDS.get(k, 9) * 1_000_000 + int(r) for k, r in zip(kinds, runs["repeat"])]


def stream_tag(partition, framework=FRAMEWORK_DEFAULT, precision="fp32", compile="off") -> str:
    """The system and setting in a bootstrap stream's name: the partition, '/framework'
    where it is not the default, and the run id's setting suffix ('_bf16_cdefault') where
    the setting is not fp32/off, so the streams of a study without those axes keep their
    names (and their intervals)."""
    tag = f"{partition}/{framework}" if framework != FRAMEWORK_DEFAULT else str(partition)
    return tag + step_setting_suffix(str(precision), str(compile))


def setting_label(precision, compile) -> str:
    """How the report names a step setting: 'bf16, compile default' ('fp32, eager' for
    the default)."""
    comp = "eager" if str(compile) == COMPILE_MODES[0] else f"compile {compile}"
    return f"{precision}, {comp}"
