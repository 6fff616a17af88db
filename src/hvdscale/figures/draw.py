"""Draw the scaling figures, each as PDF and PNG, into --outdir.

The command line, with what it reads and writes in full, is ``hvdscale plot``
(``add_arguments``/``run`` at the end of this module).
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from hvdscale.analysis.references import references_of
from hvdscale.analysis.tables import (
    default_epochs_path,
    read_epochs,
    read_headline,
    read_runs,
    read_summary,
)
from hvdscale.analysis.view import NoData, framework_panels, runs_metric
from hvdscale.cliargs import add_options, defaulted
from hvdscale.config.load import load_config
from hvdscale.errors import UserError
from hvdscale.figures.registry import BY_NAME, FIGURE_NAMES, Figure
from hvdscale.figures.style import STYLE, note_figure, save_figure, suptitle

FIGURES = FIGURE_NAMES  # the names, in the registry's order


def draw_figure(figure: Figure, data: tuple, warn) -> tuple[object, str]:
    """(matplotlib figure, 'ok' | 'no data: reason' | 'error: ...'); never raises: a
    figure without data, or whose drawing failed, becomes a note saying so."""
    import matplotlib.pyplot as plt

    runs, summary, *rest = data
    data = (framework_panels(runs), framework_panels(summary), *rest)
    title = figure.title_for(runs_metric(runs))  # the target's metric: loss or accuracy
    try:
        fig = figure.function()(*data)
        sub = fig.get_suptitle()
        suptitle(fig, f"{title}: {sub}" if sub else title)
        return fig, "ok"
    except NoData as exc:
        plt.close("all")
        fig, status = note_figure(figure.name, str(exc)), f"no data: {exc}"
    except Exception as exc:  # a figure must not stop the others
        plt.close("all")
        warn(f"figure {figure.name} failed: {exc!r}\n{traceback.format_exc()}")
        fig = note_figure(figure.name, f"figure failed: {type(exc).__name__}")
        status = f"error: {exc!r}"
    suptitle(fig, title)
    return fig, status


def plot_all(
    runs,
    summary,
    epochs,
    cm,
    outdir: str | Path,
    names=None,
    warn=None,
    refs=None,
    headline=None,
) -> dict[str, str]:
    """Write every figure; returns {name: 'ok' | 'no data: reason' | 'error: ...'}.
    ``refs``: the config's ``references`` (None: the schema's defaults); ``headline``:
    headline.csv (None: no tuned speedups)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    warn = warn or (lambda msg: None)
    refs = references_of(None) if refs is None else refs
    data = (runs, summary, epochs, cm, refs, headline)
    result = {}
    with plt.rc_context(STYLE):
        for name in names or FIGURES:
            fig, result[name] = draw_figure(BY_NAME[name], data, warn)
            save_figure(fig, outdir, name)
    return result


def load_costmodel(path) -> dict | None:
    if not path:
        return None
    path = Path(path)
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UserError(
            f"cost model {path}: not valid JSON ({exc.msg}, line {exc.lineno})"
        ) from None


# -------------------------------------------------- the command: hvdscale plot


def add_arguments(p):
    add_options(
        p,
        "--runs",
        "--summary",
        ("--epochs", "per-epoch table (default: epochs.csv next to --runs; optional)"),
        ("--costmodel", "costmodel.json from 'hvdscale fit-costmodel' (optional)"),
        (
            "--headline",
            "headline.csv from 'hvdscale aggregate' (the tuned time-to-target speedups; "
            "default: headline.csv next to --runs where it exists)",
        ),
        (
            "--config",
            "the validated config JSON (results/config/full.json) for its references "
            "(default: the schema's)",
        ),
        ("--outdir", defaulted("results/plots")),
        ("--only", {"nargs": "*", "choices": FIGURES, "help": "draw only these figures"}),
    )


def run(args) -> int:
    """Draw the scaling figures, each as PDF and PNG, into --outdir.

    The figures are those of the registry ``hvdscale.figures.registry`` (fixed names,
    {outdir}/{name}.pdf and .png, in its order; ``--only`` picks some), each drawn by its
    registry's draw function from runs.csv, summary.csv, epochs.csv, costmodel.json and the
    config's references (``--config``; without it the schema's defaults).

    Where the scaling sweep has several per-worker batch sizes, the worker-scaling figures
    use the batch size with the most worker counts; where it has several LR rules and only
    one can be shown, 'none' is preferred (``hvdscale.analysis.view``). With missing data
    a figure is still written, with a centred "no data for this figure (reason)" note. The
    same inputs give byte-identical files.

    Example
      hvdscale plot --runs results/scaling/runs.csv --summary results/scaling/summary.csv \
      --costmodel results/scaling/costmodel.json --config results/config/full.json \
      --outdir results/plots
    """
    runs = read_runs(args.runs)
    summary = read_summary(args.summary)
    epath = Path(args.epochs) if args.epochs else default_epochs_path(args.runs)
    epochs = read_epochs(epath) if epath.exists() else None
    cm = load_costmodel(args.costmodel)
    hpath = Path(args.headline) if args.headline else Path(args.runs).with_name("headline.csv")
    head = read_headline(hpath) if args.headline or hpath.exists() else None
    refs = references_of(load_config(args.config) if args.config else None)

    def warn(msg):
        print(f"hvdscale plot: warning: {msg}", file=sys.stderr)

    result = plot_all(
        runs, summary, epochs, cm, args.outdir, names=args.only, warn=warn, refs=refs,
        headline=head,
    )  # fmt: skip
    for name, st in result.items():
        if st != "ok":
            warn(f"{name}: {st}")
    print(
        f"plot: wrote {len(result)} figures (PDF and PNG) to {args.outdir}; "
        f"{sum(v == 'ok' for v in result.values())} with data"
    )
    return 0
