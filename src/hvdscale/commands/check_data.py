"""Check a data directory against its manifest.json (files, datasets, counts, checksums).

Verifies that every shard listed in the manifest exists, is a readable HDF5 file with
the contract's datasets, dtypes and shapes, holds the recorded number of samples and
sample id range with the manifest's seed and format version, and that the counts add
up; with --verify-checksums also the sha256 of every file. Any problem is an error
naming the file.

The functions here import only numpy, h5py and json, so training (train env, numpy
1.26, no pandas) uses them to find and verify its shards before reading them with
hvdscale.data.h5.read_shards.

Example:
  hvdscale check-data --data-dir results/data --verify-checksums
"""

from __future__ import annotations

import sys

from hvdscale.data.check import SPLITS, verify_data_dir


def add_arguments(p):
    p.add_argument(
        "--data-dir", required=True, help="data directory holding manifest.json, e.g. results/data"
    )
    p.add_argument(
        "--verify-checksums",
        action="store_true",
        help="also compare the sha256 of every shard with the manifest (reads every byte)",
    )


def run(args) -> int:
    m = verify_data_dir(args.data_dir, verify_checksums=args.verify_checksums)
    c = m["counts"]
    what = "datasets, counts and checksums" if args.verify_checksums else "datasets and counts"
    print(
        f"{args.data_dir}: {what} OK: {c['train']} train + {c['val']} val + {c['test']} test "
        f"samples in {' + '.join(str(len(m['shards'][s])) for s in SPLITS)} shards",
        file=sys.stderr,
    )
    return 0
