"""Ring-allreduce cost model: the fit recovers known alpha/beta; predictions and errors."""

from __future__ import annotations

import json

import fixtures_runs as F
import numpy as np
import pandas as pd
import pytest
from report_fixtures import story_text

from hvdscale.analysis.costmodel import fit_costmodel
from hvdscale.analysis.costmodel_links import fit_ring, ring_time
from hvdscale.cli import main

MODEL_BYTES = 153441 * 4


@pytest.mark.parametrize("alpha,beta", [(12e-6, 40e9), (35e-6, 4e9), (3e-6, 150e9), (80e-6, 1.2e9)])
def test_fit_recovers_alpha_beta(alpha, beta):
    rows = pd.DataFrame(F.allreduce_rows("p", "nccl", alpha, beta, noise=0.03, seed=7))
    f = fit_ring(rows["workers"], rows["bytes"], rows["time_s"])
    assert f["alpha_s"] == pytest.approx(alpha, rel=0.03)
    assert f["beta_Bps"] == pytest.approx(beta, rel=0.03)
    assert f["n_points"] == len(rows) and f["median_abs_rel_error"] < 0.05
    assert f["alpha_se_s"] > 0 and f["beta_se_Bps"] > 0


def test_fit_with_one_worker_count_and_single_rank_rows_ignored():
    rows = F.allreduce_rows("local", "gloo", 35e-6, 4e9, workers=(1, 2), noise=0.02, seed=3)
    for r in rows:
        if r["workers"] == 1:
            r["time_s"] = 1e-6  # no communication: must not enter the fit
    df = pd.DataFrame(rows)
    f = fit_ring(df["workers"], df["bytes"], df["time_s"])
    assert f["workers"] == [2]
    assert f["alpha_s"] == pytest.approx(35e-6, rel=0.03) and f["beta_Bps"] == pytest.approx(
        4e9, rel=0.03
    )


def test_fit_needs_several_sizes():
    f = fit_ring([2, 2], [1024, 1024], [1e-4, 1.1e-4])
    assert f["alpha_s"] is None and "cannot be separated" in f["note"]
    assert fit_ring([2], [1024], [1e-4])["note"]


def _summary(sync_meas: dict[int, float]) -> pd.DataFrame:
    """A summary with a 1-worker baseline: 1 ms compute, 0.1 data, 0.2 update, 0 other;
    1000 steps."""
    rows = []
    t_local = 1.3e-3
    for w, sync in sync_meas.items():
        epoch = 1000 / w * (t_local + sync)
        rows.append(
            {
                "partition": "p",
                "backend": "nccl",
                "batch_per_worker": 75,
                "lr_rule": "none",
                "workers": w,
                "epoch_time_s": epoch,
                "steps_per_epoch": 1000 / w,
                "data_step_s": 1e-4,
                "compute_step_s": 1e-3,
                "update_step_s": 2e-4,
                "other_step_s": 0.0,
                "sync_step_s": sync,
                "final_test_loss": 0.03,
            }
        )
    s = pd.DataFrame(rows)
    s["speedup"] = s.loc[s.workers == 1, "epoch_time_s"].iloc[0] / s["epoch_time_s"]
    return s


def test_prediction_and_errors():
    alpha, beta = 10e-6, 20e9
    ar = pd.DataFrame(F.allreduce_rows("p", "nccl", alpha, beta, noise=0.0))
    t = {w: float(ring_time(w, MODEL_BYTES, alpha, beta)) for w in (2, 4, 8)}
    meas = {1: 0.0, 2: t[2], 4: 2 * t[4], 8: t[8]}  # the 4-worker sync is twice the model
    res = fit_costmodel(ar, _summary(meas), MODEL_BYTES, max_workers=64)
    (pred,) = res["predictions"]
    pts = {p["workers"]: p for p in pred["points"]}
    assert sorted(pts) == [1, 2, 4, 8, 16, 32, 64]
    t_local = 1.3e-3
    for w in (2, 16, 64):
        sync = float(ring_time(w, MODEL_BYTES, alpha, beta))
        assert pts[w]["sync_step_s_pred"] == pytest.approx(sync, rel=1e-6)
        assert pts[w]["speedup_pred"] == pytest.approx(w * t_local / (t_local + sync), rel=1e-6)
    assert pts[2]["sync_rel_error"] == pytest.approx(0.0, abs=1e-6)
    assert pts[4]["sync_rel_error"] == pytest.approx(-0.5, rel=1e-6)
    s4 = 4 * t_local / (t_local + t[4])
    s4_meas = 4 * t_local / (t_local + 2 * t[4])
    assert pts[4]["speedup_rel_error"] == pytest.approx((s4 - s4_meas) / s4_meas, rel=1e-6)
    assert pts[16]["speedup_meas"] is None and pts[16]["sync_rel_error"] is None
    assert res["errors"]["sync_time"]["n"] == 3
    assert res["errors"]["sync_time"]["median_abs_rel_error"] == pytest.approx(0.0, abs=1e-6)
    assert res["errors"]["sync_time"]["max_abs_rel_error"] == pytest.approx(0.5, rel=1e-6)
    json.dumps(res, allow_nan=False)


