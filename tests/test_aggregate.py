"""Aggregation of run records: known answers on hand-made records, malformed records,
status of every run of the run table, CLI behaviour."""

from __future__ import annotations

import json
import math
from statistics import median

import fixtures_runs as F
import pandas as pd
import pytest

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.columns import RUNS_COLUMNS, STATUS_COLUMNS, SUMMARY_COLUMNS
from hvdscale.analysis.tables import read_runs, read_status, read_summary
from hvdscale.cli import main
from hvdscale.config.load import validate_config
from hvdscale.matrix.runtable import run_table

SAMPLES = 30000


def hand_config() -> dict:
    """local partition (4 workers per node); four groups:
    gloo/75/none workers 1,2,4 (complete); mpi/75/none workers 1,2 (1-worker runs failed or
    nan_loss); gloo/75/sqrt workers 1,2 (1-worker runs missing); mpi/150/none workers 2 only
    (no 1-worker run in the sweep)."""
    return validate_config(
        {
            "training": {
                "max_epochs": 3,
                "warmup_epochs": 1,
                "repeats": 2,
                "target_test_loss": 0.05,
            },
            "scaling": {
                "partitions": {
                    "local": {
                        "gpus_per_node": 0,
                        "cores_per_node": 4,
                        "mem_mb_per_node": 8000,
                        "workers_per_node": 4,
                    }
                },
                "sweeps": [
                    {
                        "partitions": ["local"],
                        "workers": [1, 2, 4],
                        "backends": ["gloo"],
                        "batch_sizes": [75],
                        "lr_rules": ["none"],
                    },
                    {
                        "partitions": ["local"],
                        "workers": [1, 2],
                        "backends": ["mpi"],
                        "batch_sizes": [75],
                        "lr_rules": ["none"],
                    },
                    {
                        "partitions": ["local"],
                        "workers": [1, 2],
                        "backends": ["gloo"],
                        "batch_sizes": [75],
                        "lr_rules": ["sqrt"],
                    },
                    {
                        "partitions": ["local"],
                        "workers": [2],
                        "backends": ["mpi"],
                        "batch_sizes": [150],
                        "lr_rules": ["none"],
                    },
                ],
            },
        }
    )


# run_id -> (wall times incl. one warm-up epoch, test losses)
HAND = {
    "local_gloo_n1_w1_b75_lrnone_r0": (
        [10.0, 3.0, 5.0],
        [0.5, 0.04, 0.03],
    ),  # timed median 4, TTT 13
    "local_gloo_n1_w1_b75_lrnone_r1": (
        [12.0, 5.0, 7.0],
        [0.5, 0.2, 0.045],
    ),  # timed median 6, TTT 24
    "local_gloo_n1_w2_b75_lrnone_r0": ([5.0, 2.5, 2.5], [0.3, 0.04, 0.03]),  # 2.5, TTT 7.5
    "local_gloo_n1_w2_b75_lrnone_r1": ([5.0, 2.0, 3.0], [0.3, 0.04, 0.03]),  # 2.5, TTT 7.0
    "local_gloo_n1_w4_b75_lrnone_r0": ([3.0, 2.0, 2.0], [0.3, 0.2, 0.1]),  # 2.0, target not reached
    "local_gloo_n1_w4_b75_lrnone_r1": ([3.0, 1.5, 2.5], [0.3, 0.2, 0.1]),  # 2.0
    "local_mpi_n1_w2_b75_lrnone_r0": ([4.0, 2.0, 2.0], [0.3, 0.1, 0.06]),
    "local_mpi_n1_w2_b75_lrnone_r1": ([4.0, 2.0, 2.0], [0.3, 0.1, 0.06]),
    "local_gloo_n1_w2_b75_lrsqrt_r0": ([4.0, 2.0, 2.0], [0.3, 0.1, 0.04]),
    "local_gloo_n1_w2_b75_lrsqrt_r1": ([4.0, 2.0, 2.0], [0.3, 0.1, 0.04]),
    "local_mpi_n1_w2_b150_lrnone_r0": ([2.0, 1.0, 1.0], [0.3, 0.1, 0.04]),
}


