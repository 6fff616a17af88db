"""Partitions whose GPUs the train env's TensorFlow 2.15 cannot use: K80 (compute
capability 3.7, the thesis's gpu2) needs CUDA 11, TF 2.15 is built against CUDA 12 (>= 5.0).
With the pinned train env the config check refuses a sweep over such a partition (`hvdscale
plan`, `snakemake -n`), naming it, its compute capability and the way out; with the site's
own stack `hvdscale plan`, Snakemake's start banner and the report's overview say what it
needs, before anything is submitted."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import yaml

from hvdscale.errors import ConfigError
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


GPU2_SWEEP = {
    "name": "workers",
    "partitions": ["alpha", "gpu2"],
    "workers": [1, 2],
    "backends": ["nccl"],
    "batch_sizes": [75],
    "lr_rules": ["none"],
}


def with_gpu2(tmp_path, environment: dict | None = None) -> Path:
    """An overlay of config/thesis.yaml that sweeps gpu2 (K80), with ``environment``."""
    overlay = {"scaling": {"sweeps": [GPU2_SWEEP]}}
    if environment:
        overlay["environment"] = environment
    path = tmp_path / "gpu2.yaml"
    path.write_text(yaml.safe_dump(overlay))
    return path


def test_thesis_plans_no_gpu2(tmp_path):
    cfg = thesis()
    assert gpu_support_notes(cfg) == []
    assert "gpu2" in cfg["scaling"]["partitions"]  # kept, for the commented CUDA-11 route
    assert not any("gpu2" in s["partitions"] for s in cfg["scaling"]["sweeps"])
    assert "gpu2" not in format_plan(plan(cfg, tmp_path))


def test_a_k80_sweep_with_the_pinned_train_env_is_refused_naming_it_and_the_way_out(tmp_path):
    for env in (None, {"deployment": "conda"}):  # .venv-train, the project's conda env
        with pytest.raises(ConfigError) as exc:
            merged_config([THESIS, with_gpu2(tmp_path, env)])
        msg = str(exc.value)
        assert "config key scaling.partitions.gpu2.gpu_model: K80 has compute capability 3.7" in msg
        assert "TensorFlow 2.15.1 (CUDA 12) needs >= 5.0" in msg
        assert "drop gpu2 from scaling.sweeps" in msg and "select" in msg
        assert "CUDA-11 TensorFlow (<= 2.11)" in msg and "env-modules" in msg
        assert "alpha" not in msg.split("gpu_model:")[1]  # A100 is fine
    # leaving gpu2 out with select: nothing runs on it, nothing refused
    cfg = merged_config([THESIS, with_gpu2(tmp_path)], select="partition=alpha")
    assert gpu_support_notes(cfg) == []


def test_hvdscale_plan_refuses_it(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-m", "hvdscale.cli", "plan", str(THESIS), str(with_gpu2(tmp_path))],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode != 0, out.stdout
    assert "gpu2.gpu_model: K80 has compute capability 3.7" in out.stderr
    assert "Traceback" not in out.stderr


def test_the_sites_own_stack_may_run_it_and_plan_says_what_it_needs(tmp_path):
    own = {"deployment": "env-modules", "modules": ["TensorFlow/2.6.0-CUDA-11.3.1"]}
    cfg = merged_config([THESIS, with_gpu2(tmp_path, own)])
    (note,) = gpu_support_notes(cfg)
    assert note.startswith("Partition gpu2 (K80, compute capability 3.7)")
    assert "unless environment: (deployment env-modules) gives it a CUDA-11 build" in note
    assert f"  ! {note}" in format_plan(plan(cfg, tmp_path)).splitlines()
    assert note in format_plan(plan(cfg, tmp_path), short=True)  # Snakemake's start banner
    conda = {"deployment": "conda", "conda_env": "envs/site-cuda11.yaml"}
    cfg = merged_config([THESIS, with_gpu2(tmp_path, conda)])
    assert len(gpu_support_notes(cfg)) == 1


class _Doc:
    def __init__(self):
        self.paragraphs = []

    def p(self, text, style=None):
        self.paragraphs.append(text)

    def table(self, *args, **kwargs):
        pass


def test_report_overview_says_it(tmp_path):
    status = pd.DataFrame({"partition": ["gpu2", "alpha"], "status": ["missing", "completed"]})
    info = {"config_file": "config/thesis.yaml", "report_date": "2026-11-24"}
    own = {"deployment": "env-modules", "modules": ["TensorFlow/2.6.0-CUDA-11.3.1"]}
    cfg = merged_config([THESIS, with_gpu2(tmp_path, own)])
    d = _Doc()
    title_section(d, SimpleNamespace(info=info, status=status, cfg=cfg))
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
