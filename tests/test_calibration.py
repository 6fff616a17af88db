"""The study's target validation loss (rule calibrate_target, hvdscale calibrate-target)."""

import copy
import json
from pathlib import Path

import pytest
import yaml

from hvdscale.cli import main as cli_main
from hvdscale.config.load import validate_config
from hvdscale.errors import UserError
from hvdscale.matrix.runkinds import target_config
from hvdscale.matrix.runtable import calibration_runs
from hvdscale.target import best_val_loss, calibrate_target, read_target

ROOT = Path(__file__).resolve().parents[1]


def _cfg(**target) -> dict:
    raw = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    raw["training"]["target"] = {**raw["training"]["target"], **target}
    return validate_config(raw)


def _record(run_id: str, val_losses, best=None, status="completed") -> dict:
    rec = {
        "run_id": run_id,
        "status": status,
        "error": None if status == "completed" else "boom",
        "epochs": [{"epoch": i, "val_loss": v} for i, v in enumerate(val_losses)],
    }
    if best is not None:
        rec["target"] = {"best_val_loss": best}
    return rec


def _records(cfg, losses) -> dict:
    ids = [r.run_id for r in calibration_runs(cfg)]
    return {rid: _record(rid, eps) for rid, eps in zip(ids, losses)}


def test_calibrated_target_is_percent_above_the_median_best_loss():
    cfg = _cfg(value=10)
    recs = _records(cfg, [[0.5, 0.2, 0.3], [0.4, 0.1], [0.9, 0.6, 0.4]])
    tgt = calibrate_target(cfg, recs)
    assert tgt["mode"] == "calibrated" and tgt["percent"] == 10
    assert tgt["best_val_losses"] == [0.2, 0.1, 0.4]
    assert tgt["median_best_val_loss"] == 0.2
    assert tgt["value"] == pytest.approx(0.22)
    assert tgt["calibration_runs"] == [r.run_id for r in calibration_runs(cfg)]


def test_the_target_says_whether_the_calibration_runs_had_flattened():
    """Issue 30: the last quarter of each calibration run's epochs either still improved
    its best validation loss (the budget was too short: the target is looser than the
    runs can reach) or not; target.json keeps the gains and describe() says which."""
    from hvdscale.target import describe, last_quarter_gain

    flat = [1.0, 0.5, 0.3, 0.25, 0.2, 0.2, 0.199, 0.2]  # last quarter: 0.199 vs 0.2
    steep = [1.0, 0.8, 0.6, 0.5, 0.4, 0.35, 0.3, 0.25]  # last quarter: 0.25 vs 0.35
    assert last_quarter_gain(_record("x", flat)) == pytest.approx(0.001 / 0.199)
    assert last_quarter_gain(_record("x", steep)) == pytest.approx(0.1 / 0.25)
    assert last_quarter_gain(_record("x", [0.3, 0.2, 0.1])) is None  # too short to say
    cfg = _cfg(value=10)
    tgt = calibrate_target(cfg, _records(cfg, [flat, flat, flat]))
    assert tgt["last_quarter_gains"] == pytest.approx([0.001 / 0.199] * 3)
    assert "had flattened: the last quarter of their epochs improved" in describe(tgt)
    assert tgt["calibration_epochs"] == [8, 8, 8] and "trained 8, 8, 8 epochs" in describe(tgt)
    tgt = calibrate_target(cfg, _records(cfg, [flat, steep, flat[:6]]))
    assert tgt["calibration_epochs"] == [8, 8, 6] and "trained 8, 8, 6 epochs" in describe(tgt)
    assert "had NOT flattened" in describe(tgt) and "40.0 %" in describe(tgt)


def test_record_target_best_loss_wins_and_nan_epochs_are_skipped():
    assert best_val_loss(_record("x", [0.3, 0.2], best=0.15)) == 0.15
    assert best_val_loss(_record("x", [float("nan"), 0.25, None])) == 0.25
    assert best_val_loss(_record("x", [])) is None


def test_absolute_target_needs_no_runs():
    cfg = _cfg(mode="absolute", value=0.07)
    tgt = calibrate_target(cfg, {})
    assert tgt == {
        "mode": "absolute",
        "value": 0.07,
        "percent": None,
        "calibration_runs": [],
        "best_val_losses": [],
        "median_best_val_loss": None,
    }


@pytest.mark.parametrize("problem", ["missing", "failed", "no_val_loss"])
def test_a_bad_calibration_run_is_an_error_naming_it(problem):
    cfg = _cfg()
    recs = _records(cfg, [[0.3], [0.2], [0.25]])
    victim = sorted(recs)[1]
    if problem == "missing":
        del recs[victim]
    elif problem == "failed":
        recs[victim] = _record(victim, [0.1], status="failed")
    else:
        recs[victim] = _record(victim, [float("nan")])
    with pytest.raises(UserError, match=victim):
        calibrate_target(cfg, recs)


def test_cli_writes_target_json_from_the_target_slice(tmp_path, capsys):
    cfg = _cfg(value=5)
    conf = tmp_path / "target-config.json"
    conf.write_text(json.dumps(target_config(cfg)))
    paths = []
    for rid, rec in _records(cfg, [[0.4], [0.2], [0.3]]).items():
        p = tmp_path / "runs" / rid / "metrics.json"
        p.parent.mkdir(parents=True)
        p.write_text(json.dumps(rec))
        paths.append(str(p))
    out = tmp_path / "target.json"
    argv = ["calibrate-target", "--config", str(conf), "--records", *paths, "--out", str(out)]
    assert cli_main(argv) == 0
    tgt = read_target(out)
    assert tgt["value"] == pytest.approx(1.05 * 0.3)
    # one record short: exit 2, one line naming the run, no output
    out.unlink()
    assert cli_main([*argv[:-3], *paths[:2], "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert calibration_runs(cfg)[2].run_id in err and "Traceback" not in err
    assert not out.exists()


def test_read_target_rejects_a_non_target_file(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"mode": "absolute"}))
    with pytest.raises(UserError, match=str(p)):
        read_target(p)
    with pytest.raises(UserError, match="not found"):
        read_target(tmp_path / "missing.json")


def test_target_slice_of_absolute_mode_keeps_only_the_loss():
    cfg = _cfg(mode="absolute", value=0.05)
    other = copy.deepcopy(cfg)
    other["training"]["target"]["calibration"]["seeds"] = 7
    assert target_config(other) == target_config(cfg)
    assert calibrate_target(validate_config(target_config(cfg)), {})["value"] == 0.05