@pytest.fixture(scope="module")
def hand_study(tmp_path_factory):
    root = tmp_path_factory.mktemp("hand")
    runs_dir = root / "runs"
    cfg = hand_config()
    for rid, (walls, losses) in HAND.items():
        F.write_record(
            runs_dir, F.record_from_epochs(rid, walls, test_loss=losses, samples=SAMPLES)
        )
    # mpi/75/none baseline: one nan_loss record, one job that died (failure.json only)
    F.write_record(
        runs_dir,
        F.record_from_epochs(
            "local_mpi_n1_w1_b75_lrnone_r0",
            [4.0, 3.0],
            test_loss=[0.3, None],
            status="nan_loss",
            epochs=3,
        ),
    )
    F.write_failure(
        runs_dir, "local_mpi_n1_w1_b75_lrnone_r1", exit_status=137, error="killed: out of memory"
    )
    # the second repeat of mpi/150 is missing; gloo/sqrt 1-worker runs are missing
    return cfg, runs_dir, aggregate(runs_dir, cfg)


def row(summary, backend, batch, lr, workers):
    s = summary[
        (summary.backend == backend)
        & (summary.batch_per_worker == batch)
        & (summary.lr_rule == lr)
        & (summary.workers == workers)
    ]
    assert len(s) == 1
    return s.iloc[0]


def test_runs_table_per_record(hand_study):
    _, _, agg = hand_study
    runs = agg.runs.set_index("run_id")
    assert list(agg.runs.columns) == RUNS_COLUMNS
    r = runs.loc["local_gloo_n1_w1_b75_lrnone_r0"]
    assert r.epoch_time_s == pytest.approx(4.0)  # warm-up epoch (10 s) excluded
    assert r.throughput == pytest.approx(median([SAMPLES / 3.0, SAMPLES / 5.0]))
    # shares of the four phases (0.02, 0.70, 0.20, 0.05 of the wall time; 3 % other)
    assert r.sync_share == pytest.approx(0.20 / 0.97) and r.data_share == pytest.approx(0.02 / 0.97)
    assert r.compute_share == pytest.approx(0.70 / 0.97) and r.update_share == pytest.approx(
        0.05 / 0.97
    )
    assert r.other_share == pytest.approx(0.03)
    assert r.sync_step_s == pytest.approx(median([0.2 * 3.0, 0.2 * 5.0]) / r.steps_per_epoch)
    assert r.time_to_target_s == pytest.approx(13.0) and bool(r.reached_target)
    assert r.final_test_loss == pytest.approx(0.03) and r.best_test_loss == pytest.approx(0.03)
    assert r.epochs_timed == 2 and r.epochs_completed == 3
    assert r.hosts == "localhost1" and r.slurm_job_id == "1000"
    assert runs.loc["local_gloo_n1_w4_b75_lrnone_r0"].reached_target == False  # noqa: E712
    nan = runs.loc["local_mpi_n1_w1_b75_lrnone_r0"]
    assert nan.status == "nan_loss" and math.isnan(nan.final_test_loss)


