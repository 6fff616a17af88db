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

from __future__ import annotations

import sys

from hvdscale.data.generate import tune_malloc
from hvdscale.data.physics import (
    add_data_config_argument,
    load_data_config,
)
from hvdscale.data.validate import CHECKS, validate_shard
from hvdscale.io import write_json_atomic


def add_arguments(p):
    add_data_config_argument(p)
    p.add_argument("--shard", required=True, help="generated HDF5 shard to validate")
    p.add_argument(
        "--out",
        required=True,
        help="validation report (JSON) written on success, e.g. PATH.validation.json",
    )


def run(args) -> int:
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
