"""The report pipeline (aggregate -> fit-costmodel -> plot -> report) on synthetic run
records: a complete set, a partial set (missing, failed, nan_loss) and an empty one."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path

import fixtures_runs as F
import pandas as pd
import pytest
import report_fixtures  # noqa: F401  (CI_METHOD placeholder until the stats branch lands)
from required_layers import layer_skipif, require_layer

from hvdscale.analysis.aggregate import aggregate
from hvdscale.analysis.tables import read_summary
from hvdscale.cli import main
from hvdscale.config.load import validate_config
from hvdscale.figures.draw import FIGURES
from hvdscale.matrix.runtable import run_table
from hvdscale.project import PROJECT_ROOT
from hvdscale.report import fmt
from hvdscale.report.reference_section import reference_rows

needs_poppler = layer_skipif(
    "poppler", "poppler-utils not installed" if shutil.which("pdftotext") is None else None
)
CONFIG_FILE = PROJECT_ROOT / "config" / "config.yaml"


def pipeline(
    root: Path, cfg: dict, runs_dir: Path, allreduce: list[Path], provenance: dict | None = None
) -> dict[str, Path]:
    """Run the four analysis commands as the Snakemake rules do; return the outputs."""
    (root / "config").mkdir(parents=True, exist_ok=True)
    full = root / "config" / "full.json"
    full.write_text(json.dumps(cfg))
    s = root / "scaling"
    out = {
        "runs": s / "runs.csv",
        "summary": s / "summary.csv",
        "status": s / "status.csv",
        "costmodel": s / "costmodel.json",
        "plots": root / "plots",
        "report": root / "report.pdf",
    }
    o = {k: str(v) for k, v in out.items()}
    tables = ["--runs", o["runs"], "--summary", o["summary"]]
    aggregate_args = ["aggregate", "--runs-dir", str(runs_dir), "--config", str(full)]
    aggregate_args += ["--out-runs", o["runs"], "--out-summary", o["summary"]]
    aggregate_args += [
        "--out-tuned",
        str(s / "tuned.csv"),
        "--out-headline",
        str(s / "headline.csv"),
    ]
    assert main(aggregate_args + ["--out-status", o["status"], "--quiet"]) == 0
    fit = ["fit-costmodel", "--allreduce", *map(str, allreduce), *tables]
    assert main(fit + ["--out", o["costmodel"]]) == 0
    assert main(["plot", *tables, "--costmodel", o["costmodel"], "--outdir", o["plots"]]) == 0
    extra = []
    if provenance is not None:
        (root / "provenance.json").write_text(json.dumps(provenance))
        extra = ["--provenance", str(root / "provenance.json")]
    report = ["report", "--config-file", str(CONFIG_FILE), "--config", str(full), *tables]
    report += ["--status", o["status"], "--costmodel", o["costmodel"]]
    report += ["--plots-dir", o["plots"], "--out", o["report"], *extra]
    assert main(report) == 0
    return out


def pdf_text(path: Path) -> str:
    return subprocess.run(
        ["pdftotext", str(path), "-"], capture_output=True, text=True, check=True
    ).stdout


@pytest.fixture(scope="module")
def complete(tmp_path_factory):
    root = tmp_path_factory.mktemp("complete")
    cfg = F.load_test_config("config.yaml", repeats=2)
    F.write_study(root / "runs", cfg)
    ar = F.study_allreduce(root / "allreduce", cfg)
    prov = {
        "train_env": {"tensorflow": "2.15.1", "horovod": "0.28.1+nccl-test"},
        "gpu_driver": "535.104",
    }
    return cfg, pipeline(root, cfg, root / "runs", ar, provenance=prov)


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
    root = tmp_path_factory.mktemp("partial")
    cfg = F.load_test_config("config.yaml", repeats=2)
    ids = {r.run_id for r in run_table(cfg)}
    # the mpi batch-75 baseline is lost (one repeat missing, one failed); a gloo run diverged
    special = {
        "missing": "local_mpi_n1_w1_b75_lrlinear_r0",
        "failed": "local_mpi_n1_w1_b75_lrlinear_r1",
        "nan_loss": "local_gloo_n1_w2_b75_lrlinear_r0",
    }
    assert set(special.values()) <= ids
    F.write_study(
        root / "runs",
        cfg,
        missing={special["missing"]},
        failed={special["failed"]},
        nan_loss={special["nan_loss"]},
    )
    ar = F.study_allreduce(root / "allreduce", cfg)
    return cfg, special, pipeline(root, cfg, root / "runs", ar)


def check_plots(plots: Path):
    for name in FIGURES:
        for ext, magic in (("pdf", b"%PDF"), ("png", b"\x89PNG")):
            p = plots / f"{name}.{ext}"
            assert p.exists() and p.stat().st_size > 1000, p
            assert p.read_bytes()[:4] == magic
    assert not [p for p in plots.iterdir() if p.name.startswith(".")]  # no temporary files left


@needs_poppler
def test_complete_report_has_key_numbers(complete):
    cfg, out = complete
    check_plots(out["plots"])
    text = pdf_text(out["report"])
    summary = read_summary(out["summary"])
    # every measured cell of the gloo 2-worker row of the configuration table, in its
    # place: the row under its group's header, as summary.csv holds it (issue 30)
    r = summary[(summary.workers == 2) & (summary.backend == "gloo")].iloc[0]
    head = (
        f"local / gloo / batch 75 per worker / LR linear | speedup per GPU "
        f"{fmt.slope(r.speedup_per_gpu)} | baseline ok"
    )
    flat = " ".join(text.split())
    assert head in flat
    block = flat.split(head, 1)[1].split(" / batch ", 1)[0]
    cells = [
        "2",
        "1",
        f"{int(r.n_completed)}/{int(r.n_expected)}",
        fmt.spread(
            fmt.seconds(r.epoch_time_s),
            fmt.seconds(r.epoch_time_min_s),
            fmt.seconds(r.epoch_time_max_s),
        ),
        fmt.rate(r.throughput),
        fmt.speedup(r.speedup),  # 2 repeats: no interval
        fmt.efficiency(r.efficiency),
        fmt.speedup(r.speedup_ttt),
        fmt.percent(r.sync_share),
        fmt.percent(r.data_share),
        fmt.loss(r.final_test_loss),
        f"{fmt.seconds(r.time_to_target_s)} ({int(r.n_reached_target)}/{int(r.n_completed)})",
    ]
    assert " ".join(cells) in block, (cells, block[:400])
    assert r.n_repeats == 2 and math.isnan(r.speedup_lo)  # why the row has no interval
    # the reference study's constants are printed (they are not measured numbers)
    for needle in (
        "Horovod scaling study",
        "Provenance",
        "How the times were measured",
        "warm-up",
        str(CONFIG_FILE),
        "Comparison with the reference study",
        "not measured",
        "0.53",  # the reference study's speedup per GPU on Alpha (config references)
        "28 %",
        "Allreduce cost model",
        "Prediction error",
        f"All {len(run_table(cfg))} runs of the run table completed",
    ):
        assert needle in text, needle
    for i in range(1, 8):
        assert f"Figure {i}." in text
    sha = __import__("hashlib").sha256(CONFIG_FILE.read_bytes()).hexdigest()
    assert sha in text.replace("\n", "")
    cm = json.loads(out["costmodel"].read_text())
    assert fmt.micros(cm["fits"][0]["alpha_s"]) in text
    assert "page 1 of" in text
    assert (
        "train_env.horovod" in text and "0.28.1+nccl-test" in text and "535.104" in text
    )  # provenance JSON
    assert "tensorflow 2.15.1" in text  # run records
    assert [p.name for p in out["report"].parent.iterdir() if p.name.startswith(".report")] == []


@needs_poppler
def test_partial_report_lists_missing_and_failed_runs(partial):
    cfg, special, out = partial
    check_plots(out["plots"])
    status = pd.read_csv(out["status"]).set_index("run_id")
    for st, rid in special.items():
        assert status.loc[rid, "status"] == st
    text = pdf_text(out["report"])
    assert "Missing, failed and mislabelled runs" in text and "did not complete" in text
    for rid in special.values():
        assert rid in text
    assert "srun: error: node failure" in text  # the failure.json error
    summary = read_summary(out["summary"])
    nob = summary[~summary.has_baseline]
    assert set(nob.backend) == {"mpi"} and set(nob.baseline_status) == {"failed"}
    assert "baseline failed" in text and "missing" in text


@needs_poppler
def test_report_from_no_runs(tmp_path, capsys):
    cfg = F.load_test_config("config.yaml")
    (tmp_path / "runs").mkdir()
    out = pipeline(tmp_path, cfg, tmp_path / "runs", [])
    check_plots(out["plots"])
    text = pdf_text(out["report"])
    assert (
        "No run has completed yet" in text and "no data for this figure" not in text
    )  # note is in the PNG
    assert "not fitted" in text
    err = capsys.readouterr().err
    assert "speedup_efficiency: no data" in err


@needs_poppler
def test_first_pages_render(complete):
    _, out = complete
    require_layer("poppler", "pdftoppm missing" if shutil.which("pdftoppm") is None else None)
    subprocess.run(
        [
            "pdftoppm",
            "-r",
            "30",
            "-png",
            "-f",
            "1",
            "-l",
            "2",
            str(out["report"]),
            str(out["report"].with_name("page")),
        ],
        check=True,
    )
    pages = sorted(out["report"].parent.glob("page-*.png"))
    assert len(pages) == 2 and all(p.stat().st_size > 1000 for p in pages)


def test_reference_rows_against_a_thesis_like_study(tmp_path):
    raw = {
        "training": {"max_epochs": 4, "warmup_epochs": 1, "repeats": 1},
        "scaling": {
            "partitions": {
                "alpha": {
                    "gpus_per_node": 8,
                    "gpu_model": "A100",
                    "cores_per_node": 48,
                    "mem_mb_per_node": 900000,
                },
                "hpdlf": {"gpus_per_node": 3, "cores_per_node": 12, "mem_mb_per_node": 80000},
            },
            "sweeps": [
                {
                    "partitions": ["alpha", "hpdlf"],
                    "workers": [1, 2, 4],
                    "backends": ["nccl", "mpi"],
                    "batch_sizes": [75],
                    "lr_rules": ["none"],
                },
                {
                    "partitions": ["alpha"],
                    "workers": [1],
                    "backends": ["nccl"],
                    "batch_sizes": [75, 1000],
                    "lr_rules": ["none"],
                },
            ],
        },
    }
    from hvdscale.config.load import validate_config

    cfg = validate_config(raw)
    F.write_study(tmp_path / "runs", cfg, train_samples=75_000)
    summary = aggregate(tmp_path / "runs", cfg).summary
    rows = {r["quantity"]: r for r in reference_rows(summary, cfg["references"])}
    alpha = rows["Speedup per GPU, Alpha (A100)"]
    g = summary[
        (summary.partition == "alpha")
        & (summary.backend == "nccl")
        & (summary.batch_per_worker == 75)
    ]
    assert alpha["ours"] == fmt.slope(g.speedup_per_gpu.iloc[0]) and "nccl" in alpha["config"]
    assert "at 4 workers" in alpha["loss"]
    assert rows["Speedup per GPU, GPU2 (K80)"]["ours"] == "not measured"
    batch = rows["Epoch speedup from batch 75 to 1000"]
    b = summary[
        (summary.partition == "alpha") & (summary.backend == "nccl") & (summary.workers == 1)
    ]
    t = b.set_index("batch_per_worker").epoch_time_s
    assert batch["ours"] == f"{t[75] / t[1000]:.1f}x" and "batch 1000" in batch["loss"]
    assert rows["Share of epoch time in gradient synchronisation"]["ours"].endswith(")")


def _built_files(out: dict[str, Path]) -> dict[str, bytes]:
    files = {"report.pdf": out["report"].read_bytes()}
    for name in FIGURES:
        for ext in ("pdf", "png"):
            files[f"{name}.{ext}"] = (out["plots"] / f"{name}.{ext}").read_bytes()
    return files


def test_rebuild_from_the_same_inputs_gives_identical_bytes(tmp_path, monkeypatch):
    """Figures (PDF and PNG) and the report carry no clock time: rebuilt from the same
    run records they are byte-identical (the archive check of issue 13 relies on it)."""
    import datetime as dt

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    cfg = F.load_test_config("config.yaml", repeats=2)
    F.write_study(tmp_path / "runs", cfg, failed={run_table(cfg)[3].run_id})
    ar = F.study_allreduce(tmp_path / "allreduce", cfg)
    first = _built_files(pipeline(tmp_path / "a", cfg, tmp_path / "runs", ar))
    second = _built_files(pipeline(tmp_path / "b", cfg, tmp_path / "runs", ar))
    assert sorted(first) == sorted(second)
    for name, data in first.items():
        assert data == second[name], f"{name} differs between two builds"
    today = dt.datetime.now(dt.timezone.utc)
    for stamp in (today.strftime("D:%Y%m%d").encode(), today.strftime("%Y-%m-%d").encode()):
        assert not [n for n, data in first.items() if stamp in data]
    assert b"Software" not in first["costmodel.png"]


@needs_poppler
def test_captions_come_from_the_rst_files_with_config_values(complete):
    from hvdscale.config.load import count_parameters
    from hvdscale.figures.registry import FIGURE_NAMES, caption_values

    cfg, out = complete
    text = " ".join(pdf_text(out["report"]).split())
    n_params = f"{count_parameters(cfg):,}"
    assert caption_values(cfg)["n_parameters"] == n_params
    assert f"gradient size ({n_params} float32 parameters)" in text
    workers = cfg["report"]["max_extrapolation_workers"]
    assert f"predicted (lines) up to {workers} workers" in text
    assert "up to 2 in this study" in text  # the run table's largest worker count
    assert "{{" not in text and "**" not in text and "``" not in text
    assert FIGURE_NAMES == FIGURES
    # the calibration figure's caption: the flat rule and the target's configured percent
    percent = cfg["training"]["target"]["value"]
    assert "improved its best validation loss by less than 2 % of the final best" in text
    assert f"(1 + {percent:g}/100) times the median of the calibration runs' best" in text


def _calibration_frames(val_loss=True):
    """runs and epochs of two calibration runs (r0 flat, r1 still improving in its last
    quarter) and two scaling runs that trained against the target 0.025."""
    rows, eps = [], []
    curves = {
        "r0": [0.5, 0.2, 0.1, 0.05, 0.03, 0.022, 0.0205, 0.0202, 0.0201, 0.0201, 0.0203, 0.0200],
        "r1": [0.5, 0.3, 0.2, 0.15, 0.1, 0.08, 0.06, 0.05, 0.04],
    }
    for k, curve in curves.items():
        rid = f"local_mpi_n1_w1_b75_lrnone_cal_{k}"
        rows.append(dict(run_id=rid, kind="cal", target_test_loss=math.nan))
        for e, v in enumerate(curve, start=1):
            eps.append(dict(run_id=rid, epoch=e, val_loss=v if val_loss else math.nan))
    for w in (1, 2):
        rid = f"local_mpi_n1_w{w}_b75_lrnone_r0"
        rows.append(dict(run_id=rid, kind="", target_test_loss=0.025))
        eps.append(dict(run_id=rid, epoch=1, val_loss=0.1))
    runs = pd.DataFrame(rows).assign(
        partition="local", backend="mpi", batch_per_worker=75, lr_rule="none", status="completed"
    )
    return runs, pd.DataFrame(eps)


def test_calibration_figure_shows_each_run_flat_or_not_and_the_target():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    from hvdscale.analysis.view import NoData
    from hvdscale.figures.registry import BY_NAME, in_section
    from hvdscale.figures.time_to_target import fig_calibration
    from hvdscale.target import FLAT_GAIN, last_quarter_gain

    assert BY_NAME["calibration"] in in_section("accuracy")  # the PDF report shows it there
    runs, epochs = _calibration_frames()
    gains = {
        rid: last_quarter_gain({"epochs": [{"val_loss": v} for v in g["val_loss"]]})
        for rid, g in epochs[epochs.run_id.str.contains("_cal_")].groupby("run_id")
    }
    assert [g < FLAT_GAIN for g in gains.values()] == [True, False]  # r0 flat, r1 not
    fig = fig_calibration(runs, None, epochs, None, {})
    (ax,) = fig.axes
    by_gid = {}
    for line in ax.get_lines():
        by_gid.setdefault(line.get_gid(), []).append(line)
    assert len(by_gid["best"]) == len(by_gid["val_loss"]) == len(gains) == 2
    assert len(by_gid["last_quarter"]) == 2
    assert all(line.get_drawstyle() == "steps-post" for line in by_gid["best"])
    # the best so far is the running minimum; its last-quarter part ends at the run's best
    r1 = epochs[epochs.run_id.str.endswith("cal_r1")]["val_loss"]
    assert list(by_gid["best"][1].get_ydata()) == list(r1.cummin())
    assert by_gid["last_quarter"][1].get_ydata()[-1] == r1.min()
    (target,) = by_gid["target"]
    assert set(target.get_ydata()) == {0.025}
    assert ax.get_yscale() == "log"
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    r0, r1_ = (f"{100 * g:.1f} %" for g in gains.values())
    assert any("cal r0" in t and r0 in t and ": flat)" in t for t in legend), legend
    assert any("cal r1" in t and r1_ in t and "NOT flat" in t for t in legend), legend
    assert any(t.startswith("target 0.025") for t in legend), legend
    assert fig.get_suptitle() == "1 of 2 flattened"
    plt.close(fig)
    # runs that trained against different targets: no target line, the title says so
    runs2 = runs.copy()
    runs2.loc[runs2.run_id.str.contains("_w2_"), "target_test_loss"] = 0.03
    fig = fig_calibration(runs2, None, epochs, None, {})
    assert not [x for x in fig.axes[0].get_lines() if x.get_gid() == "target"]
    assert "2 different targets" in fig.axes[0].get_title()
    plt.close(fig)
    # no calibration run (absolute target), or no finite validation loss: no figure
    with pytest.raises(NoData, match="no calibration runs"):
        fig_calibration(runs[runs.kind != "cal"], None, epochs, None, {})
    with pytest.raises(NoData, match="no finite validation loss"):
        fig_calibration(runs, None, None, None, {})
    runs3, epochs3 = _calibration_frames(val_loss=False)
    with pytest.raises(NoData, match="no finite validation loss"):
        fig_calibration(runs3, None, epochs3, None, {})


def test_report_date_comes_from_the_inputs(monkeypatch):
    from hvdscale.report.provenance import report_date

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    started = ["2024-06-01T10:00:00Z", "2024-06-01T12:00:00Z"]
    assert report_date(started) == "2024-06-01T12:00:00Z (start of the latest run)"
    assert report_date([]) == "no run records"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    assert report_date(started) == "2023-11-14 22:13 UTC (SOURCE_DATE_EPOCH)"


@needs_poppler
def test_report_shows_speedup_at_equal_accuracy_with_intervals(tmp_path):
    """A study with batch 75 and 1000, 3 repeats and a tuning sweep: the equal-accuracy
    table with 95 % intervals, the batch-question sentence and the tuning heat map."""
    import yaml

    from hvdscale.analysis.tuning import read_tuned

    raw = yaml.safe_load(CONFIG_FILE.read_text())
    raw["training"]["repeats"] = 3
    raw["scaling"]["sweeps"] = [
        {
            "name": "acc",
            "partitions": ["local"],
            "workers": [1, 2],
            "backends": ["gloo"],
            "batch_sizes": [75, 1000],
            "lr_rules": ["none"],
        }
    ]
    raw["scaling"]["tune"] = {
        "partitions": ["local"],
        "workers": [1, 2],
        "backends": ["gloo"],
        "batch_sizes": [75, 1000],
        "lr_multipliers": [0.5, 1, 2],
        "warmup_epochs": [0, 1],
        "repeats": 3,
    }
    cfg = validate_config(raw)
    F.write_study(tmp_path / "runs", cfg, train_samples=30000)
    ar = F.study_allreduce(tmp_path / "allreduce", cfg)
    out = pipeline(tmp_path, cfg, tmp_path / "runs", ar)
    selection_csv = tmp_path / "scaling" / "selection.csv"
    assert main(["select-tuned", "--runs", str(out["runs"]), "--out", str(selection_csv)]) == 0
    # the selected candidates' re-runs (fresh seeds) give the tuned figures, as the
    # select_tuned checkpoint requests them
    chosen = pd.read_csv(selection_csv, keep_default_na=False)
    assert F.write_reruns(tmp_path / "runs", cfg, chosen, 3, train_samples=30000)
    out = pipeline(tmp_path, cfg, tmp_path / "runs", ar)
    # the selection does not move with the re-runs; tuned.csv (aggregate) has their figures
    assert main(["select-tuned", "--runs", str(out["runs"]), "--out", str(selection_csv)]) == 0
    assert pd.read_csv(selection_csv, keep_default_na=False).equals(chosen)
    tuned = read_tuned(tmp_path / "scaling" / "tuned.csv")
    assert len(tuned) == 4
    text = pdf_text(out["report"])
    flat = " ".join(text.split())
    assert "Speedup at equal accuracy" in text
    assert "Time to target counts the training wall time from the start of training" in flat
    assert "Budget: every run" in flat
    assert "Batch 75 -> 1000 per worker" in flat
    assert "Learning-rate re-tuning" in text
    summary = read_summary(out["summary"])
    r = summary[summary.workers == 2].iloc[0]
    assert r.n_repeats == 3 and fmt.isnum(r.speedup_lo)
    # the interval as the tables print it
    assert f"[{fmt.speedup(r.speedup_lo)}{fmt.EN_DASH}{fmt.speedup(r.speedup_hi)}]" in text
    sel = tuned[(tuned.workers == 2) & tuned.speedup_ttt_lo.notna()]
    assert len(sel)
    t = sel.iloc[0]
    assert f"[{fmt.speedup(t.speedup_ttt_lo)}{fmt.EN_DASH}{fmt.speedup(t.speedup_ttt_hi)}]" in text
    check_plots(out["plots"])


def test_system_rows_per_partition_with_and_without_descriptions():
    """systems.csv: one row per partition; distinct values joined, nodes united; a record
    from before issue 13 still gives nodes, CPU model and MPI from its environment."""
    from hvdscale.analysis.systems import COLUMNS, csv_text, system_rows

    recs = [
        F._base_record(rid)
        for rid in (
            "alpha_nccl_n1_w2_b75_lrnone_r0",
            "alpha_nccl_n2_w4_b75_lrnone_r0",
            "local_gloo_n1_w1_b75_lrnone_r0",
        )
    ]
    for rec in recs[:2]:
        rec["system"] = F.synthetic_system(rec)
    recs[1]["system"]["errors"] = {"gpus": "TimeoutExpired: nvidia-smi"}
    # the cycle time each run had (auto: by placement); none set: Horovod's default
    recs[0]["config"]["horovod_env"] = {"HOROVOD_CPU_OPERATIONS": "mpi", "HOROVOD_CYCLE_TIME": "1"}
    recs[1]["config"]["horovod_env"] = {"HOROVOD_GPU_OPERATIONS": "NCCL"}
    recs[2]["config"]["horovod_env"] = {"HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_CYCLE_TIME": "1"}
    rows = system_rows(recs)
    assert [r["partition"] for r in rows] == ["alpha", "local"]
    alpha, local = rows
    assert (alpha["runs"], alpha["described"], local["described"]) == ("2", "2", "0")
    assert alpha["nodes"] == ", ".join(sorted(set(recs[1]["environment"]["hostnames"])))
    assert alpha["gpu_model"].startswith("NVIDIA ") and alpha["nccl"] == "2.18.5"
    assert alpha["interfaces"] == "ib0 (10.0.0.1), ib:mlx5_0"
    assert alpha["horovod_controllers"] == "mpi, gloo" and "TimeoutExpired" in alpha["errors"]
    assert local["cpu_model"] == recs[2]["environment"]["cpu_model"]
    assert local["mpi"] == "Open MPI 4.1.4" and local["gpu_model"] == ""
    assert alpha["horovod_cycle"] == "1 ms at 2 workers; Horovod's default at 4 workers"
    assert local["horovod_cycle"] == "1 ms at 1 worker"
    assert csv_text(rows).splitlines()[0] == ",".join(COLUMNS)
    assert csv_text(rows) == csv_text(system_rows(list(reversed(recs))))  # order-free
    # whether Gloo runs had the library: only Gloo runs that recorded it say so
    assert alpha["gloo_yield"] == "" and local["gloo_yield"] == ""
    recs[2]["config"]["gloo_epoll_yield"] = True
    recs[0]["config"]["gloo_epoll_yield"] = False  # an nccl run: not a Gloo run's fact
    assert [r["gloo_yield"] for r in system_rows(recs)] == ["", "yes"]
    recs[2]["config"]["gloo_epoll_yield"] = False
    assert system_rows(recs)[1]["gloo_yield"] == "no"
    # issue 32: the CPU kernel path where the records say it, '' where they do not
    assert alpha["cpu_kernels"] == ""
    recs[0]["system"]["cpu_kernels"] = "PyTorch: fp32 GEMM MKL 2024.2, Intel code path"
    assert system_rows(recs)[0]["cpu_kernels"] == "PyTorch: fp32 GEMM MKL 2024.2, Intel code path"


@needs_poppler
def test_report_has_a_system_description_per_partition(tmp_path):
    cfg = F.load_test_config("config.yaml", repeats=1)
    F.write_study(tmp_path / "runs", cfg)
    assert F.add_systems(tmp_path / "runs", skip=1) == len(run_table(cfg)) - 1
    out = pipeline(tmp_path, cfg, tmp_path / "runs", F.study_allreduce(tmp_path / "ar", cfg))
    systems = tmp_path / "scaling" / "systems.csv"
    assert (
        main(
            ["tabulate-systems", "--runs-dir", str(tmp_path / "runs")]
            + ["--runs", str(out["runs"]), "--out", str(systems)]
        )
        == 0
    )
    report = tmp_path / "with-systems.pdf"
    args = ["report", "--config-file", str(CONFIG_FILE), "--config", str(tmp_path / "config")]
    args[-1] += "/full.json"
    for k in ("runs", "summary", "status", "costmodel"):
        args += [f"--{k}", str(out[k])]
    args += ["--plots-dir", str(out["plots"]), "--systems", str(systems), "--out", str(report)]
    # each partition's preflight record (hvdscale preflight): one passed, one failed
    check = {"ok": True, "seconds": 0.1}
    passed = {
        "partition": "local",
        "ok": True,
        "node": "vm",
        "nodes": 1,
        "launcher": "mpirun",
        "seconds": 9.5,
        "checks": [
            {**check, "name": "gpus", "detail": "CPU partition: no GPU expected"},
            {**check, "name": "allreduce horovod-tf gloo", "detail": "153,441 float32 in 2.10 ms"},
        ],
    }
    failed = {
        **passed,
        "partition": "alpha",
        "ok": False,
        "emulated_gpus": True,
        "checks": [
            {
                **check,
                "name": "gpus",
                "ok": False,
                "detail": "node node1 declares GPUs of type a100, gpu_model says H100",
                "fix": "set scaling.partitions.alpha.gpu_model to the nodes' GPU (A100)",
            }
        ],
    }
    pre = []
    for rec in (passed, failed):
        pre.append(tmp_path / f"{rec['partition']}.json")
        pre[-1].write_text(json.dumps(rec))
    assert main([*args, "--preflight", *map(str, pre)]) == 0
    text = pdf_text(report)
    for needle in (
        "Preflight of partition alpha: failed at gpus",
        "emulated GPUs (CPU)",
        "declares GPUs of type a100",
        "Fix: set scaling.partitions.alpha.gpu_model",
        "Preflight of partition local: passed",
        "153,441 float32 in 2.10 ms",
    ):
        assert needle in " ".join(text.split()), needle
    assert main(args) == 0  # an archived study from before the preflight: none shown
    text = pdf_text(report)
    assert "Preflight" not in text
    n = len(run_table(cfg))
    for needle in (
        "System description",
        "System of partition local",
        f"({n} run(s); {n - 1} with a system description",
        "Generic x86-64",
        "Open MPI",
        "4.1.4",
        "eth0 (192.0.2.2)",
        "localhost1",
        "Network interfaces",
        "cuDNN",
    ):
        assert needle in text, needle
    assert "System description" not in pdf_text(out["report"])  # no --systems: no section


def test_a_table_header_follows_its_column_text_cells_left_numbers_right():
    """A column of text cells (Paragraphs, laid out left) has its header on the left too;
    a column of plain values right of align_right_from keeps a right-aligned header."""
    from hvdscale.report.doc import Doc

    d = Doc()
    d.table(
        "t",
        ["Check", "Result", "Seconds"],
        [[d.cell("data"), d.cell("ok"), "1.5"], [d.cell("env"), d.cell("failed"), "2.0"]],
        [30, 30, 30],
        keep=True,
    )
    from reportlab.platypus import Table

    (table,) = [f for k in d.story for f in getattr(k, "_content", [k]) if isinstance(f, Table)]
    heads = [c.style.name for c in table._cellvalues[0]]
    assert heads == ["cellhead", "cellhead", "cellhead_r"]


def test_the_report_leaves_out_figures_the_config_does_not_ask_for():
    """digits: an absolute target, no re-tuning sweep, one batch size: no calibration,
    re-tuning or batch figure in its report; the default study shows all of them."""
    from hvdscale.figures.registry import FIGURES, in_section
    from hvdscale.study.plan import merged_config

    def shown(cfg):
        return {f.name for s in ("results", "accuracy", "costmodel") for f in in_section(s, cfg)}

    default = merged_config([CONFIG_FILE])
    digits = merged_config([CONFIG_FILE, PROJECT_ROOT / "config" / "digits.yaml"])
    assert shown(default) == {f.name for f in FIGURES} == shown(None)
    left_out = {f.name for f in FIGURES} - shown(digits)
    assert left_out == {"calibration", "tune_heatmap", "epoch_time_batch"}
