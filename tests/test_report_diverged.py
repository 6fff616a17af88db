"""A repeat whose loss diverged before the target: counted in every total of the rendered
report (x/5, never x/4) and named as diverged, not as a run that hit its budget."""

import json
import shutil
import subprocess

import fixtures_runs as F
import pandas as pd
import pytest
from required_layers import layer_skipif
from test_report import pipeline

from hvdscale.matrix.runtable import run_table

pytestmark = layer_skipif(
    "poppler", "poppler-utils not installed" if shutil.which("pdftotext") is None else None
)

DIVERGED = "local_gloo_n1_w2_b75_lrlinear_r0"


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    root = tmp_path_factory.mktemp("diverged")
    cfg = F.load_test_config("config.yaml", repeats=5)
    assert DIVERGED in {r.run_id for r in run_table(cfg)}
    F.write_study(root / "runs", cfg, nan_loss={DIVERGED})
    # its loss became non-finite before the target (the simulated one reached it first)
    path = root / "runs" / DIVERGED / "metrics.json"
    rec = json.loads(path.read_text())
    rec["target"].update(reached=False, epoch=None, time_to_target_s=None)
    rec["target"]["launch_to_target_s"] = None
    path.write_text(json.dumps(rec))
    out = pipeline(root, cfg, root / "runs", F.study_allreduce(root / "ar", cfg))
    pages = subprocess.run(
        ["pdftotext", str(out["report"]), "-"], capture_output=True, text=True, check=True
    ).stdout.split("\f")
    return root, [" ".join(p.split()) for p in pages]


def test_a_diverged_repeat_counts_in_every_total_and_is_named(study):
    root, pages = study
    h = pd.read_csv(root / "scaling" / "headline.csv")
    row = h[(h["backend"] == "gloo") & (h["workers"] == 2) & ~h["tuned"]].iloc[0]
    assert (row.reached, row.total, row.diverged, row.base_diverged) == (4, 5, 1, 0)
    s = pd.read_csv(root / "scaling" / "summary.csv")
    two = s[(s["backend"] == "gloo") & (s["workers"] == 2)].iloc[0]
    assert (two.n_reached_target, two.n_ttt_total, two.n_nan_loss) == (4, 5, 1)
    text = " ".join(pages)
    # page 1: the headline sentence
    assert "(4/5 reached, 1 diverged (non-finite loss); 1 worker 5/5)" in pages[0]
    # the Results table: reached/total over every run that trained, the diverged named
    assert "(4/5; 1 diverged)" in text and "(4/4)" not in text
    # the time-to-target table: the count and the repeat itself
    assert "4/5 (1 diverged)" in text
    assert "diverged, " in text
    # the factors table: n-worker | 1-worker counts
    assert "(1 diverged) | 5/5" in text
    # never explained as the budget
    assert "budget was hit" not in text
