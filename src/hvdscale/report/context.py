"""What every report section reads: the run tables, the cost model, the provenance and
the figures' captions, gathered once by ``hvdscale report``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from hvdscale.figures.registry import BY_NAME
from hvdscale.target import target_spec


@dataclass
class ReportData:
    info: dict  # provenance.collect()
    cfg: dict | None
    runs: pd.DataFrame | None
    summary: pd.DataFrame
    status: pd.DataFrame
    cm: dict | None
    plots_dir: Path
    captions: dict[str, str] = field(default_factory=dict)  # figure name -> markup
    references: pd.DataFrame | None = None  # references.csv (hvdscale.analysis.references)
    epochs: pd.DataFrame | None = None  # epochs.csv (time to any target)
    tuned: pd.DataFrame | None = None  # tuned.csv (aggregate_runs, after the re-runs)
    systems: list[dict] | None = None  # systems.csv rows (analysis.systems); None: no section
    headline: pd.DataFrame | None = None  # headline.csv (analysis.tables.read_headline)
    target: dict | None = None  # target.json (hvdscale.target.read_target)
    preflight: list[dict] | None = None  # results/preflight/*.json (launch.preflight)

    def figure(self, d, name: str) -> None:
        """Figure ``name`` of the registry (its PNG) with its caption."""
        caption = self.captions.get(name) or BY_NAME[name].title + "."
        d.figure(self.plots_dir / f"{name}.png", caption)


def report_target(r) -> dict:
    """The target the report's sentences name: target.json (``r.target``), else the
    config's (its metric from the workload); hvdscale.target.target_words puts it into
    words. Read, never computed."""
    target = getattr(r, "target", None)
    return target if target is not None else target_spec(getattr(r, "cfg", None))