def test_no_baseline_or_no_fit_is_reported():
    ar = pd.DataFrame(F.allreduce_rows("other", "mpi", 10e-6, 20e9))
    res = fit_costmodel(ar, _summary({1: 0.0, 2: 1e-4}), MODEL_BYTES)
    assert res["predictions"][0]["note"] == "no allreduce fit for this partition/backend"
    s = _summary({1: 0.0, 2: 1e-4})
    s.loc[s.workers == 1, "epoch_time_s"] = np.nan
    ar = pd.DataFrame(F.allreduce_rows("p", "nccl", 10e-6, 20e9))
    res = fit_costmodel(ar, s, MODEL_BYTES)
    assert res["predictions"][0]["note"] == "no completed 1-worker baseline run"
    res = fit_costmodel(ar.iloc[0:0], None, MODEL_BYTES)
    assert res["fits"] == [] and res["notes"]


def test_cli_writes_json_and_rejects_bad_input(tmp_path, capsys):
    a = F.write_allreduce_csv(
        tmp_path / "ar" / "p_nccl.csv", F.allreduce_rows("p", "nccl", 12e-6, 40e9)
    )
    summary = tmp_path / "summary.csv"
    cfg = F.load_test_config("config.yaml")
    from hvdscale.analysis.aggregate import aggregate

    F.write_study(tmp_path / "runs", cfg)
    agg = aggregate(tmp_path / "runs", cfg)
    agg.summary.to_csv(summary, index=False)
    out = tmp_path / "cm.json"
    assert (
        main(
            [
                "fit-costmodel",
                "--allreduce",
                str(tmp_path / "ar" / "*.csv"),
                "--summary",
                str(summary),
                "--model-bytes",
                str(MODEL_BYTES),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    res = json.loads(out.read_text())
    assert res["fits"][0]["alpha_s"] == pytest.approx(12e-6, rel=0.05)
    assert res["model_bytes"] == MODEL_BYTES and res["inputs"] == [str(a)]
    # a named file that does not exist, and a file without the expected columns: one line, exit 2
    capsys.readouterr()
    assert (
        main(["fit-costmodel", "--allreduce", str(tmp_path / "nope.csv"), "--out", str(out)]) == 2
    )
    assert "nope.csv" in capsys.readouterr().err
    bad = tmp_path / "bad.csv"
    bad.write_text("partition,backend,workers\np,nccl,2\n")
    assert main(["fit-costmodel", "--allreduce", str(bad), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "bad.csv" in err and "bytes" in err
    # the column names hvdscale measure-allreduce writes (p10, p90, algbw, busbw, iterations)
    own = tmp_path / "own.csv"
    pd.DataFrame(F.allreduce_rows("p", "nccl", 12e-6, 40e9)).rename(
        columns={"p10_s": "p10", "p90_s": "p90", "algbw_Bps": "algbw", "busbw_Bps": "busbw"}
    ).assign(iterations=20).to_csv(own, index=False)
    assert main(["fit-costmodel", "--allreduce", str(own), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["fits"][0]["beta_Bps"] == pytest.approx(40e9, rel=0.05)
    neg = tmp_path / "neg.csv"
    pd.DataFrame(F.allreduce_rows("p", "nccl", 12e-6, 40e9)).assign(time_s=-1.0).to_csv(
        neg, index=False
    )
    assert main(["fit-costmodel", "--allreduce", str(neg), "--out", str(out)]) == 2
    assert "time_s" in capsys.readouterr().err


# --------------------------------------------------------------------------- across nodes

INSIDE_AB, BETWEEN_AB = (20e-6, 8e9), (150e-6, 0.9e9)
LAYOUTS = [(2, 1), (4, 1), (8, 1), (2, 2), (4, 2), (8, 2), (16, 2)]  # (ranks, nodes)


def _two_level_rows(noise: float = 0.0, seed: int = 0, layouts=LAYOUTS) -> pd.DataFrame:
    """A sweep from known inside-node and between-node alpha/beta (ring over the slowest
    link: the between-node terms wherever the ranks span several nodes)."""
    rng = np.random.default_rng(seed)
    rows = []
    for w, m in layouts:
        alpha, beta = INSIDE_AB if m == 1 else BETWEEN_AB
        for n in [8 * 4**k for k in range(11)] + [MODEL_BYTES]:  # 8 B .. 8 MiB, the gradients
            t = float(ring_time(w, n, alpha, beta)) * float(rng.lognormal(0.0, noise))
            rows.append(
                {"partition": "alpha", "backend": "gloo", "workers": w, "nodes": m}
                | {"bytes": n, "time_s": t}
            )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("noise,rel", [(0.0, 1e-9), (0.02, 0.03)])
def test_fit_links_recovers_inside_and_between_node_terms(noise, rel):
    from hvdscale.analysis.costmodel_links import fit_links

    df = _two_level_rows(noise, seed=11)
    f = fit_links(df["workers"], df["nodes"], df["bytes"], df["time_s"])
    assert f["between_node_known"] and f["inside_node_known"] and f["link_note"] == ""
    inside, between = f["links"]["inside_node"], f["links"]["between_node"]
    assert inside["alpha_s"] == pytest.approx(INSIDE_AB[0], rel=rel)
    assert inside["beta_Bps"] == pytest.approx(INSIDE_AB[1], rel=rel)
    assert between["alpha_s"] == pytest.approx(BETWEEN_AB[0], rel=rel)
    assert between["beta_Bps"] == pytest.approx(BETWEEN_AB[1], rel=rel)
    assert inside["workers"] == [2, 4, 8] and between["workers"] == [2, 4, 8, 16]
    assert f["node_counts"] == [1, 2] and f["slots_per_node"] == 8


def test_fitted_from_small_counts_validates_on_large_ones(tmp_path):
    df = _two_level_rows(0.0)
    # the 8- and 16-rank sweeps run 30 % slower than the model: the error table shows it
    slow = df["workers"] > 4
    df.loc[slow, "time_s"] *= 1.3
    res = fit_costmodel(df, None, MODEL_BYTES, fit_max_workers=4)
    et = res["error_table"]
    assert et["fit_max_workers"] == 4
    (fit,) = et["fits"]
    assert fit["between_node"]["alpha_s"] == pytest.approx(BETWEEN_AB[0], rel=1e-9)
    assert fit["between_node"]["workers"] == [2, 4]  # fitted from the small counts only
    rows = {(r["workers"], r["nodes"]): r for r in et["rows"]}
    assert sorted(rows) == sorted(LAYOUTS)
    assert {k for k, r in rows.items() if r["role"] == "validate"} == {(8, 1), (8, 2), (16, 2)}
    for (w, m), r in rows.items():
        want = 1 / 1.3 - 1 if w > 4 else 0.0
        assert r["sync_rel_error"] == pytest.approx(want, abs=1e-9)
        assert r["median_abs_rel_error_sizes"] == pytest.approx(abs(want), abs=1e-9)
        assert r["link"] == ("inside_node" if m == 1 else "between_node")
        alpha, beta = INSIDE_AB if m == 1 else BETWEEN_AB
        assert r["sync_s_pred"] == pytest.approx(float(ring_time(w, MODEL_BYTES, alpha, beta)))
    v = et["validated"]
    assert v["n"] == 3 and v["workers"] == [8, 16]
    assert v["median_abs_rel_error_sync"] == pytest.approx(1 - 1 / 1.3, rel=1e-9)
    # the full fit (every sweep) sees both node counts
    (f,) = res["fits"]
    assert f["between_node_known"] and f["node_counts"] == [1, 2]
    json.dumps(res, allow_nan=False)


def test_cli_writes_the_error_table(tmp_path, capsys):
    csv = tmp_path / "ar.csv"
    _two_level_rows(0.01, seed=5).to_csv(csv, index=False)
    out = tmp_path / "cm.json"
    argv = ["fit-costmodel", "--allreduce", str(csv), "--fit-max-workers", "4", "--out", str(out)]
    assert main(argv) == 0
    res = json.loads(out.read_text())
    v = res["error_table"]["validated"]
    assert v["n"] == 3 and v["median_abs_rel_error_sync"] < 0.05
    assert "held-out" in capsys.readouterr().out
    assert res["model"].endswith("ring over the slowest link")


def test_one_node_sweep_fits_inside_terms_and_says_between_unknown():
    from hvdscale.analysis.costmodel_links import UNKNOWN_BETWEEN, sync_time

    df = _two_level_rows(0.0, layouts=[(2, 1), (4, 1), (8, 1)])
    res = fit_costmodel(df, None, MODEL_BYTES)
    (f,) = res["fits"]
    assert not f["between_node_known"] and f["links"]["between_node"] is None
    assert UNKNOWN_BETWEEN in f["note"]
    assert any("between-node terms unknown" in n for n in res["notes"])
    assert f["alpha_s"] == pytest.approx(INSIDE_AB[0], rel=1e-9)
    assert f["beta_Bps"] == pytest.approx(INSIDE_AB[1], rel=1e-9)
    # more nodes: the one-node model (the inside-node terms), as before nodes were modelled
    t16 = sync_time(f, 16, 2, MODEL_BYTES)
    assert t16 == pytest.approx(float(ring_time(16, MODEL_BYTES, *INSIDE_AB)))
    assert all(r["role"] == "fit" for r in res["error_table"]["rows"])
    assert res["error_table"]["validated"]["n"] == 0


def test_prediction_uses_the_link_of_each_node_count():
    df = _two_level_rows(0.0)
    s = _summary({1: 0.0, 2: 1e-4}).assign(partition="alpha", backend="gloo")
    res = fit_costmodel(df, s, MODEL_BYTES, max_workers=32)
    pts = {p["workers"]: p for p in res["predictions"][0]["points"]}
    assert (pts[8]["nodes"], pts[16]["nodes"], pts[32]["nodes"]) == (1, 2, 4)
    assert pts[8]["sync_step_s_pred"] == pytest.approx(float(ring_time(8, MODEL_BYTES, *INSIDE_AB)))
    assert pts[16]["link"] == "between_node"
    assert pts[16]["sync_step_s_pred"] == pytest.approx(
        float(ring_time(16, MODEL_BYTES, *BETWEEN_AB))
    )


def test_config_asks_for_sweeps_over_rank_and_node_counts():
    import yaml

    from hvdscale.config.load import validate_config
    from hvdscale.errors import ConfigError, UserError
    from hvdscale.matrix.allreduce_sweeps import allreduce_jobs
    from hvdscale.slurm.jobspec import JobSpec

    cfg = yaml.safe_load((F.PROJECT_ROOT / ".test" / "slurm-costmodel.yaml").read_text())
    cfg = validate_config(cfg)
    jobs = {j["id"]: j for j in allreduce_jobs(cfg)}
    assert sorted((j["workers"], j["nodes"]) for j in jobs.values()) == sorted(LAYOUTS)
    spec = JobSpec.for_allreduce_id(cfg, "alpha_gloo_n2_w4")
    assert (spec.nodes, spec.workers_per_node, spec.tasks) == (2, 2, 4)
    assert "-N 2 --ntasks-per-node=2" in " ".join(spec.srun_args())
    with pytest.raises(UserError, match="spread evenly"):
        JobSpec.for_allreduce_id(cfg, "alpha_gloo_n4_w2")
    cfg["allreduce"]["sweeps"][0]["partitions"] = ["nope"]
    with pytest.raises(ConfigError, match="allreduce.sweeps.0.partitions"):
        allreduce_jobs(cfg)


def test_report_section_shows_predicted_against_measured_per_node_count(tmp_path):
    from hvdscale.report.context import ReportData
    from hvdscale.report.costmodel_section import costmodel_section
    from hvdscale.report.doc import Doc

    df = _two_level_rows(0.0)
    df.loc[df["workers"] == 16, "time_s"] *= 2.0  # 16 ranks: predicted -50 %
    cm = json.loads(json.dumps(fit_costmodel(df, None, MODEL_BYTES, fit_max_workers=4)))
    d = Doc()
    r = ReportData({}, None, None, pd.DataFrame(), pd.DataFrame(), cm, tmp_path)
    costmodel_section(d, r)
    text = story_text(d.story)
    assert "slowest link" in text and "between nodes" in text and "inside node" in text
    assert "held out" in text and "-50.0 %" in text
    assert "Held-out prediction error (3 sweeps of 8, 16 ranks" in text
    # a one-node sweep: the between-node terms are said to be unknown
    one = _two_level_rows(0.0, layouts=[(2, 1), (4, 1)])
    d = Doc()
    r.cm = json.loads(json.dumps(fit_costmodel(one, None, MODEL_BYTES)))
    costmodel_section(d, r)
    assert "unknown: sweeps on one node only" in story_text(d.story)
