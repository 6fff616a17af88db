"""Partitions whose GPUs the train env's TensorFlow 2.15 cannot use (issue 20, item 3):
K80 (compute capability 3.7, the thesis's gpu2) needs CUDA 11, TF 2.15 is built against
CUDA 12 (>= 5.0). `hvdscale plan`, Snakemake's start banner and the report's overview
say so and what to do instead, before anything is submitted."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd

from hvdscale.report.overview import title_section
from hvdscale.slurm.gpu_support import compute_capability, gpu_support_notes
from hvdscale.study.plan import format_plan, merged_config, plan

ROOT = Path(__file__).resolve().parents[1]
THESIS = ROOT / "config" / "thesis.yaml"


def thesis() -> dict:
    return merged_config([THESIS])


def test_compute_capability_of_gpu_models():
    assert compute_capability("K80") == 3.7 and compute_capability("Tesla K80") == 3.7
    assert compute_capability("A100") == 8.0 and compute_capability("a100-sxm4") == 8.0
    assert compute_capability("") is None and compute_capability("MI250") is None


def test_thesis_gpu2_is_named_with_what_to_do_instead(tmp_path):
    cfg = thesis()
    notes = gpu_support_notes(cfg)
    assert len(notes) == 1, notes  # gpu2 only: alpha (A100) and hpdlf are fine
    note = notes[0]
    assert note.startswith("Partition gpu2 (K80, compute capability 3.7)")
    assert "TensorFlow 2.15" in note and "CUDA 12" in note and ">= 5.0" in note
    assert "CUDA-11 TensorFlow" in note and "environment:" in note
    assert "partition=gpu2" in note and "drop gpu2 from the sweeps" in note
    text = format_plan(plan(cfg, tmp_path))
    assert f"  ! {note}" in text.splitlines()
    banner = format_plan(plan(cfg, tmp_path), short=True)  # Snakemake's start banner
    assert note in banner


def test_no_note_when_gpu2_is_not_swept_and_a_hint_for_other_deployments():
    cfg = thesis()
    for sweep in cfg["scaling"]["sweeps"]:
        sweep["partitions"] = [p for p in sweep["partitions"] if p != "gpu2"]
    assert gpu_support_notes(cfg) == []
    cfg = copy.deepcopy(thesis())
    cfg["environment"]["deployment"] = "conda"
    (note,) = gpu_support_notes(cfg)
    assert "unless environment: (deployment conda) gives it a CUDA-11 build" in note


def test_hvdscale_plan_cli_says_it():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-m", "hvdscale.cli", "plan", str(THESIS)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "! Partition gpu2 (K80, compute capability 3.7) cannot run" in out.stdout


class _Doc:
    def __init__(self):
        self.paragraphs = []

    def p(self, text, style=None):
        self.paragraphs.append(text)

    def table(self, *args, **kwargs):
        pass


def test_report_overview_says_it():
    status = pd.DataFrame({"partition": ["gpu2", "alpha"], "status": ["missing", "completed"]})
    info = {"config_file": "config/thesis.yaml", "report_date": "2026-11-24"}
    d = _Doc()
    title_section(d, SimpleNamespace(info=info, status=status, cfg=thesis()))
    assert any(p.startswith("Partition gpu2 (K80") for p in d.paragraphs), d.paragraphs
    d = _Doc()
    title_section(d, SimpleNamespace(info=info, status=status, cfg=None))
    assert not any("K80" in p for p in d.paragraphs)


def test_torch_ddp_on_a_gpu_partition_says_the_cpu_build_and_the_unmeasured_nccl_path():
    from hvdscale.slurm.gpu_support import gpu_support_notes

    parts = {
        "alpha": {"gpus_per_node": 8, "gpu_model": "A100", "cores_per_node": 48},
        "local": {"gpus_per_node": 0, "cores_per_node": 2},
    }
    sweep = {"partitions": ["alpha", "local"], "frameworks": ["horovod-tf", "torch-ddp"]}
    cfg = {"scaling": {"partitions": parts, "sweeps": [sweep]}}
    (note,) = gpu_support_notes(cfg)
    assert "alpha" in note and "local" not in note
    assert "CPU build" in note and "unmeasured" in note
    sweep["frameworks"] = ["horovod-tf"]
    assert gpu_support_notes(cfg) == []