def test_speedup_efficiency_and_medians(hand_study):
    _, _, agg = hand_study
    s = agg.summary
    assert list(s.columns) == SUMMARY_COLUMNS
    b = row(s, "gloo", 75, "none", 1)
    assert b.epoch_time_s == pytest.approx(5.0)  # median of repeats 4 and 6
    assert (b.epoch_time_min_s, b.epoch_time_max_s) == (pytest.approx(4.0), pytest.approx(6.0))
    assert b.speedup == pytest.approx(1.0) and b.efficiency == pytest.approx(1.0)
    assert b.speedup_min == pytest.approx(5 / 6) and b.speedup_max == pytest.approx(5 / 4)
    assert b.time_to_target_s == pytest.approx(18.5) and b.n_reached_target == 2
    w2 = row(s, "gloo", 75, "none", 2)
    assert w2.speedup == pytest.approx(2.0) and w2.efficiency == pytest.approx(1.0)
    assert w2.speedup_ttt == pytest.approx(18.5 / 7.25) and w2.efficiency_ttt == pytest.approx(
        18.5 / 7.25 / 2
    )
    w4 = row(s, "gloo", 75, "none", 4)
    assert w4.speedup == pytest.approx(2.5) and w4.efficiency == pytest.approx(0.625)
    assert math.isnan(w4.speedup_ttt) and w4.n_reached_target == 0
    # slope of the least-squares line through (1, 1), (2, 2), (4, 2.5) = 13/28
    assert w4.speedup_per_gpu == pytest.approx(13 / 28)
    assert w4.speedup_fit_intercept == pytest.approx(11 / 6 - 13 / 28 * 7 / 3)
    assert w4.fit_points == 3 and bool(w4.has_baseline) and w4.baseline_status == "ok"
    assert w4.sync_share == pytest.approx(0.2 / 0.97) and w4.data_share == pytest.approx(
        0.02 / 0.97
    )
    assert w4.n_completed == 2 and w4.n_expected == 2


def test_missing_baseline_flagged_not_dropped(hand_study):
    _, _, agg = hand_study
    s = agg.summary
    failed = row(s, "mpi", 75, "none", 2)
    assert not failed.has_baseline and failed.baseline_status == "failed"
    assert (
        math.isnan(failed.speedup)
        and math.isnan(failed.efficiency)
        and math.isnan(failed.speedup_per_gpu)
    )
    assert failed.epoch_time_s == pytest.approx(2.0)  # its own numbers are still there
    b1 = row(s, "mpi", 75, "none", 1)
    assert (b1.n_nan_loss, b1.n_failed, b1.n_completed) == (1, 1, 0)
    missing = row(s, "gloo", 75, "sqrt", 2)
    assert (
        not missing.has_baseline
        and missing.baseline_status == "missing"
        and math.isnan(missing.speedup)
    )
    assert row(s, "gloo", 75, "sqrt", 1).n_missing == 2
    nsweep = row(s, "mpi", 150, "none", 2)
    assert (
        nsweep.baseline_status == "not_in_sweep"
        and nsweep.n_completed == 1
        and nsweep.n_missing == 1
    )


def test_status_lists_every_run(hand_study):
    cfg, _, agg = hand_study
    st = agg.status.set_index("run_id")
    assert list(agg.status.columns) == STATUS_COLUMNS
    assert set(st.index) == {r.run_id for r in run_table(cfg)}
    assert st.loc["local_mpi_n1_w1_b75_lrnone_r1"].status == "failed"
    assert st.loc["local_mpi_n1_w1_b75_lrnone_r1"].exit_status == 137
    assert "out of memory" in st.loc["local_mpi_n1_w1_b75_lrnone_r1"].detail
    assert st.loc["local_mpi_n1_w1_b75_lrnone_r0"].status == "nan_loss"
    assert st.loc["local_gloo_n1_w1_b75_lrsqrt_r0"].status == "missing"
    assert st.loc["local_mpi_n1_w2_b150_lrnone_r1"].status == "missing"
    assert (st.status == "completed").sum() == len(HAND)


