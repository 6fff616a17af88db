"""The figures' common look: matplotlib style, colours and markers per backend and
phase, axis and legend helpers with fixed margins, the "no data" figure, and saving a
figure as PDF and PNG with reproducible bytes (no creation date, no software stamp)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hvdscale.io import atomic_path
from hvdscale.matrix import backends

STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": 150,
    "font.size": 8.5,
    "axes.titlesize": 9,
    "axes.labelsize": 8.5,
    "xtick.labelsize": 7.5,
    "ytick.labelsize": 7.5,
    "legend.fontsize": 7,
    "legend.frameon": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.3,
    "lines.markersize": 4,
    "errorbar.capsize": 2,
    "pdf.fonttype": 3,
    "figure.constrained_layout.use": False,
}
LR_LS = {"none": "-", "linear": "--", "sqrt": "-."}
PHASE_COLOR = {
    "data": "#66c2a5",
    "compute": "#8da0cb",
    "sync": "#fc8d62",
    "update": "#e78ac3",
    "other": "#c8c8c8",
}
WIDTH = 7.0  # inches: the text width of the A4 report


def backend_style(backend: str) -> dict:
    """Colour, marker and line style of a backend's lines (hvdscale.matrix.backends; an unknown
    backend: matplotlib's next colour, circles, solid lines)."""
    entry = next((b for b in backends.entries() if b.name == backend), None)
    entry = entry or backends.Backend(backend)
    return {"color": entry.color, "marker": entry.marker, "ls": entry.linestyle}


def partition_colors(parts) -> dict:
    import matplotlib

    cmap = matplotlib.colormaps["tab10"]
    return {p: cmap(i % 10) for i, p in enumerate(sorted(parts))}


def workers_axis(ax, workers, max_w=None):
    ws = sorted({int(w) for w in workers})
    if max_w:
        ws = sorted(set(ws) | {max_w})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ws)
    ax.set_xticklabels([str(w) for w in ws])
    ax.minorticks_off()
    ax.set_xlabel("workers (ranks)")


def suptitle(fig, text):
    h = fig.get_size_inches()[1]
    fig.suptitle(text, fontsize=9.5, y=1 - 0.08 / h, va="top")


def _log_axis(axis, set_scale) -> None:
    """Log axis labelled 0.02, 0.05, 0.1 ... instead of powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    set_scale("log")
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def log_y(ax) -> None:
    _log_axis(ax.yaxis, ax.set_yscale)


def log_x(ax) -> None:
    _log_axis(ax.xaxis, ax.set_xscale)


def panel_note(ax, text, fontsize=7.5, color="0.4"):
    ax.text(
        0.5,
        0.5,
        text,
        ha="center",
        va="center",
        transform=ax.transAxes,
        fontsize=fontsize,
        color=color,
        wrap=True,
    )


def grid(n, ncols_max=3, height=2.4):
    import matplotlib.pyplot as plt

    ncols = min(n, ncols_max)
    nrows = int(np.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(WIDTH, height * nrows + 0.5), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def legend_below(fig, handles, labels, ncol=4) -> int:
    """A legend centred below the axes; returns its number of rows (for ``layout``)."""
    if not handles:
        return 0
    ncol = min(ncol, len(handles))
    fig.legend(
        handles,
        labels,
        loc="lower center",
        bbox_to_anchor=(0.5, 0.01),
        ncol=ncol,
        handlelength=2.6,
        columnspacing=1.4,
    )
    return int(np.ceil(len(handles) / ncol))


def layout(
    fig, legend_rows=0, *, left=0.62, right=0.15, top=0.5, bottom=0.45, wspace=0.32, hspace=0.5
):
    """Fixed margins in inches (much faster than constrained layout, and the same for
    every figure): room for the figure title on top and the legend rows below."""
    w, h = fig.get_size_inches()
    bottom = bottom + (0.17 * legend_rows + 0.08 if legend_rows else 0)
    fig.subplots_adjust(
        left=left / w,
        right=1 - right / w,
        top=1 - top / h,
        bottom=bottom / h,
        wspace=wspace,
        hspace=hspace,
    )


def note_figure(name: str, reason: str):
    """A figure without data: a centred note saying why."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(WIDTH * 0.72, 2.6))
    ax.set_axis_off()
    panel_note(ax, f"no data for this figure ({reason})", fontsize=10, color="0.3")
    layout(fig)
    return fig


# PDF: no creation date (matplotlib's Producer names its version, which the inputs fix);
# PNG: no "Software" text chunk. Same inputs, same bytes.
SAVE_METADATA = {
    "pdf": {"Creator": "hvdscale", "CreationDate": None},
    "png": {"Software": None},
}


def save_figure(fig, outdir: Path, name: str) -> list[Path]:
    """Write ``{outdir}/{name}.pdf`` and ``.png`` atomically, with reproducible bytes."""
    import matplotlib.pyplot as plt

    paths = []
    for ext, metadata in SAVE_METADATA.items():
        path = outdir / f"{name}.{ext}"
        with atomic_path(path, f".{ext}") as tmp:
            fig.savefig(tmp, format=ext, metadata=metadata)
        paths.append(path)
    plt.close(fig)
    return paths
