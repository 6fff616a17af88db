"""Figures follow the target's metric: a study whose target is a validation accuracy (a
classifier's workload) shows the accuracy and its target; a validation-loss study keeps
its tables and figures as they were."""

from __future__ import annotations

import json

import fixtures_runs as F
import numpy as np
import pytest
import report_fixtures  # noqa: F401  (CI_METHOD placeholder until the stats branch lands)

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.references import references_of
from hvdscale.analysis.tuning import candidates
from hvdscale.figures.draw import draw_figure
from hvdscale.figures.registry import BY_NAME

CFG = F.load_test_config("config.yaml", repeats=2)
LOSS_TARGET = F.study_target(CFG)  # the simulated records' validation-loss target
TARGET = round(1.0 - LOSS_TARGET, 6)  # the converted study's accuracy target


def _as_accuracy_study(runs_dir):
    """Turn the simulated records into those of a classifier whose target is a validation
    accuracy: per epoch val_accuracy = 1 - val_loss; target.metric val_accuracy, its value
    1 - the loss target, best_value the run's best accuracy (as the trainer writes them)."""
    for path in sorted(runs_dir.glob("*/metrics.json")):
        rec = json.loads(path.read_text())
        for e in rec["epochs"]:
            v = e.get("val_loss")
            e["val_accuracy"] = None if v is None else round(1.0 - v, 6)
        tgt = rec.get("target")
        if tgt:
            accs = [e["val_accuracy"] for e in rec["epochs"] if e["val_accuracy"] is not None]
            tgt["metric"] = "val_accuracy"
            tgt["best_value"] = max(accs) if accs else None
            if tgt.get("value") is not None:
                tgt["value"] = round(1.0 - tgt["value"], 6)
        path.write_text(json.dumps(rec))


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    """(loss study, accuracy study): the aggregation of the same simulated records, as
    written and converted to an accuracy target."""
    out = {}
    for name in ("loss", "accuracy"):
        runs_dir = tmp_path_factory.mktemp(name) / "runs"
        F.write_study(runs_dir, CFG)
        if name == "accuracy":
            _as_accuracy_study(runs_dir)
        out[name] = aggregate(runs_dir, CFG)
    return out["loss"], out["accuracy"]


def _draw(name, agg):
    import matplotlib

    matplotlib.use("Agg", force=True)
    data = (agg.runs, agg.summary, agg.epochs, None, references_of(None), None)
    fig, status = draw_figure(BY_NAME[name], data, warn=lambda msg: None)
    assert status == "ok", status
    return fig


def test_tables_name_the_metric_only_for_another_metric(studies):
    loss, acc = studies
    assert "target_metric" not in loss.runs and "val_accuracy" not in loss.epochs
    assert "best_target_value" not in loss.runs
    assert set(acc.runs["target_metric"].dropna()) == {"val_accuracy"}
    assert (acc.epochs["val_accuracy"] - (1 - acc.epochs["val_loss"])).abs().max() < 1e-6
    done = acc.runs[acc.runs["status"] == "completed"]
    assert np.allclose(done["best_target_value"], 1 - done["best_val_loss"], atol=1e-6)
    # the tuning sweep's medians carry the best accuracy too
    c = candidates(acc.runs)
    assert len(c) and c["best_target_value"].notna().all()
    assert "best_target_value" not in candidates(loss.runs)


def test_loss_vs_time_shows_the_accuracy_and_its_target(studies):
    import matplotlib.pyplot as plt

    loss, acc = studies
    fig = _draw("loss_vs_time", acc)
    assert fig.get_suptitle().startswith("Validation accuracy vs training time")
    axes = [ax for ax in fig.axes if ax.get_lines()]
    assert axes
    assert {ax.get_ylabel() for ax in axes if ax.get_ylabel()} == {"validation accuracy"}
    for ax in axes:
        assert ax.get_yscale() == "linear"
        dotted = [x for x in ax.get_lines() if x.get_linestyle() == ":"]
        assert [set(x.get_ydata()) for x in dotted] == [{TARGET}]
        curves = [x for x in ax.get_lines() if x.get_linestyle() != ":"]
        # the plotted values are the epochs' accuracies (all at or below 1, none a loss)
        ys = np.concatenate([x.get_ydata() for x in curves])
        assert ys.size and ys.max() <= 1 and ys.min() > 0.5
        assert set(np.round(ys, 6)) <= set(np.round(acc.epochs["val_accuracy"].dropna(), 6))
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "target validation accuracy" in legend
    plt.close(fig)
    # the loss study: its loss, on a log axis, and the loss target
    fig = _draw("loss_vs_time", loss)
    assert fig.get_suptitle().startswith("Validation loss vs training time")
    ax = fig.axes[0]
    assert ax.get_ylabel() == "validation loss (MSE)" and ax.get_yscale() == "log"
    dotted = [x for x in ax.get_lines() if x.get_linestyle() == ":"]
    assert [set(x.get_ydata()) for x in dotted] == [{LOSS_TARGET}]
    plt.close(fig)


def test_calibration_figure_shows_the_accuracy_beside_the_loss(studies):
    import matplotlib.pyplot as plt

    loss, acc = studies
    cal = acc.runs[acc.runs["kind"] == "cal"]
    if cal.empty:
        pytest.skip("the test config has no calibration runs")
    fig = _draw("calibration", acc)
    assert fig.get_suptitle().startswith("Calibration runs' validation loss and accuracy")
    ax_loss, ax_acc = [ax for ax in fig.axes if ax.get_lines()]
    assert ax_loss.get_yscale() == "log" and ax_acc.get_ylabel() == "validation accuracy"
    (target,) = [x for x in ax_acc.get_lines() if x.get_gid() == "target"]
    assert set(target.get_ydata()) == {TARGET}
    assert not [x for x in ax_loss.get_lines() if x.get_gid() == "target"]
    best = [x for x in ax_acc.get_lines() if x.get_gid() == "best"]
    assert len(best) == len(cal)
    for line in best:  # the best so far of an accuracy only rises
        assert (np.diff(line.get_ydata()) >= 0).all()
    plt.close(fig)
    fig = _draw("calibration", loss)  # one panel, the loss target on it
    (ax,) = [ax for ax in fig.axes if ax.get_lines()]
    (target,) = [x for x in ax.get_lines() if x.get_gid() == "target"]
    assert set(target.get_ydata()) == {LOSS_TARGET}
    plt.close(fig)


def test_tune_heatmap_shows_the_best_accuracy(studies):
    import matplotlib.pyplot as plt

    _, acc = studies
    fig = _draw("tune_heatmap", acc)
    assert fig.get_suptitle().startswith("Learning-rate re-tuning: best validation accuracy")
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert "best validation accuracy" in labels
    ax = fig.axes[0]
    assert "best validation accuracy" in ax.get_title()
    shown = {float(t.get_text()) for t in ax.texts}
    c = candidates(acc.runs)
    assert shown and shown <= {round(v, 3) for v in c["best_target_value"]}
    plt.close(fig)