def test_malformed_records_reported_by_path_and_field(tmp_path, capsys):
    cfg = hand_config()
    runs_dir = tmp_path / "runs"
    for rid, (walls, losses) in HAND.items():
        F.write_record(
            runs_dir, F.record_from_epochs(rid, walls, test_loss=losses, samples=SAMPLES)
        )
    # 1: JSON-Schema violation (negative epoch wall time)
    bad1 = "local_gloo_n1_w2_b75_lrnone_r1"
    rec = F.record_from_epochs(bad1, [5.0, 2.5, 2.5])
    rec["epochs"][1]["wall_s"] = -1.0
    F.write_record(runs_dir, rec)
    # 2: schema-valid but inconsistent: config says 3 workers, run_id says 2 (pandera row check)
    bad2 = "local_mpi_n1_w2_b75_lrnone_r0"
    rec = F.record_from_epochs(bad2, [4.0, 2.0, 2.0])
    rec["config"]["workers"] = 3
    rec["config"]["global_batch"] = 225
    F.write_record(runs_dir, rec)
    # 3: not JSON at all
    bad3 = "local_gloo_n1_w4_b75_lrnone_r1"
    (runs_dir / bad3 / "metrics.json").write_text('{"schema_version": 1, "run_id": ')
    # 4: a record in the wrong directory
    bad4 = "local_gloo_n1_w2_b75_lrsqrt_r1"
    F.write_record(
        runs_dir,
        F.record_from_epochs("local_gloo_n1_w2_b75_lrsqrt_r0", [4.0, 2.0, 2.0]),
        run_id=bad4,
    )
    (tmp_path / "full.json").write_text(json.dumps(cfg))
    out = tmp_path / "scaling"
    rc = main(
        [
            "aggregate",
            "--runs-dir",
            str(runs_dir),
            "--config",
            str(tmp_path / "full.json"),
            "--out-runs",
            str(out / "runs.csv"),
            "--out-summary",
            str(out / "summary.csv"),
            "--out-status",
            str(out / "status.csv"),
        ]
    )
    assert rc == 0
    err = capsys.readouterr().err
    st = read_status(out / "status.csv").set_index("run_id")
    expect = {
        bad1: "epochs.1.wall_s",
        bad2: "run_id matches the record's config",
        bad3: "not valid JSON",
        bad4: "does not match the run directory",
    }
    for rid, field in expect.items():
        path = str(runs_dir / rid / "metrics.json")
        assert st.loc[rid].status == "malformed"
        assert field in st.loc[rid].detail and st.loc[rid].path == path
        line = next(ln for ln in err.splitlines() if path in ln)
        assert field in line and line.startswith("hvdscale aggregate: warning:")
    runs = read_runs(out / "runs.csv")
    assert not set(expect) & set(runs.run_id)
    assert len(runs) == len(HAND) - 4  # the four bad records replaced good ones
    summary = read_summary(out / "summary.csv")
    assert row(summary, "gloo", 75, "none", 2).n_malformed == 1
    assert row(summary, "gloo", 75, "none", 2).speedup == pytest.approx(
        2.0
    )  # the other repeat still counts
    assert (out / "epochs.csv").exists()


def test_run_not_in_config_is_listed_not_aggregated(tmp_path):
    cfg = hand_config()
    runs_dir = tmp_path / "runs"
    F.write_record(
        runs_dir, F.record_from_epochs("local_gloo_n1_w1_b75_lrnone_r0", [10.0, 3.0, 5.0])
    )
    F.write_record(
        runs_dir,
        F.record_from_epochs(
            "local_gloo_n1_w8_b75_lrnone_r0", [10.0, 1.0, 1.0], workers_per_node=8
        ),
    )
    warnings = []
    agg = aggregate(runs_dir, cfg, warn=warnings.append)
    st = agg.status.set_index("run_id")
    assert not st.loc["local_gloo_n1_w8_b75_lrnone_r0"].in_config
    assert list(agg.runs.run_id) == ["local_gloo_n1_w1_b75_lrnone_r0"]
    assert 8 not in set(agg.summary.workers)
    assert any("not in the config's run table" in w for w in warnings)


def test_failed_record_counts_as_failed_not_in_medians(tmp_path):
    cfg = hand_config()
    runs_dir = tmp_path / "runs"
    F.write_record(
        runs_dir, F.record_from_epochs("local_gloo_n1_w1_b75_lrnone_r0", [10.0, 3.0, 5.0])
    )
    F.write_record(
        runs_dir,
        F.record_from_epochs(
            "local_gloo_n1_w1_b75_lrnone_r1", [10.0, 30.0], status="failed", epochs=3
        ),
    )
    agg = aggregate(runs_dir, cfg)
    assert set(agg.runs.status) == {"completed", "failed"}
    b = row(agg.summary, "gloo", 75, "none", 1)
    assert (b.n_completed, b.n_failed) == (1, 1) and b.epoch_time_s == pytest.approx(4.0)
    st = agg.status.set_index("run_id").loc["local_gloo_n1_w1_b75_lrnone_r1"]
    assert st.status == "failed" and st.exit_status == 1 and "simulated failure" in st.detail


