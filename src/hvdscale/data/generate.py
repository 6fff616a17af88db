"""Generate one shard of synthetic stress-strain curves (HDF5).

The command line, with what it reads and writes in full, is ``hvdscale generate-shard``
(``add_arguments``/``run`` at the end of this module).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from hvdscale.data import h5
from hvdscale.data.physics import (
    GeneratorParams,
    add_data_config_argument,
    generate_block,
    load_data_config,
)
from hvdscale.errors import UserError
from hvdscale.io import atomic_path

DEFAULT_BLOCK = 4096


def tune_malloc() -> bool:
    """Let glibc keep freed memory for reuse instead of unmapping it after every block.

    The vectorised blocks allocate tens of MB of temporaries; with glibc's defaults
    each block page-faults them in again (about a third of the generation time).
    Process-wide; a no-op where mallopt is unavailable.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(
            libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 1 << 30)
        )
    except (OSError, AttributeError):
        return False


def shard_range(n_samples: int, n_shards: int, shard: int) -> tuple[int, int]:
    """Sample ids [start, stop) of generation shard ``shard`` of ``n_shards``."""
    if not 0 <= shard < n_shards:
        raise UserError(f"--shard {shard}: expected 0 <= shard < data.n_shards ({n_shards})")
    return shard * n_samples // n_shards, (shard + 1) * n_samples // n_shards


def raw_shard_attrs(
    params: GeneratorParams, shard: int, n_shards: int, start: int, stop: int
) -> dict:
    attrs = h5.common_attrs(params)
    attrs.update(
        {
            "kind": "raw",
            "shard_index": shard,
            "n_shards": n_shards,
            "id_start": start,
            "id_stop": stop,
        }
    )
    return attrs


def generate_shard(
    cfg: dict, shard: int, out: str | Path, block: int = DEFAULT_BLOCK, progress=None
) -> dict:
    """Generate shard ``shard`` of the data-section config ``cfg`` into ``out`` (atomically)."""
    params = GeneratorParams.from_config(cfg)
    d = cfg["data"]
    n_shards = int(d["n_shards"])
    start, stop = shard_range(params.n_samples, n_shards, shard)
    n = stop - start
    if n == 0:
        raise UserError(
            f"config key data.n_shards: {n_shards} shards for {params.n_samples} samples leaves "
            f"shard {shard} empty; use at most data.n_samples shards"
        )
    chunk = int(d["chunk_samples"])
    block = max(1, int(block))
    if block >= chunk:  # a multiple of the chunk size, so every write fills whole chunks
        block -= block % chunk
    t0 = time.perf_counter()
    buf = np.empty((min(block, max(n, 1)), params.n_points, 3), dtype=np.float32)
    with atomic_path(out, ".h5") as tmp:
        writer = h5.ShardWriter(
            tmp, n, params.n_points, raw_shard_attrs(params, shard, n_shards, start, stop), chunk
        )
        try:
            last = t0
            for a in range(start, stop, block):
                b = min(stop, a + block)
                ids = np.arange(a, b, dtype=np.int64)
                curves, labels = generate_block(params, ids, out=buf[: b - a])
                writer.append(curves, labels, ids)
                now = time.perf_counter()
                if progress and (now - last > 5.0):
                    progress(
                        f"{b - start}/{n} samples ({100 * (b - start) / max(n, 1):.0f} %), "
                        f"{now - t0:.1f} s"
                    )
                    last = now
            writer.close()
        except BaseException:
            writer.abort()
            raise
    return {
        "shard": shard,
        "n_shards": n_shards,
        "id_start": start,
        "id_stop": stop,
        "n_samples": n,
        "seconds": time.perf_counter() - t0,
        "path": str(out),
    }


# -------------------------------------------------- the command: hvdscale generate-shard


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
    tune_malloc()
    cfg = load_data_config(args.config)

    def progress(msg):
        print(f"generate-shard {args.shard}: {msg}", file=sys.stderr, flush=True)

    ids = shard_range(cfg["data"]["n_samples"], cfg["data"]["n_shards"], args.shard)
    progress(f"generating sample ids {ids}")
    info = generate_shard(cfg, args.shard, args.out, block=args.block, progress=progress)
    progress(f"wrote {info['n_samples']} curves to {args.out} in {info['seconds']:.1f} s")
    return 0
