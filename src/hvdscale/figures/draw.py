"""Draw the scaling figures, each as PDF and PNG, into --outdir.

The command line, with what it reads and writes in full, is ``hvdscale plot``
(hvdscale.commands.plot).
"""

from __future__ import annotations

import json
import traceback
from pathlib import Path

from hvdscale.analysis.references import references_of
from hvdscale.analysis.view import NoData, framework_panels
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
    try:
        fig = figure.function()(*data)
        sub = fig.get_suptitle()
        suptitle(fig, f"{figure.title}: {sub}" if sub else figure.title)
        return fig, "ok"
    except NoData as exc:
        plt.close("all")
        fig, status = note_figure(figure.name, str(exc)), f"no data: {exc}"
    except Exception as exc:  # a figure must not stop the others
        plt.close("all")
        warn(f"figure {figure.name} failed: {exc!r}\n{traceback.format_exc()}")
        fig = note_figure(figure.name, f"figure failed: {type(exc).__name__}")
        status = f"error: {exc!r}"
    suptitle(fig, figure.title)
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