def test_launcher_failure_json(tmp_path):
    runs_dir = tmp_path / "runs"
    F.write_failure(
        runs_dir,
        "local_gloo_n1_w2_b75_lrnone_r0",
        exit_status=143,
        style="launcher",
        error="horovod.common.exceptions.HorovodInternalError: rank 1 died",
    )
    st = (
        aggregate(runs_dir, hand_config())
        .status.set_index("run_id")
        .loc["local_gloo_n1_w2_b75_lrnone_r0"]
    )
    assert st.status == "failed" and st.exit_status == 143
    assert "rank 1 died" in st.detail and "2024-06-01T13:00:00Z" in st.detail


def test_no_records_at_all(tmp_path):
    agg = aggregate(tmp_path / "nothing", hand_config())
    assert agg.runs.empty and (agg.status.status == "missing").all()
    assert (agg.summary.n_completed == 0).all() and not agg.summary.has_baseline.any()


def test_realistic_study_roundtrip(tmp_path):
    cfg = F.load_test_config("config.yaml", repeats=2)
    ids = [r.run_id for r in run_table(cfg)]
    F.write_study(tmp_path / "runs", cfg, nan_loss={ids[-1]})
    agg = aggregate(tmp_path / "runs", cfg)
    assert (agg.status.status == "completed").sum() == len(ids) - 1
    assert agg.summary.has_baseline.all()
    assert ((agg.summary.speedup > 1.3) | (agg.summary.workers == 1)).all()
    path = tmp_path / "summary.csv"
    agg.summary.to_csv(path, index=False)
    back = read_summary(path)
    pd.testing.assert_series_equal(back.speedup, agg.summary.speedup, check_exact=False, rtol=1e-9)


def test_config_hash_match_compares_each_run_with_its_slice_of_the_config(tmp_path):
    """runs.csv's config_hash_match: a record is checked against the hash of its own
    slice of the config (what hvdscale train reads), not the whole config's; a run
    trained under another config (here: another learning rate) is False, and the
    report's provenance names it."""
    from hvdscale.analysis.aggregate import SliceHash
    from hvdscale.config.load import config_hash
    from hvdscale.matrix.runtable import run_config
    from hvdscale.report.overview import _provenance_rows
    from hvdscale.report.provenance import collect, config_match

    cfg = F.load_test_config("config.yaml", repeats=2)
    ids = [r.run_id for r in run_table(cfg)]
    F.write_study(tmp_path / "runs", cfg)
    other = validate_config({**cfg, "training": {**cfg["training"], "learning_rate": 0.1}})
    stale = ids[1]
    rec_path = tmp_path / "runs" / stale / "metrics.json"
    rec = json.loads(rec_path.read_text())
    rec["environment"]["config_hash"] = config_hash(validate_config(run_config(other, stale)))
    rec_path.write_text(json.dumps(rec))
    agg = aggregate(tmp_path / "runs", cfg)
    match = dict(zip(agg.runs.run_id, agg.runs.config_hash_match))
    assert match.pop(stale) is False and all(v is True for v in match.values())
    assert config_hash(cfg) not in set(agg.runs.config_hash)  # no run records the whole one
    # repeats share a slice and its validation
    sh = SliceHash(cfg, {r.run_id: r for r in run_table(cfg)})
    assert sh(ids[0]) == sh(ids[0].replace("_r0", "_r1")) and sh("no_such_run") is None
    # the provenance row, from runs.csv as the report reads it
    agg.runs.to_csv(tmp_path / "runs.csv", index=False)
    back = pd.read_csv(tmp_path / "runs.csv")
    assert config_match(back) == (len(ids) - 1, len(ids), [stale])
    info = collect(config_file=None, cfg=cfg, runs=back, provenance=None)
    row = dict(_provenance_rows(info))["Config hash (validated)"]
    assert f"{len(ids) - 1}/{len(ids)} runs recorded the hash of their slice" in row
    assert f"trained under another config: {stale}" in row


