"""Generated blocks of docs/performance.md for the GPU benchmarks (issue 33):
benchmarks/gpu_batch_sweep.py (epoch time against batch size on one GPU, and the
compile/precision variants at batch 75 and 1000) and benchmarks/gpu_step_profile.py (where
a step's time goes). Every figure comes from the CSVs; invalid rows show no figure."""

from __future__ import annotations

import statistics
from pathlib import Path

from _quiet import row_validity

from .common import (
    INVALID,
    QCOLS,
    f2,
    missing,
    num,
    provenance,
    quality,
    read,
    short_reason,
    table,
)

SWEEP_HOW = "PYTHONPATH=src python3 benchmarks/gpu_batch_sweep.py (on a GPU machine)"
PROFILE_HOW = "PYTHONPATH=src python3 benchmarks/gpu_step_profile.py (on a GPU machine)"
BASE = "off/fp32"  # eager float32: the variant every other one is compared with
STUDY_RATIO = 7.0  # the reference study's epoch-time ratio batch 75 -> 1000 on one GPU


def _ok(r: dict) -> bool:
    return r.get("status") == "completed" and quality(r)[0]


def _step_ms(r: dict) -> float | None:
    e, n = num(r.get("epoch_s")), num(r.get("steps_per_epoch"))
    return 1e3 * e / n if e is not None and n else None


def _median_epoch(rows: list[dict], variant: str, batch: int) -> tuple[float | None, int]:
    xs = [
        num(r["epoch_s"])
        for r in rows
        if r["variant"] == variant and r["batch"] == str(batch) and _ok(r)
    ]
    return (statistics.median(xs) if xs else None), len(xs)


def block_gpu_batch_sweep(res: Path) -> str:
    rows = read(res, "gpu_batch_sweep")
    if not rows:
        return missing("gpu_batch_sweep", SWEEP_HOW)
    base = [r for r in rows if r["variant"] == BASE]
    body = []
    for r in sorted(base, key=lambda r: (int(r["batch"]), int(r.get("repeat") or 0))):
        ok, qc = quality(r)
        ok = ok and r["status"] == "completed"
        figs = [f2(r.get("epoch_s"), 4), f2(_step_ms(r), 2), f2(r.get("throughput"), 0),
                f2(r.get("gpu_util_mean"), 1), f2(r.get("final_val_loss"), 4)]  # fmt: skip
        body.append([r["batch"], r.get("repeat", "0"), r.get("steps_per_epoch", "")])
        body[-1] += [x if ok else INVALID for x in figs] + qc
    head = ["batch", "repeat", "steps/epoch", "epoch s", "ms/step", "samples/s",
            "GPU util %", "val loss"]  # fmt: skip
    out = table(head + QCOLS, body)
    e75, n75 = _median_epoch(rows, BASE, 75)
    e1k, n1k = _median_epoch(rows, BASE, 1000)
    if e75 and e1k:
        steps = {r["batch"]: num(r.get("steps_per_epoch")) for r in base}
        sratio = (
            steps.get("75") / steps.get("1000") if steps.get("75") and steps.get("1000") else None
        )
        out += (
            f"\nReading (valid rows only, eager float32): the epoch at batch 75 takes "
            f"{e75 / e1k:.1f}x as long as at batch 1000 (medians of {n75} and {n1k} runs; "
            f"the reference study measured about {STUDY_RATIO:.0f}x on its GPUs). "
            + (
                f"Batch 75 has {sratio:.1f}x as many steps per epoch, so the ratio says how "
                f"far a step's cost stays flat as the batch grows: "
                if sratio
                else ""
            )
            + "the time per step column shows it directly.\n"
        )
    return out + "\n" + provenance(rows, "gpu_batch_sweep")


def block_gpu_variants(res: Path) -> str:
    rows = read(res, "gpu_batch_sweep")
    if not rows:
        return missing("gpu_batch_sweep", SWEEP_HOW)
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    body = []
    for b in (75, 1000):
        ref, _ = _median_epoch(rows, BASE, b)
        for v in variants:
            mine = [r for r in rows if r["variant"] == v and r["batch"] == str(b)]
            if not mine:
                continue
            med, n = _median_epoch(rows, v, b)
            reps = "; ".join(
                (f2(r.get("epoch_s"), 4) if _ok(r) else f"{INVALID} ({_why(r)})") for r in mine
            )
            warm = [num(r.get("warm_up_s")) for r in mine if num(r.get("warm_up_s")) is not None]
            body.append([
                b, v, mine[0].get("compile_mode") or "eager", reps,
                f2(med, 4) if med else "no valid run", n,
                f2(ref / med, 2) if (med and ref) else "",
                f2(max(warm), 1) if warm else "",
                f2(statistics.median(num(r["final_val_loss"]) for r in mine if _ok(r)), 4)
                if n else "",
            ])  # fmt: skip
    head = ["batch", "compile/precision", "torch.compile mode", "epoch s per run",
            "median epoch s", "valid runs", f"speedup vs {BASE}", "warm-up s (max)",
            "val loss (median)"]  # fmt: skip
    return table(head, body) + "\n" + provenance(rows, "gpu_batch_sweep")


def _why(r: dict) -> str:
    if r.get("status") != "completed":
        return r.get("error") or r.get("status") or "failed"
    return short_reason(row_validity(r)[1])  # the row's own reason, as the validity table


def block_gpu_step_profile(res: Path) -> str:
    rows = read(res, "gpu_step_profile")
    if not rows:
        return missing("gpu_step_profile", PROFILE_HOW)
    cases = {}
    for r in rows:
        cases.setdefault((r["variant"], int(r["batch"])), []).append(r)
    parts = list(dict.fromkeys(r["part"] for r in rows))
    body, shares, covers = [], [], []
    for (v, b), rs in cases.items():
        r0 = rs[0]
        ok, qc = quality(r0)
        host = {r["part"]: num(r["host_us"]) for r in rs}
        wall, busy = num(r0["wall_us"]), num(r0.get("gpu_busy_us"))
        hsum = num(r0.get("host_us_sum"))
        figs = [f2(wall, 0), f2(busy, 0), f2(num(r0.get("gpu_busy_share")), 2),
                r0.get("kernels", ""), *(f2(host.get(p), 0) for p in parts),
                f2(hsum / wall if hsum and wall else None, 2)]  # fmt: skip
        body.append([v, b] + [x if ok else INVALID for x in figs] + qc)
        if ok and wall and busy is not None and hsum:
            shares.append(num(r0["gpu_busy_share"]))
            covers.append(hsum / wall)
    head = ["compile/precision", "batch", "wall us/step", "GPU busy us/step", "GPU busy share",
            "kernels/step", *(f"host us: {p}" for p in parts), "host sum / wall"]  # fmt: skip
    out = table(head + QCOLS, body)
    if shares:
        out += (
            f"\nReading (valid rows only): the GPU is busy {min(shares):.0%}-{max(shares):.0%} "
            f"of a step, and the host's time to issue the step's parts (forward through DDP, "
            f"backward, update, batch gather; not synchronised) adds up to "
            f"{min(covers):.0%}-{max(covers):.0%} of the step's wall time: the step is bound "
            f"by the host issuing work, not by the GPU computing it. `forward_plain` is the "
            f"same forward without DDP's wrapper, so DDP's own host cost per forward is the "
            f"difference to `forward_ddp`.\n"
        )
    return out + "\n" + provenance(rows, "gpu_step_profile")
