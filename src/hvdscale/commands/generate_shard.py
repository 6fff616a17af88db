"""Generate one shard of synthetic stress-strain curves (HDF5).

Shard K of data.n_shards holds the contiguous sample ids [K*n//S, (K+1)*n//S). Each
curve comes from 1-D elasto-plasticity with linear isotropic hardening (return mapping)
along a loading/unloading strain path; see hvdscale.data.physics for the model and its
conventions. Sample i depends only on (seed, i): the shard count, the block size and the
machine do not change any value. The file is written atomically (temporary file, then
rename).

Example:
  hvdscale generate-shard --config results/config/data.json --shard 0 \
      --out results/data/raw/shard-0000.h5
"""

from __future__ import annotations

import sys

from hvdscale.data.generate import DEFAULT_BLOCK, generate_shard, shard_range, tune_malloc
from hvdscale.data.physics import (
    add_data_config_argument,
    load_data_config,
)


def add_arguments(p):
    add_data_config_argument(p)
    p.add_argument(
        "--shard", required=True, type=int, help="generation shard index K, 0 <= K < data.n_shards"
    )
    p.add_argument(
        "--out", required=True, help="output HDF5 file, e.g. results/data/raw/shard-0000.h5"
    )
    p.add_argument(
        "--block",
        type=int,
        default=DEFAULT_BLOCK,
        help=f"samples generated per vectorised block (memory/speed only; default {DEFAULT_BLOCK})",
    )


def run(args) -> int:
    tune_malloc()
    cfg = load_data_config(args.config)

    def progress(msg):
        print(f"generate-shard {args.shard}: {msg}", file=sys.stderr, flush=True)

    ids = shard_range(cfg["data"]["n_samples"], cfg["data"]["n_shards"], args.shard)
    progress(f"generating sample ids {ids}")
    info = generate_shard(cfg, args.shard, args.out, block=args.block, progress=progress)
    progress(f"wrote {info['n_samples']} curves to {args.out} in {info['seconds']:.1f} s")
    return 0