def test_config_hash_match_ignores_where_the_study_lives(tmp_path):
    """results_dir is no part of a run's hash: the records of a study match the config
    that names another results_dir (the study moved). Records whose hash still included
    results_dir match with the results_dir their config.json was written for, or the
    config's own; without either they are flagged, as a run of another config is."""
    from hvdscale.config.load import config_hash, run_config_hash
    from hvdscale.matrix.runtable import run_config

    cfg = F.load_test_config("config.yaml", repeats=1)
    ids = [r.run_id for r in run_table(cfg)]
    runs = tmp_path / "runs"
    F.write_study(runs, cfg)  # as trained in the default results_dir
    moved = validate_config({**cfg, "results_dir": "/scratch/ws/study"})
    agg = aggregate(runs, moved)
    assert len(agg.runs) == len(ids) and agg.runs.config_hash_match.map(bool).all()

    # records of a study in results-old, hashed with results_dir in the slice
    old = validate_config({**cfg, "results_dir": "results-old"})
    for rid in ids:
        sub = validate_config(run_config(old, rid))
        assert config_hash(sub) != run_config_hash(sub)  # the old hash did differ
        path = runs / rid / "metrics.json"
        rec = json.loads(path.read_text())
        rec["environment"]["config_hash"] = config_hash(sub)
        path.write_text(json.dumps(rec))
    written = ids[0]  # its config.json as rule write_run_config wrote it
    (runs / written / "config.json").write_text(json.dumps(run_config(old, written)))

    def matches(c):
        table = aggregate(runs, c).runs
        return dict(zip(table.run_id, table.config_hash_match))

    assert all(v is True for v in matches(old).values())  # unmoved: the config's results_dir
    match = matches(moved)
    assert match.pop(written) is True  # moved: the results_dir of its config.json
    assert all(v is False for v in match.values())  # moved, nothing says where it was


