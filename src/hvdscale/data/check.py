"""Check a data directory against its manifest.json (files, datasets, counts, checksums)."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from hvdscale.data import h5
from hvdscale.errors import DataError
from hvdscale.io import read_json_object

MANIFEST_NAME = "manifest.json"
# 2: the validation split (shards.val, counts.val; issue 16)
MANIFEST_VERSION = 2
SPLITS = ("train", "val", "test")
_REQUIRED = (
    "manifest_version",
    "format_version",
    "seed",
    "n_points",
    "counts",
    "shards",
    "normalisation",
)


def shard_name(index: int) -> str:
    """File name of split shard ``index``: shard-NNNN.h5."""
    return f"shard-{index:04d}.h5"


def sha256_file(path: str | Path, bufsize: int = 1 << 22) -> str:
    """Hex sha256 of a file, read in 4 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(bufsize):
            h.update(chunk)
    return h.hexdigest()


def load_manifest(data_dir: str | Path) -> dict:
    """Read and structurally check ``data_dir/manifest.json``; DataError if absent or malformed."""
    path = Path(data_dir) / MANIFEST_NAME
    m = read_json_object(path, missing="not found (run the data stage: hvdscale split-dataset)")
    missing = [k for k in _REQUIRED if k not in m]
    if missing:
        raise DataError(f"{path}: key(s) {', '.join(missing)} missing")
    if m["manifest_version"] != MANIFEST_VERSION:
        raise DataError(
            f"{path}: manifest_version {m['manifest_version']!r}; expected {MANIFEST_VERSION}"
        )
    if m["format_version"] != h5.FORMAT_VERSION:
        raise DataError(
            f"{path}: format_version {m['format_version']!r}; expected {h5.FORMAT_VERSION}"
        )
    for s in SPLITS:
        entries = m["shards"].get(s) if isinstance(m["shards"], dict) else None
        if not isinstance(entries, list) or not entries:
            raise DataError(f"{path}: shards.{s} missing or empty")
        for i, e in enumerate(entries):
            for k in ("file", "n_samples", "first_sample_id", "last_sample_id", "sha256", "bytes"):
                if k not in e:
                    raise DataError(f"{path}: shards.{s}[{i}] has no key {k!r}")
        total = sum(int(e["n_samples"]) for e in entries)
        if total != m["counts"].get(s):
            raise DataError(
                f"{path}: shards.{s} hold {total} samples; counts.{s} says {m['counts'].get(s)}"
            )
    if sum(m["counts"].get(s, 0) for s in SPLITS) != m["counts"].get("total"):
        raise DataError(f"{path}: counts train + val + test != total ({m['counts']})")
    return m


def shard_paths(data_dir: str | Path, split: str, manifest: dict | None = None) -> list[Path]:
    """Paths of the split's shards in manifest order (ascending sample ids)."""
    if split not in SPLITS:
        raise DataError(f"split {split!r}: expected one of {', '.join(SPLITS)}")
    manifest = manifest if manifest is not None else load_manifest(data_dir)
    return [Path(data_dir) / e["file"] for e in manifest["shards"][split]]


def verify_shard(
    data_dir: str | Path, entry: dict, manifest: dict, verify_checksum: bool = False
) -> None:
    """Check one manifest shard entry against its file (DataError naming the file)."""
    path = Path(data_dir) / entry["file"]
    if not path.is_file():
        raise DataError(f"{path}: listed in {Path(data_dir) / MANIFEST_NAME} but missing")
    size = path.stat().st_size
    if size != entry["bytes"]:
        raise DataError(
            f"{path}: {size} bytes; the manifest records {entry['bytes']} (truncated or replaced)"
        )
    with h5.open_h5(path) as fh:
        n = h5.check_layout(fh, path, manifest["n_points"])
        if n != entry["n_samples"]:
            raise DataError(f"{path}: {n} samples; the manifest records {entry['n_samples']}")
        seed = h5._decode(fh.attrs["seed"])
        if seed != manifest["seed"]:
            raise DataError(f"{path}: seed {seed}; the manifest records {manifest['seed']}")
        if n:
            ids = fh["sample_id"]
            first, last = int(ids[0]), int(ids[n - 1])
            if (first, last) != (entry["first_sample_id"], entry["last_sample_id"]):
                raise DataError(
                    f"{path}: sample ids {first}..{last}; the manifest records "
                    f"{entry['first_sample_id']}..{entry['last_sample_id']}"
                )
    if verify_checksum and sha256_file(path) != entry["sha256"]:
        raise DataError(f"{path}: sha256 differs from the manifest (file corrupt or replaced)")


def verify_data_dir(
    data_dir: str | Path,
    verify_checksums: bool = False,
    splits: Iterable[str] = SPLITS,
    indices: dict[str, Sequence[int]] | None = None,
) -> dict:
    """Verify the data directory (or only ``indices[split]`` shards); returns the manifest."""
    manifest = load_manifest(data_dir)
    for s in splits:
        entries = manifest["shards"][s]
        chosen = range(len(entries)) if not indices or s not in indices else indices[s]
        for i in chosen:
            if not 0 <= i < len(entries):
                raise DataError(f"{Path(data_dir) / MANIFEST_NAME}: {s} has no shard {i}")
            verify_shard(data_dir, entries[i], manifest, verify_checksums)
    return manifest


def normalisation(manifest: dict) -> dict[str, np.ndarray]:
    """Train-split statistics as float32 arrays.

    curve_mean/curve_std (3,), label_mean/label_std (2,).
    """
    nm = manifest["normalisation"]
    return {
        "curve_mean": np.asarray(nm["curves"]["mean"], dtype=np.float32),
        "curve_std": np.asarray(nm["curves"]["std"], dtype=np.float32),
        "label_mean": np.asarray(nm["labels"]["mean"], dtype=np.float32),
        "label_std": np.asarray(nm["labels"]["std"], dtype=np.float32),
    }


# -------------------------------------------------- the command: hvdscale check-data


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
    m = verify_data_dir(args.data_dir, verify_checksums=args.verify_checksums)
    c = m["counts"]
    what = "datasets, counts and checksums" if args.verify_checksums else "datasets and counts"
    print(
        f"{args.data_dir}: {what} OK: {c['train']} train + {c['val']} val + {c['test']} test "
        f"samples in {' + '.join(str(len(m['shards'][s])) for s in SPLITS)} shards",
        file=sys.stderr,
    )
    return 0
