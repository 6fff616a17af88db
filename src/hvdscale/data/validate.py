"""Validate a generated shard with pandera: every sample, every check.

The command line, with what it reads and writes in full, is ``hvdscale validate-shard``
(``add_arguments``/``run`` at the end of this module).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from hvdscale.config.load import config_hash
from hvdscale.data import h5
from hvdscale.data.check import sha256_file
from hvdscale.data.generate import tune_malloc
from hvdscale.data.physics import (
    NOISE_BOUND_SIGMAS,
    GeneratorParams,
    add_data_config_argument,
    load_data_config,
)
from hvdscale.errors import DataError
from hvdscale.io import write_json_atomic

VALIDATION_VERSION = 1
STRESS_REL_TOL = 1e-5  # float32 rounding of stress and labels
STRESS_ABS_TOL = 1e-3  # MPa
STRAIN_REL_TOL = 1e-6
BLOCK = 8192
MAX_IDS = 10

CHECKS = (
    "all_values_finite",
    "flag_in_0_1",
    "first_point_at_origin",
    "flag_consistent_with_strain_path",
    "strain_within_max_strain",
    "stress_within_physical_bound",
    "yield_stress_in_range",
    "hardening_modulus_in_range",
    "sample_id_in_range",
    "sample_id_unique",
    "sample_id_matches_shard",
)


def features_block(curves: np.ndarray, labels: np.ndarray, noise_std: float) -> dict:
    """Per-sample features of a block of curves (m, n_points, 3) and labels (m, 2)."""
    m = len(curves)
    ch = np.ascontiguousarray(curves.transpose(2, 0, 1))  # (3, m, P), one copy
    strain, stress, flag = ch[0], ch[1], ch[2]
    # a float64 sum is finite exactly when every (float32) term is: one cheap pass
    finite = np.isfinite(curves.reshape(m, -1).sum(axis=1, dtype=np.float64))
    finite &= np.isfinite(labels.sum(axis=1, dtype=np.float64))
    bad_flag = ((flag != 0) & (flag != 1)).sum(axis=1, dtype=np.int64)
    d = np.diff(strain, axis=1)
    f1 = flag[:, 1:]
    inconsistent = ((f1 == 1) & ~(d > 0)) | ((f1 == 0) & ~(d < 0))
    n_inconsistent = inconsistent.sum(axis=1, dtype=np.int64)
    first_ok = (strain[:, 0] == 0) & (flag[:, 0] == 1)
    abs_strain = np.fmax.reduce(np.abs(strain), axis=1)  # NaN-ignoring
    abs_stress = np.fmax.reduce(np.abs(stress), axis=1)
    sy = labels[:, 0].astype(np.float64)
    hh = labels[:, 1].astype(np.float64)
    bound = sy + hh * abs_strain.astype(np.float64)
    bound = bound * (1 + STRESS_REL_TOL) + NOISE_BOUND_SIGMAS * noise_std + STRESS_ABS_TOL
    excess = abs_stress.astype(np.float64) - bound
    return (
        {
            "all_finite": finite,
            "n_bad_flag": bad_flag,
            "first_point_ok": first_ok,
            "n_flag_inconsistent": n_inconsistent,
            "max_abs_strain": abs_strain.astype(np.float64),
            "stress_excess": excess,
            "yield_stress": sy,
            "hardening_modulus": hh,
        }
        if m
        else {}
    )


def shard_features(path: str | Path, n_points: int, noise_std: float, block: int = BLOCK):
    """Features of every sample of a shard, the sample ids and the file attributes."""
    info = h5.inspect_shard(path, n_points)
    parts: dict[str, list] = {}
    ids_parts = []
    for _a, curves, labels, ids in h5.iter_blocks(path, block, n_points):
        for k, v in features_block(curves, labels, noise_std).items():
            parts.setdefault(k, []).append(v)
        ids_parts.append(ids.copy())
    feats = {k: np.concatenate(v) for k, v in parts.items()}
    ids = np.concatenate(ids_parts) if ids_parts else np.empty(0, np.int64)
    return feats, ids, info


def build_schema(params: GeneratorParams, id_start: int, id_stop: int):
    """The pandera schema for the per-sample feature table (one row per sample)."""
    import pandera.pandas as pa

    lo32 = np.float32(params.label_min).astype(np.float64)
    hi32 = np.float32(params.label_max).astype(np.float64)
    strain_max = params.max_strain * (1 + STRAIN_REL_TOL)
    expected = np.arange(id_start, id_stop, dtype=np.int64)

    def matches(s):
        import pandas as pd

        v = s.to_numpy()
        ok = v == expected if len(v) == len(expected) else np.zeros(len(v), dtype=bool)
        return pd.Series(ok, index=s.index)

    def named(factory, *args, name):
        # ``error`` too: pandera reports built-in checks by their error string
        return factory(*args, name=name, error=name)

    C = pa.Check
    return pa.DataFrameSchema(
        {
            "sample_id": pa.Column(
                np.int64,
                checks=[
                    named(C.in_range, 0, params.n_samples - 1, name="sample_id_in_range"),
                    named(C, lambda s: ~s.duplicated(keep="first"), name="sample_id_unique"),
                    named(C, matches, name="sample_id_matches_shard"),
                ],
            ),
            "all_finite": pa.Column(bool, named(C.eq, True, name="all_values_finite")),
            "n_bad_flag": pa.Column(np.int64, named(C.eq, 0, name="flag_in_0_1")),
            "first_point_ok": pa.Column(bool, named(C.eq, True, name="first_point_at_origin")),
            "n_flag_inconsistent": pa.Column(
                np.int64, named(C.eq, 0, name="flag_consistent_with_strain_path")
            ),
            # NaN features (from non-finite input) are reported by all_values_finite
            "max_abs_strain": pa.Column(
                float, named(C.le, strain_max, name="strain_within_max_strain"), nullable=True
            ),
            "stress_excess": pa.Column(
                float, named(C.le, 0.0, name="stress_within_physical_bound"), nullable=True
            ),
            "yield_stress": pa.Column(
                float,
                named(C.in_range, lo32[0], hi32[0], name="yield_stress_in_range"),
                nullable=True,
            ),
            "hardening_modulus": pa.Column(
                float,
                named(C.in_range, lo32[1], hi32[1], name="hardening_modulus_in_range"),
                nullable=True,
            ),
        },
        strict=True,
        coerce=False,
        name="per-sample features",
    )


def _failures(err, ids: np.ndarray) -> dict[str, list[int]]:
    """{check name: first offending sample ids} from a pandera SchemaErrors."""
    fc = err.failure_cases
    out: dict[str, list[int]] = {}
    for check, group in fc.groupby("check", sort=False):
        rows = [int(i) for i in group["index"].dropna().tolist()]
        name = str(check)
        sid = sorted({int(ids[r]) for r in rows if 0 <= r < len(ids)})[:MAX_IDS]
        prev = out.setdefault(name, [])
        out[name] = sorted(set(prev) | set(sid))[:MAX_IDS]
    return out


def validate_features(
    feats: dict, ids: np.ndarray, params: GeneratorParams, id_start: int, id_stop: int
):
    """Validate the feature table; returns {} on success or {check: [sample ids]}."""
    import pandas as pd
    import pandera.errors as pe

    table = {"sample_id": ids}
    for k in (
        "all_finite",
        "n_bad_flag",
        "first_point_ok",
        "n_flag_inconsistent",
        "max_abs_strain",
        "stress_excess",
        "yield_stress",
        "hardening_modulus",
    ):
        table[k] = (
            feats[k]
            if len(ids)
            else np.empty(
                0,
                dtype=bool
                if k in ("first_point_ok", "all_finite")
                else (np.int64 if k.startswith("n_") else float),
            )
        )
    df = pd.DataFrame(table)  # default RangeIndex: row i is the i-th sample of the shard
    schema = build_schema(params, id_start, id_stop)
    try:
        schema.validate(df, lazy=True)
    except pe.SchemaErrors as err:
        fails = _failures(err, ids)
        return fails or {"schema": []}
    except pe.SchemaError as err:  # pragma: no cover - lazy=True reports SchemaErrors
        return {str(getattr(err, "check", "schema")): []}
    return {}


def validate_shard(cfg: dict, path: str | Path) -> dict:
    """Validate one generated shard; returns the report or raises DataError (naming the file)."""
    path = Path(path)
    t0 = time.perf_counter()
    params = GeneratorParams.from_config(cfg)
    feats, ids, info = shard_features(path, params.n_points, params.noise_std)
    t_feat = time.perf_counter()
    attrs = info["attrs"]
    problems = []
    if attrs.get("seed") != params.seed:
        problems.append(
            f"attribute seed {attrs.get('seed')!r} differs from the config's seed {params.seed}"
        )
    if attrs.get("generator_json") != params.to_json():
        problems.append(
            "generator parameters (attribute generator_json) differ from the config's; "
            "regenerate the shard"
        )
    for k in ("id_start", "id_stop"):
        if not isinstance(attrs.get(k), int):
            problems.append(f"attribute {k} missing (not a generated raw shard)")
    if problems:
        raise DataError(f"{path}: " + "; ".join(problems))
    id_start, id_stop = attrs["id_start"], attrs["id_stop"]
    fails = validate_features(feats, ids, params, id_start, id_stop)
    t_val = time.perf_counter()
    if fails:
        detail = "; ".join(
            f"{check} (sample_id {', '.join(map(str, sids)) if sids else '?'})"
            for check, sids in fails.items()
        )
        raise DataError(f"{path}: validation failed: {len(fails)} check(s): {detail}")
    st = path.stat()
    digest = sha256_file(path)
    t_end = time.perf_counter()
    return {
        "validation_version": VALIDATION_VERSION,
        "passed": True,
        "shard_file": path.name,
        "shard_path": str(path),
        "bytes": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "sha256": digest,
        "format_version": attrs.get("format_version"),
        "seed": params.seed,
        "data_config_hash": config_hash(cfg),
        "generator": params.as_dict(),
        "id_start": id_start,
        "id_stop": id_stop,
        "n_samples": int(len(ids)),
        "checks": list(CHECKS),
        "summary": {
            "max_abs_strain": float(feats["max_abs_strain"].max()) if len(ids) else None,
            "max_stress_excess_MPa": float(feats["stress_excess"].max()) if len(ids) else None,
        },
        "seconds": {
            "features": round(t_feat - t0, 3),
            "pandera": round(t_val - t_feat, 3),
            "sha256": round(t_end - t_val, 3),
            "total": round(t_end - t0, 3),
        },
    }


# -------------------------------------------------- the command: hvdscale validate-shard


def add_arguments(p):
    add_data_config_argument(p)
    p.add_argument("--shard", required=True, help="generated HDF5 shard to validate")
    p.add_argument(
        "--out",
        required=True,
        help="validation report (JSON) written on success, e.g. PATH.validation.json",
    )


def run(args) -> int:
    """Validate a generated shard with pandera: every sample, every check.

    Each curve is reduced with vectorised numpy to per-sample features (whether all values
    are finite, the counts of flag values outside {0, 1} and of points whose flag
    contradicts the strain path, the largest strain, the stress excess over the physical
    bound, the labels, the sample id), and that per-sample table is validated with a
    pandera schema (lazy, so every failed check is reported). Checks:

      all_values_finite                  curves and labels contain no NaN/inf
      flag_in_0_1                        the flag channel is 0 or 1
      first_point_at_origin              point 0 has strain 0 and flag 1
      flag_consistent_with_strain_path   strain rises on loading points (flag 1) and falls
                                         on unloading points (flag 0)
      strain_within_max_strain           |strain| <= data.physics.max_strain
      stress_within_physical_bound       |stress| <= sigma_y + H max|strain| + 6 noise_std (+ tol);
                                         the model's noise is below 5.77 noise_std by construction
      yield_stress_in_range, hardening_modulus_in_range   labels within the configured ranges
      sample_id_in_range, sample_id_unique, sample_id_matches_shard   ids are the shard's range

    On success the report is written (atomically) to --out; on failure the command exits
    with status 2 naming the file, the failed checks and the first offending sample ids,
    and writes nothing.

    Example:
      hvdscale validate-shard --config results/config/data.json \
      --shard results/data/raw/shard-0000.h5 --out results/data/raw/shard-0000.validation.json
    """
    tune_malloc()
    cfg = load_data_config(args.config)
    report = validate_shard(cfg, args.shard)
    write_json_atomic(args.out, report)
    print(
        f"validate-shard: {args.shard}: {report['n_samples']} samples passed {len(CHECKS)} checks "
        f"in {report['seconds']['total']:.1f} s",
        file=sys.stderr,
    )
    return 0
