"""The data stage (generate -> validate -> split) at the thesis size through the real
command line, as Snakemake runs it with ``--cores W``, against ``dd`` writing as many
bytes on the same file system (docs/performance.md, "Data stage"). Prints the wall time
of each phase, the peak RSS (largest single process) and the ratio to dd, and writes
benchmarks/results/bench_data.csv (a run with --n-samples below the config's size is
marked ``reduced_size``). The temporary data are deleted afterwards (unless --keep).

  .venv/bin/python benchmarks/bench_data.py                  # 1,000,000 curves, config/thesis.yaml
  .venv/bin/python benchmarks/bench_data.py --n-samples 100000 --workers 2
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT / "src"))

sys.path.insert(0, str(PROJECT_ROOT / "benchmarks"))
from _results import (  # noqa: E402
    Measured,
    add_quiet_args,
    configure_quiet,
    quiet_main,
    write_csv,
)

from hvdscale.config.load import data_section, load_config  # noqa: E402


def run_pool(cmds: list[list[str]], workers: int, log_dir: Path, tag: str) -> tuple[float, int]:
    """Run commands, ``workers`` at a time; returns (wall seconds, max RSS in bytes over
    processes)."""
    t0 = time.perf_counter()
    pending = list(enumerate(cmds))
    running: dict[int, tuple[int, object]] = {}
    max_rss = 0
    failed = []
    while pending or running:
        while pending and len(running) < workers:
            i, cmd = pending.pop(0)
            log = open(log_dir / f"{tag}-{i:04d}.log", "w")
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
            running[proc.pid] = (i, log, proc)
        pid, status, usage = os.wait4(-1, 0)
        if pid not in running:
            continue
        i, log, proc = running.pop(pid)
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.close()
        max_rss = max(max_rss, usage.ru_maxrss * 1024)
        if proc.returncode != 0:
            failed.append((i, proc.returncode))
    if failed:
        i, rc = failed[0]
        text = (log_dir / f"{tag}-{i:04d}.log").read_text()
        raise SystemExit(f"{tag} job {i} failed with exit code {rc}:\n{text[-3000:]}")
    return time.perf_counter() - t0, max_rss


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def dd_seconds(target_dir: Path, nbytes: int) -> float:
    count = max(1, math.ceil(nbytes / (16 << 20)))
    out = target_dir / "dd.bin"
    t0 = time.perf_counter()
    dd = ["dd", "if=/dev/zero", f"of={out}", "bs=16M", f"count={count}", "conv=fdatasync"]
    subprocess.run(dd, check=True, capture_output=True)
    dt = time.perf_counter() - t0
    out.unlink()
    return dt


@quiet_main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", default=str(PROJECT_ROOT / "config" / "thesis.yaml"),
                    help="config whose data section is benchmarked")  # fmt: skip
    ap.add_argument("--n-samples", type=int, help="override data.n_samples (default: the config's)")
    ap.add_argument("--n-shards", type=int, help="override data.n_shards (generation jobs)")
    ap.add_argument("--workers", type=int, default=2,
                    help="parallel processes for generate/validate (default 2)")  # fmt: skip
    ap.add_argument("--tmpdir", help="parent directory of the temporary data (default: system tmp)")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    add_quiet_args(ap)
    ap.add_argument("--json", default=None, help="also write the CSV row to this JSON file")
    ap.add_argument("--csv", help="default: benchmarks/results/bench_data.csv")
    args = ap.parse_args(argv)
    configure_quiet(args)

    cfg = data_section(load_config(args.config))
    full_n = cfg["data"]["n_samples"]
    if args.n_samples:
        cfg["data"]["n_samples"] = args.n_samples
    if args.n_shards:
        cfg["data"]["n_shards"] = args.n_shards
    d = cfg["data"]
    meas = Measured("bench_data").start()  # waits for a quiet machine

    work = Path(tempfile.mkdtemp(prefix="hvdscale-bench-data.", dir=args.tmpdir))
    try:
        cfg_file = work / "data.json"
        cfg_file.write_text(json.dumps(cfg, indent=2))
        raw, out, logs = work / "raw", work / "data", work / "logs"
        logs.mkdir()
        S, W = d["n_shards"], args.workers
        shards = [raw / f"shard-{k:04d}.h5" for k in range(S)]
        vals = [raw / f"shard-{k:04d}.validation.json" for k in range(S)]
        print(
            f"data stage benchmark: {d['n_samples']:,} curves x {d['n_points']} points, "
            f"{S} generation shards, {d['split_shards']['train']}+{d['split_shards']['test']} "
            f"split shards, {W} workers, {os.cpu_count()} cores, load {meas.before:.2f}, in "
            f"{work}",
            flush=True,
        )

        def cli(*a):
            return [sys.executable, "-m", "hvdscale.cli", a[0], "--config", str(cfg_file),
                    *map(str, a[1:])]  # fmt: skip

        gen = [cli("generate-shard", "--shard", k, "--out", shards[k]) for k in range(S)]
        val = [cli("validate-shard", "--shard", shards[k], "--out", vals[k]) for k in range(S)]
        split = cli("split-dataset", "--shards", *shards, "--validations", *vals, "--outdir",
                    out, "--workers", W)  # fmt: skip
        t_gen, rss_gen = run_pool(gen, W, logs, "generate")
        print(f"  generate  {t_gen:7.2f} s", flush=True)
        t_val, rss_val = run_pool(val, W, logs, "validate")
        print(f"  validate  {t_val:7.2f} s", flush=True)
        t_split, rss_split = run_pool([split], 1, logs, "split")
        print(f"  split     {t_split:7.2f} s", flush=True)
        total = t_gen + t_val + t_split
        nbytes = dir_bytes(raw) + dir_bytes(out)
        if not args.keep:
            shutil.rmtree(raw)  # free the space before dd
        t_dd = dd_seconds(work, nbytes)
        rss = [round(r / 2**20) for r in (rss_gen, rss_val, rss_split)]
        print(f"  total     {total:7.2f} s   ({d['n_samples'] / total:,.0f} curves/s)")
        print(f"  peak RSS  {max(rss)} MiB (generate {rss[0]}, validate {rss[1]}, split "
              f"{rss[2]})")  # fmt: skip
        print(f"  written   {nbytes / 1e9:.2f} GB; dd of the same bytes {t_dd:.2f} s; "
              f"ratio total/dd {total / t_dd:.2f}")  # fmt: skip
        meas.stop()  # dd included: the whole stage is one arm
        reduced = args.n_samples is not None and args.n_samples < full_n
        seconds = {"generate": t_gen, "validate": t_val, "split": t_split, "total": total}
        row = {
            "config": Path(args.config).name,
            "n_samples": d["n_samples"],
            "reduced_size": int(reduced),
            "note": f"reduced from {full_n} curves" if reduced else "",
            "n_points": d["n_points"],
            "n_shards": S,
            "workers": W,
            "cores": os.cpu_count(),
            **{f"{k}_s": round(v, 2) for k, v in seconds.items()},
            "curves_per_s": d["n_samples"] / total,
            "peak_rss_mb": max(rss),
            "bytes_written": nbytes,
            "dd_seconds_same_bytes": round(t_dd, 2),
            "ratio_to_dd": round(total / t_dd, 2),
            "write_rate_mb_s": round(nbytes / total / 1e6, 1),
            **meas.fields(),
        }
        if args.json:
            Path(args.json).write_text(json.dumps(row, indent=2) + "\n")
        write_csv("bench_data", [row], args.csv)
    finally:
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
