"""Planning and checking a study (issue 13): the budget preview against a hand
computation, selection (run table, plan and DAG agree; bad selections are schema
errors naming the key), reference verdicts, and the study comparison on hand-made
studies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import fixtures_runs as F
import numpy as np
import pandas as pd
import pytest
import yaml

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.references import check_references, verdict
from hvdscale.analysis.tables import read_runs
from hvdscale.cli import main
from hvdscale.config.load import load_config, validate_config
from hvdscale.errors import ConfigError
from hvdscale.matrix.runtable import run_config, run_table
from hvdscale.study.compare import compare_runs
from hvdscale.study.plan import format_plan, merged_config, plan

ROOT = Path(__file__).resolve().parents[1]
THESIS = ROOT / "config" / "thesis.yaml"


def thesis_raw() -> dict:
    return yaml.safe_load(THESIS.read_text())


# --------------------------------------------------------------------------- plan


def test_thesis_budget_matches_a_hand_computation():
    """config/thesis.yaml: 5 repeats; 'workers' sweep 6 worker counts x 3 backends x 3 LR
    rules on alpha (8 GPUs/node, 2 h) and hpdlf (3 GPUs/node, 2 h) (gpu2, K80, is out of
    the sweeps: the pinned TensorFlow cannot run it); 'batch' sweep adds 5 new batch sizes
    x workers 1 and 8 x 3 LR rules on alpha (nccl)."""
    nodes = {  # sequential fill: ceil(workers / GPUs per node) for 1, 2, 4, 8, 16, 32 workers
        "alpha": [1, 1, 1, 1, 2, 4],
        "hpdlf": [1, 1, 2, 3, 6, 11],
    }
    hours = {"alpha": 2, "hpdlf": 2}
    gpus_per_node = {"alpha": 8, "hpdlf": 3}
    workers = [1, 2, 4, 8, 16, 32]
    repeats = 5
    per_config = 3 * 3 * repeats  # backends x LR rules x repeats
    hand_jobs = {p: 6 * per_config for p in nodes}
    hand_jobs["alpha"] += 5 * 2 * 3 * repeats
    hand_nh = {p: sum(nodes[p]) * per_config * hours[p] for p in nodes}
    hand_nh["alpha"] += 5 * 2 * 3 * repeats * 1 * hours["alpha"]
    # GPUs requested: min(GPUs per node, workers) per node x nodes
    hand_gh = {
        p: sum(min(gpus_per_node[p], w) * n for w, n in zip(workers, nodes[p]))
        * per_config
        * hours[p]
        for p in nodes
    }
    hand_gh["alpha"] += 5 * 3 * repeats * (1 + 8) * hours["alpha"]
    # the target's 3 calibration runs: 1 GPU on one alpha node each (training.target)
    hand_jobs["alpha"] += 3
    hand_nh["alpha"] += 3 * 1 * hours["alpha"]
    hand_gh["alpha"] += 3 * 1 * hours["alpha"]
    assert hand_nh == {"alpha": 1206, "hpdlf": 2160}

    p = plan(load_config(THESIS), results=ROOT / "results-does-not-exist")
    rows = {r["partition"]: r for r in p["partitions"]}
    assert {k: r["jobs"] for k, r in rows.items()} == hand_jobs
    assert {k: r["node_hours_worst"] for k, r in rows.items()} == hand_nh
    assert {k: r["gpu_hours_worst"] for k, r in rows.items()} == hand_gh
    assert rows["hpdlf"]["nodes_per_job"] == "1,2,3,6,11"
    assert p["total"]["jobs"] == 693 and p["total"]["node_hours_worst"] == 3366
    assert "693 training jobs, worst case 3,366 node-h" in format_plan(p)


def test_expected_hours_from_records_and_cost_model(tmp_path):
    cfg = F.load_test_config("config.yaml")
    PRED = 5.0  # s per epoch: the budget's epochs fit the partition's time limit
    ids = [r.run_id for r in run_table(cfg)]
    (tmp_path / "scaling").mkdir()
    pd.DataFrame({"run_id": [ids[0]], "train_time_s": [1800.0]}).to_csv(
        tmp_path / "scaling" / "runs.csv", index=False
    )
    run = run_table(cfg)[1]
    cm = {
        "predictions": [
            {
                "partition": run.partition,
                "backend": run.backend,
                "batch_per_worker": run.batch,
                "lr_rule": run.lr_rule,
                "points": [{"workers": run.workers, "epoch_time_s_pred": PRED}],
            }
        ]
    }
    (tmp_path / "scaling" / "costmodel.json").write_text(json.dumps(cm))
    (tmp_path / "runs" / ids[0]).mkdir(parents=True)
    # done: a record and the config slice it was trained with (rule write_run_config's)
    slice_json = json.dumps(run_config(cfg, ids[0]), sort_keys=True)
    out = str(tmp_path / "runs" / ids[0] / "config.json")
    assert main(["write-config", "--json", slice_json, "--out", out]) == 0
    (tmp_path / "runs" / ids[0] / "metrics.json").write_text("{}")
    row = plan(cfg, tmp_path)["partitions"][0]
    epochs = cfg["training"]["max_epochs"]
    # 0.5 h measured + epochs x PRED s predicted, one node each
    assert epochs * PRED < 60 * cfg["scaling"]["partitions"][run.partition]["runtime_min"]
    assert row["jobs_estimated"] == 2 and row["jobs_done"] == 1
    assert row["node_hours_expected"] == pytest.approx(0.5 + epochs * PRED / 3600, abs=1e-3)


# --------------------------------------------------------------------------- select


@pytest.mark.parametrize(
    "select, expect",
    [
        ("partition=alpha workers=1-8 repeat=0", dict(partition={"alpha"}, repeat={0})),
        ({"sweep": "batch", "lr": "none,sqrt"}, dict(lr_rule={"none", "sqrt"})),
        ("backend=nccl;workers=16-", dict(backend={"nccl"})),
    ],
)
def test_selection_changes_run_table_and_plan_consistently(select, expect):
    full = run_table(load_config(THESIS))
    cfg = validate_config({**thesis_raw(), "select": select})
    planned = run_table(cfg)
    # the target's calibration runs are part of every selection (the target needs them)
    cal = [r for r in full if r.kind == "cal"]
    assert cal and set(cal) <= set(planned)
    runs = [r for r in planned if r.kind != "cal"]
    assert 0 < len(runs) < len(full) - len(cal) and set(runs) <= set(full)
    for attr, allowed in expect.items():
        assert {getattr(r, attr) for r in runs} <= allowed
    if "workers=1-8" in str(select):
        assert max(r.workers for r in runs) == 8
        # alpha: 4 worker counts x 9 (workers sweep) + 2 x 6 batches x 3 LR - 6 shared
        assert len(runs) == 4 * 9 + 36 - 6
    if "workers=16-" in str(select):
        assert min(r.workers for r in runs) == 16
    p = plan(cfg, results="results-does-not-exist")
    assert p["total"]["jobs"] == len(planned)
    parts = cfg["scaling"]["partitions"]
    assert p["total"]["node_hours_worst"] == pytest.approx(
        sum(r.nodes * parts[r.partition]["runtime_min"] / 60 for r in planned)
    )


@pytest.mark.parametrize(
    "select, key",
    [
        ("wrkers=1-8", "config key select:"),
        ("partition=beta", "config key select.partition: got 'beta'"),
        ({"workers": "x"}, "config key select.workers:"),
        ({"nodes": "1"}, "config key select: unknown key(s) 'nodes'"),
        ("sweep=nope", "config key select.sweep: got 'nope'"),
        ("workers=64-", "config key select: 'workers=64-' matches no run"),
        ("partition=alpha;touch PWNED", "config key select:"),
    ],
)
def test_invalid_selection_is_a_config_error_naming_the_key(select, key):
    with pytest.raises(ConfigError) as err:
        validate_config({**thesis_raw(), "select": select})
    assert key in str(err.value)


def snakemake(*args):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "snakemake", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_dry_run_prints_the_plan_and_plans_the_selection():
    out = snakemake(
        "-n",
        "--configfile",
        "config/thesis.yaml",
        "--config",
        "select=partition=hpdlf workers=1-4 repeat=0",
        "results_dir=results-test-select",
    )
    assert out.returncode == 0, out.stderr[-3000:]
    # hpdlf: 3 worker counts x 3 backends x 3 LR rules, one repeat; and the target's 3
    # calibration runs (alpha, 1 GPU, 2 h each), part of every selection
    assert "hvdscale plan: 30 training jobs" in out.stderr
    assert "  hpdlf: 27 jobs x 1,2 nodes, worst 72.0 node-h / 162 GPU-h" in out.stderr
    assert "  alpha: 3 jobs x 1 nodes, worst 6.0 node-h / 6.0 GPU-h" in out.stderr
    lines = (out.stdout + out.stderr).splitlines()
    assert any(line.split()[:2] == ["train_run", "30"] for line in lines)
    # allreduce sweeps of the selection only: workers 2 and 4 x 3 backends
    assert any(line.split()[:2] == ["measure_allreduce", "6"] for line in lines)

    bad = snakemake("-n", "--config", "select=partition=nope")
    assert bad.returncode != 0 and "config key select.partition" in bad.stdout + bad.stderr


def test_plan_command(capsys):
    assert main(["plan", str(THESIS), "--select", "partition=hpdlf repeat=0"]) == 0
    text = capsys.readouterr().out
    # 24 node-jobs x 9 x 2 h on hpdlf, and the 3 calibration runs (alpha, 2 h each)
    assert "57 training jobs, worst case 438 node-h" in text
    assert "(select: partition=hpdlf repeat=0)" in text
    cfg = merged_config([THESIS, ROOT / "config" / "partial.yaml"])
    assert cfg["report"]["allow_partial"] and len(run_table(cfg)) == 693


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize(
    "measured, ci, better, expect",
    [
        (0.55, None, "higher", "within"),
        (0.60, None, "higher", "better"),
        (0.40, None, "higher", "worse"),
        (0.40, None, "lower", "better"),
        (0.60, (0.45, 0.70), "higher", "inconclusive"),  # straddles the band's upper edge
        (0.52, (0.40, 0.54), "lower", "inconclusive"),  # straddles the lower edge
        (0.50, (0.40, 0.60), "higher", "inconclusive"),  # wider than the band
        (0.52, (0.46, 0.54), "higher", "within"),  # inside the band
        (0.70, (0.62, 0.80), "higher", "better"),
        (0.35, (0.30, 0.44), "higher", "worse"),
        (0.35, (0.30, 0.44), "lower", "better"),
        (None, None, "higher", "not measured"),
        (float("nan"), None, "lower", "not measured"),
    ],
)
def test_verdict(measured, ci, better, expect):
    assert verdict(measured, ci, 0.5, 0.05, better) == expect


def hand_study(runs_dir: Path, times: dict[int, list[float]], *, commit="a" * 40, **rec_kw):
    """Records of partition local, gloo, batch 75, LR none with these epoch times per
    worker count (one list entry per repeat; 4 epochs of that time each)."""
    for w, reps in times.items():
        for r, t in enumerate(reps):
            rid = f"local_gloo_n1_w{w}_b75_lrnone_r{r}"
            rec = F.record_from_epochs(
                rid, [t] * 4, target_test_loss=0.2, git_commit=commit, **rec_kw
            )
            F.write_record(runs_dir, rec)


def hand_config(workers=(1, 2), repeats=3, **references) -> dict:
    raw = {
        "training": {"max_epochs": 4, "repeats": repeats, "target_test_loss": 0.2},
        "scaling": {
            "partitions": {
                "local": {"cores_per_node": 4, "mem_mb_per_node": 8000, "workers_per_node": 4}
            },
            "sweeps": [
                {
                    "partitions": ["local"],
                    "workers": list(workers),
                    "backends": ["gloo"],
                    "batch_sizes": [75],
                    "lr_rules": ["none"],
                }
            ],
        },
        "references": {
            "speedup_per_gpu": {"local": {"value": 0.5, "tolerance": 0.05}},
            **references,
        },
    }
    return validate_config(raw)


def test_reference_verdicts_on_hand_made_studies(tmp_path):
    # S(2) = 4/2.5 = 1.6, S(4) = 4/1.6 = 2.5: slope through (1,1), (2,1.6), (4,2.5) = 0.5
    times = {1: [4.0, 4.0, 4.0], 2: [2.5, 2.5, 2.5], 4: [1.6, 1.6, 1.6]}
    cfg = hand_config(
        workers=(1, 2, 4),
        sync_share={"value": 0.05, "tolerance": 0.02},  # measured 0.20 (shares): worse
        data_share={"value": 0.10, "tolerance": 0.02},  # measured 0.02: better
        batch_epoch_speedup=None,
    )
    hand_study(tmp_path / "runs", times)
    a = aggregate(tmp_path / "runs", cfg)
    df = check_references(cfg["references"], a.summary, a.runs).set_index("quantity")
    n = np.array([1, 2, 4.0])
    s = np.array([1, 1.6, 2.5])
    slope = ((n - n.mean()) * (s - s.mean())).sum() / ((n - n.mean()) ** 2).sum()
    sp = df.loc["speedup_per_gpu"]
    assert sp["measured"] == pytest.approx(slope) and sp["verdict"] == "within"
    assert sp["ci_low"] == pytest.approx(slope) and sp["min_repeats"] == 3
    # phase shares of the step time: (0.02, 0.70, 0.20, 0.05) / 0.97
    assert df.loc["sync_share", "measured"] == pytest.approx(0.20 / 0.97)
    assert df.loc["sync_share", "verdict"] == "worse"
    assert df.loc["data_share", "verdict"] == "better"
    assert "batch_epoch_speedup" not in df.index

    # two repeats: no interval, the value decides; a partition without runs: not measured
    cfg2 = hand_config(
        workers=(1, 2, 4),
        repeats=2,
        speedup_per_gpu={
            "local": {"value": 0.8, "tolerance": 0.1},
            "alpha": {"value": 0.53, "tolerance": 0.05},
        },
    )
    hand_study(tmp_path / "runs2", {w: t[:2] for w, t in times.items()})
    a2 = aggregate(tmp_path / "runs2", cfg2)
    df2 = check_references(cfg2["references"], a2.summary, a2.runs)
    v = dict(zip(df2["quantity"] + ":" + df2["partition"].fillna(""), df2["verdict"]))
    assert v["speedup_per_gpu:local"] == "worse" and v["speedup_per_gpu:alpha"] == "not measured"
    assert v["batch_epoch_speedup:"] == "not measured"
    assert df2["ci_low"].isna().all()


def test_strict_check_references_exits_nonzero_on_a_regression(tmp_path, capsys):
    cfg = hand_config(sync_share={"value": 0.05, "tolerance": 0.02})
    hand_study(tmp_path / "runs", {1: [4.0, 4.1, 3.9], 2: [2.5, 2.6, 2.4]})
    full = tmp_path / "full.json"
    full.write_text(json.dumps(cfg))
    assert main(["aggregate", "--runs-dir", str(tmp_path / "runs"), "--config", str(full),
                 "--out-runs", str(tmp_path / "runs.csv"), "--out-summary",
                 str(tmp_path / "summary.csv"), "--out-status", str(tmp_path / "status.csv"),
                 "--quiet"]) == 0  # fmt: skip
    args = ["check-references", "--config", str(full), "--runs", str(tmp_path / "runs.csv"),
            "--summary", str(tmp_path / "summary.csv"),
            "--out", str(tmp_path / "ref.csv")]  # fmt: skip
    assert main(args) == 0  # not strict: the table says worse, the exit status does not
    assert "worse" in pd.read_csv(tmp_path / "ref.csv")["verdict"].tolist()
    assert main([*args, "--strict"]) == 1
    assert main(["check-references", "--check", str(tmp_path / "ref.csv")]) == 1
    capsys.readouterr()


# --------------------------------------------------------------------------- compare


def test_compare_flags_exactly_the_configurations_whose_intervals_do_not_overlap(tmp_path):
    cfg = hand_config()
    # w1 the same within noise; w2 one third slower in B
    a_times = {1: [3.0, 3.1, 2.9], 2: [2.0, 2.1, 1.9]}
    b_times = {1: [3.05, 2.95, 3.0], 2: [3.0, 3.1, 2.9]}
    for name, times, commit in (("a", a_times, "a" * 40), ("b", b_times, "b" * 40)):
        root = tmp_path / name
        hand_study(root / "runs", times, commit=commit)
        (root / "config").mkdir(parents=True)
        (root / "config" / "full.json").write_text(json.dumps(cfg))
        s = root / "scaling"
        assert main(["aggregate", "--runs-dir", str(root / "runs"), "--config",
                     str(root / "config" / "full.json"), "--out-runs", str(s / "runs.csv"),
                     "--out-summary", str(s / "summary.csv"), "--out-status",
                     str(s / "status.csv"), "--quiet"]) == 0  # fmt: skip
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    df = pd.read_csv(out / "comparison.csv")
    flagged = set(
        zip(df.loc[df.flag == "differs", "workers"], df.loc[df.flag == "differs", "metric"])
    )
    assert flagged == {
        (2, "epoch_time_s"),
        (2, "throughput"),
        (2, "time_to_target_s"),
        (2, "efficiency"),
    }
    assert set(df.loc[df.workers == 1, "flag"]) == {"holds 1"}
    row = df[(df.workers == 2) & (df.metric == "epoch_time_s")].iloc[0]
    assert row["a"] == pytest.approx(2.0) and row["b"] == pytest.approx(3.0)
    assert row["change"] == pytest.approx(0.5) and row["a_ci_low"] <= 2.0 <= row["a_ci_high"]
    prov = pd.read_csv(out / "provenance.csv").set_index("item")
    assert prov.loc["git commit", "a"] == "a" * 40 and prov.loc["git commit", "b"] == "b" * 40
    assert not prov.loc["git commit", "same"] and prov.loc["train env: tensorflow", "same"]
    pdf = (out / "comparison.pdf").read_bytes()
    assert pdf[:4] == b"%PDF" and len(pdf) > 2000


def test_compare_without_repeats_says_no_interval(tmp_path):
    cfg = hand_config(repeats=1)
    for name, t in (("a", 2.0), ("b", 4.0)):
        hand_study(tmp_path / name, {1: [4.0], 2: [t]})
    ra = aggregate(tmp_path / "a", cfg).runs
    rb = aggregate(tmp_path / "b", cfg).runs
    from hvdscale.study.compare import compare_runs

    df = compare_runs(ra, rb)
    assert set(df["flag"]) == {"no interval"} and df["a_n"].eq(1).all()


def _compare_study(root: Path, diverged: str = "") -> Path:
    """5 repeats of 1 and 2 workers through `hvdscale aggregate`; ``diverged``: the run id
    whose loss became non-finite before the target (the rest as in the other study)."""
    cfg = hand_config(repeats=5)
    times = {1: [3.0, 3.1, 2.9, 3.05, 2.95], 2: [2.0, 2.1, 1.9, 2.05, 1.95]}
    for w, reps in times.items():
        for r, t in enumerate(reps):
            rid = f"local_gloo_n1_w{w}_b75_lrnone_r{r}"
            kw = dict(status="nan_loss", test_loss=[0.5, 0.4, 0.35, 0.3]) if rid == diverged else {}
            rec = F.record_from_epochs(rid, [t] * 4, target_test_loss=0.2, **kw)
            F.write_record(root / "runs", rec)
    (root / "config").mkdir(parents=True)
    (root / "config" / "full.json").write_text(json.dumps(cfg))
    s = root / "scaling"
    assert main(["aggregate", "--runs-dir", str(root / "runs"), "--config",
                 str(root / "config" / "full.json"), "--out-runs", str(s / "runs.csv"),
                 "--out-summary", str(s / "summary.csv"), "--out-status",
                 str(s / "status.csv"), "--quiet"]) == 0  # fmt: skip
    return root


def test_compare_a_study_with_itself_and_with_a_diverged_copy(tmp_path):
    """The comparison uses the report's statistics: a study against itself gives ratio 1
    with an interval that holds 1 everywhere; against a copy whose one 2-worker repeat
    diverged, that run counts as not reached (4/5, never 4/4), as in the report."""
    a = _compare_study(tmp_path / "a")
    out = tmp_path / "same"
    assert main(["compare", str(a), str(a), "--out", str(out)]) == 0
    same = pd.read_csv(out / "comparison.csv")
    assert set(same["metric"]) == {"epoch_time_s", "throughput", "time_to_target_s", "efficiency"}
    assert np.allclose(same["ratio"], 1.0)
    assert (same["ratio_lo"] <= 1).all() and (same["ratio_hi"] >= 1).all()
    assert set(same["flag"]) == {"holds 1"} and not same["tuned"].any()
    ttt = same[same["metric"] == "time_to_target_s"].set_index("workers")
    assert (ttt.loc[2, "a_reached"], ttt.loc[2, "a_n"]) == (5, 5)

    div = _compare_study(tmp_path / "b", diverged="local_gloo_n1_w2_b75_lrnone_r0")
    df = compare_runs(
        read_runs(a / "scaling" / "runs.csv"), read_runs(div / "scaling" / "runs.csv")
    )
    t2 = df[(df["metric"] == "time_to_target_s") & (df["workers"] == 2)].iloc[0]
    assert (t2.a_reached, t2.a_n, t2.b_reached, t2.b_n) == (5, 5, 4, 5)
    # the diverged run's +inf is in the median's interval and the ratio's, not dropped
    assert t2.b_ci_high >= t2.b and t2.ratio_lo <= t2.ratio <= t2.ratio_hi
    e2 = df[(df["metric"] == "epoch_time_s") & (df["workers"] == 2)].iloc[0]
    assert (e2.a_n, e2.b_n) == (5, 4)  # epoch times: completed runs only, as the report
    s = pd.read_csv(div / "scaling" / "summary.csv").set_index("workers")
    assert (s.loc[2, "n_reached_target"], s.loc[2, "n_ttt_total"]) == (4, 5)


def test_describe_system(tmp_path):
    from hvdscale.record.system import collect_system

    info = collect_system()
    assert info["cores"] == os.cpu_count() and info["cpu_model"]
    assert isinstance(info["gpus"], list) and isinstance(info["interfaces"], list)
    assert all(set(i) == {"name", "addresses"} for i in info["interfaces"])
    assert "lo" not in [i["name"] for i in info["interfaces"]]
    assert info["errors"] == {} and info["nodes"] == [info["hostname"]]
    for k in ("cuda_driver", "cuda_build", "cudnn", "nccl", "mpi", "mpi_implementation"):
        assert isinstance(info[k], str)
    assert collect_system(nodes=["n2", "n1", "n2"])["nodes"] == ["n1", "n2"]
    assert main(["describe-system", "--out", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["kernel"] == info["kernel"]


def test_describe_system_gpu_and_mpi_from_tools(tmp_path, monkeypatch):
    """nvidia-smi and mpirun as a GPU node has them (stubs on PATH); a probe that raises
    is named in errors and the others still describe the machine."""
    from hvdscale.record import system

    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "nvidia-smi").write_text(
        "#!/bin/sh\n"
        'if [ -n "$1" ]; then echo "NVIDIA A100-SXM4-40GB, 535.104.05, 40960 MiB"; '
        'else echo "| Driver Version: 535.104.05   CUDA Version: 12.2 |"; fi\n'
    )
    (stub / "mpirun").write_text("#!/bin/sh\necho 'HYDRA build details:' >&2\n")
    for f in stub.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{stub}:{os.environ['PATH']}")
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    monkeypatch.setattr(system, "_interfaces", lambda: 1 / 0)
    info = system.collect_system()
    assert info["gpus"] == [
        {"model": "NVIDIA A100-SXM4-40GB", "driver": "535.104.05", "memory": "40960 MiB"}
    ]
    assert info["cuda_driver"] == "12.2" and info["nccl_socket_ifname"] == "ib0"
    assert info["mpi_implementation"] == "MPICH"
    assert info["interfaces"] == [] and "ZeroDivisionError" in info["errors"]["interfaces"]
    assert system._nccl_version(21805) == "2.18.5" and system._nccl_version(2708) == "2.7.8"