def test_cli_bad_config_is_one_line_exit_2(tmp_path, capsys):
    rc = main(
        [
            "aggregate",
            "--runs-dir",
            str(tmp_path),
            "--config",
            str(tmp_path / "missing.json"),
            "--out-runs",
            str(tmp_path / "r.csv"),
            "--out-summary",
            str(tmp_path / "s.csv"),
            "--out-status",
            str(tmp_path / "st.csv"),
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "missing.json" in err and "not found" in err


MUTATIONS = [
    ("negative wall time", lambda r: r["epochs"][1].__setitem__("wall_s", -1.0)),
    ("missing key", lambda r: r["summary"].pop("time_to_target_s")),
    ("bad enum", lambda r: r["config"].__setitem__("backend", "ucx")),
    ("bool for integer", lambda r: r["config"].__setitem__("workers", True)),
    ("string for number", lambda r: r["epochs"][0].__setitem__("throughput", "fast")),
    ("null not allowed", lambda r: r["environment"].__setitem__("git_commit", None)),
    ("bad run_id", lambda r: r.__setitem__("run_id", "Local_gloo_w1")),
    ("schema version", lambda r: r.__setitem__("schema_version", 2)),
    ("sample pair", lambda r: r["utilisation"]["samples"].append([1.0])),
    ("extra key is allowed", lambda r: r.__setitem__("notes", "fine")),
]


@pytest.mark.parametrize("name,mutate", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_fast_and_reference_validators_agree(name, mutate):
    from hvdscale.analysis.records import RecordValidator

    v = RecordValidator()
    ref = RecordValidator()
    ref._fast = None  # jsonschema only
    rec = F.record_from_epochs("local_gloo_n1_w1_b75_lrnone_r0", [10.0, 3.0, 5.0])
    assert v.problem(rec) is None and ref.problem(rec) is None
    mutate(rec)
    assert (
        (v.problem(rec) is None) == (ref.problem(rec) is None) == (name == "extra key is allowed")
    )


# ----------------------------------------------------------------------------- headline.csv


def _headline_study(tmp_path, n_censored=0):
    """5 paired repeats: 1 worker 1.0 s/epoch reaching the target in epoch 4 (5 epochs),
    2 workers 0.6 s/epoch reaching it in epoch 5 (6 epochs); per-epoch noise-scale sums
    on the 2-worker runs at their expectations (batches without replacement from the
    epoch's 30,000 samples): near the target (epochs 3-5) B_simple 1,800-2,200 per repeat,
    2,000 pooled; far from it (epochs 1-2) 200."""
    from fixtures_runs import NOISE_G2, NOISE_TRACE

    one = [0.5, 0.3, 0.2, 0.15, 0.10, 0.09]
    two = [0.5, 0.3, 0.2, 0.15, 0.12, 0.10]
    miss = [0.5, 0.4, 0.3, 0.25, 0.2, 0.2]
    for r in range(5):
        f = 1.0 + 0.02 * r
        rec = F.record_from_epochs(
            f"local_gloo_n1_w1_b75_lrnone_r{r}", [f] * 6, test_loss=one, target_test_loss=0.105
        )
        F.write_record(tmp_path, rec)
        rec = F.record_from_epochs(
            f"local_gloo_n1_w2_b75_lrnone_r{r}",
            [0.6 * (1.0 + 0.02 * (2 * r % 5))] * 6,  # the same times, paired differently
            test_loss=miss if r < n_censored else two,
            target_test_loss=0.105,
        )
        trace, n = NOISE_TRACE * (1 + 0.05 * (r - 2)), rec["epochs"][0]["samples"]
        for e in rec["epochs"][1:]:  # epoch 0 is the warm-up: no sums
            g2 = NOISE_G2 if e["epoch"] >= 3 else 10 * NOISE_G2
            e.update(noise_steps=10, g_local_sq=g2 + trace * (1 / 75 - 1 / n))
            e.update(g_global_sq=g2 + trace * (1 / 150 - 1 / n))
        F.write_record(tmp_path, rec)
    return aggregate(tmp_path)


def test_headline_splits_the_ttt_speedup_into_its_two_factors(tmp_path):
    from hvdscale.analysis.headline import HEADLINE_COLUMNS, headline
    from hvdscale.analysis.stats import CI_METHOD
    from hvdscale.analysis.tuning import select_tuned

    agg = _headline_study(tmp_path)
    h = headline(agg.runs, select_tuned(agg.runs, agg.status), agg.epochs)
    assert list(h.columns) == HEADLINE_COLUMNS and len(h) == 1
    r = h.iloc[0]
    assert (r.workers, bool(r.tuned), r.global_batch) == (2, False, 150)
    assert r.epoch_speedup == pytest.approx(1 / 0.6)
    assert r.epochs_ratio == pytest.approx(5 / 6)
    # the headline is the measured ratio of median times to target (summary.csv's), the
    # factors multiply to it with the warm-up epochs beyond a steady-state epoch as the rest
    s = agg.summary.set_index("workers")
    assert r.speedup_ttt == pytest.approx(s.loc[2, "speedup_ttt"])
    # the fixed factor from its own definition, not from the product (true by
    # construction): every epoch of these runs takes the same time, warm-up included, so
    # nothing is left beside epoch time x epochs, and the medians of 5 x (1 + 0.02 r)
    # and of 6 x 0.6 (1 + 0.02 (2r mod 5)) are the products of the medians: exactly 1
    assert r.fixed_factor == pytest.approx(1.0)
    assert r.speedup_ttt == pytest.approx((5 * 1.04) / (6 * 0.6 * 1.04))
    assert r.retained_fraction == pytest.approx(r.speedup_ttt / r.epoch_speedup)
    assert (r.reached, r.total, r.base_reached, r.base_total) == (5, 5, 5, 5)
    assert r.epoch_lo < r.epoch_speedup < r.epoch_hi
    assert r.speedup_ttt_lo < r.speedup_ttt < r.speedup_ttt_hi
    # the noise scale near the target (epochs 3-5), not over all epochs (200 in 1-2)
    assert r.b_simple == pytest.approx(2000.0) and r.critical_batch == r.b_simple
    assert 1800 < r.b_simple_lo < 2000 < r.b_simple_hi < 2200
    assert r.predicted_epochs_ratio == pytest.approx((1 + 75 / 2000) / (1 + 150 / 2000))
    assert r.ci_method == CI_METHOD and r.note == ""
    # without the epochs table there is no estimate near the target, and the note says so
    r = headline(agg.runs, select_tuned(agg.runs, agg.status)).iloc[0]
    assert math.isnan(r.b_simple) and math.isnan(r.b_simple_lo)
    assert "no noise scale (no per-epoch noise-scale sums near the target)" in r.note


def test_headline_noise_scale_interval_needs_three_repeats(tmp_path):
    from hvdscale.analysis.headline import headline

    agg = _headline_study(tmp_path)
    two = agg.runs[(agg.runs["workers"] == 1) | agg.runs["repeat"].isin([0, 1])]
    r = headline(two, None, agg.epochs).iloc[0]
    assert math.isfinite(r.b_simple)
    assert math.isnan(r.b_simple_lo) and math.isnan(r.b_simple_hi)
    assert "noise scale: no interval, fewer than 3 runs with noise-scale sums (2)" in r.note


def test_epochs_csv_carries_the_noise_sums_and_old_tables_still_read(tmp_path):
    from hvdscale.analysis.columns import EPOCH_COLUMNS, HEADLINE_COLUMNS
    from hvdscale.analysis.tables import read_epochs, read_headline, write_csv

    agg = _headline_study(tmp_path / "runs")
    ep = agg.epochs.set_index(["run_id", "epoch"])
    two = ep.loc[("local_gloo_n1_w2_b75_lrnone_r2", 4)]
    assert two.noise_steps == 10 and two.g_local_sq > two.g_global_sq > 0
    write_csv(
        agg.epochs.drop(columns=["noise_steps", "g_local_sq", "g_global_sq"]), tmp_path / "e.csv"
    )
    old = read_epochs(tmp_path / "e.csv")
    assert list(old.columns) == EPOCH_COLUMNS and old["g_local_sq"].isna().all()
    h = pd.DataFrame([dict.fromkeys(HEADLINE_COLUMNS, 1)]).assign(tuned="False", note="")
    write_csv(h.drop(columns=["b_simple_lo", "b_simple_hi"]), tmp_path / "h.csv")
    back = read_headline(tmp_path / "h.csv")
    assert back["b_simple_lo"].isna().all() and back["b_simple_hi"].isna().all()


def test_headline_says_why_a_censored_median_is_missing(tmp_path):
    from hvdscale.analysis.headline import headline
    from hvdscale.analysis.tuning import select_tuned

    agg = _headline_study(tmp_path, n_censored=3)
    r = headline(agg.runs, select_tuned(agg.runs, agg.status), agg.epochs).iloc[0]
    assert (r.reached, r.total) == (2, 5)
    assert math.isnan(r.speedup_ttt) and math.isnan(r.speedup_ttt_lo)
    assert "3/5 censored: no median" in r.note
    assert r.epoch_speedup == pytest.approx(1 / 0.6)


def test_aggregate_cli_writes_headline(tmp_path):
    _headline_study(tmp_path / "runs")
    out = tmp_path / "out"
    argv = [
        "aggregate",
        "--runs-dir",
        str(tmp_path / "runs"),
        "--out-runs",
        str(out / "runs.csv"),
        "--out-summary",
        str(out / "summary.csv"),
        "--out-status",
        str(out / "status.csv"),
        "--out-headline",
        str(out / "headline.csv"),
        "--quiet",
    ]
    assert main(argv) == 0
    h = pd.read_csv(out / "headline.csv")
    assert h.loc[0, "reached"] == 5 and h.loc[0, "speedup_ttt"] > 1
    assert h.loc[0, "b_simple"] == pytest.approx(2000.0)  # from epochs.csv, near the target
    assert h.loc[0, "b_simple_lo"] < 2000 < h.loc[0, "b_simple_hi"]
