"""Split validated shards into train/val/test HDF5 shards, manifest.json and validation.json.

Refuses to run unless every input shard has a passing validation report that matches it
(same file: name, size and modification time, or else the same sha256; same seed and
generator parameters) and the shards cover the sample ids 0..n-1 exactly once.

Each sample's split comes from one uniform u hashed from (seed, sample id)
(hvdscale.data.physics.split_assign): u < train_fraction x val_fraction: validation;
u < train_fraction: train; else test. So the split does not depend on the shard layout,
and the validation split is val_fraction of the train share. Each split is written as
data.split_shards.{train,val,test} files
``OUTDIR/{train,val,test}/shard-NNNN.h5`` holding consecutive runs of the split's samples in
ascending sample id (shard sizes differ by at most one), in the same layout and with the
same attributes as the generated shards. ``OUTDIR/manifest.json`` records counts, sha256
checksums, the generator parameters and normalisation statistics of the train split
(per-channel and per-label mean and std); ``OUTDIR/validation.json`` summarises the shard
validations. Input is streamed block by block (memory stays small for 1M curves), and
nothing is renamed into place unless every file was written.

Example:
  hvdscale split-dataset --config results/config/data.json \
      --shards results/data/raw/shard-*.h5 --validations results/data/raw/*.validation.json \
      --outdir results/data
"""

from __future__ import annotations

import sys

from hvdscale.data.generate import tune_malloc
from hvdscale.data.physics import (
    add_data_config_argument,
    load_data_config,
)
from hvdscale.data.split import SPLITS, default_workers, split_dataset


def add_arguments(p):
    add_data_config_argument(p)
    p.add_argument("--shards", required=True, nargs="+", help="all generated HDF5 shards")
    p.add_argument(
        "--validations",
        required=True,
        nargs="+",
        help="their validation reports (hvdscale validate-shard), in any order",
    )
    p.add_argument("--outdir", required=True, help="output directory, e.g. results/data")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes writing output shards in parallel (default: the CPUs this process may use, "
        "at most 4); the output does not depend on it",
    )


def run(args) -> int:
    tune_malloc()
    cfg = load_data_config(args.config)

    def progress(msg):
        print(f"split-dataset: {msg}", file=sys.stderr, flush=True)

    workers = args.workers if args.workers else default_workers()
    m = split_dataset(
        cfg, args.shards, args.validations, args.outdir, progress=progress, workers=workers
    )
    c = m["counts"]
    progress(
        f"{args.outdir}: {c['train']} train / {c['val']} val / {c['test']} test samples in "
        f"{' + '.join(str(len(m['shards'][s])) for s in SPLITS)} shards"
    )
    return 0
