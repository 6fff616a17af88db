"""The pure parts of bench_frameworks.py: what a run record gives one arm
(``arm_result``), the row of every run (``run_row``, validity from the quiet guard's
fields), and the summary figures with their 95 % intervals (``summarise``). No process is
started here (tests/test_bench_frameworks.py)."""

from __future__ import annotations

import math
import statistics

from bench_scaling import summary_row

from hvdscale.analysis.stats import censored_median, speedup_interval

FRAMEWORKS = ("horovod-tf", "torch-ddp")
INDEPENDENT = "independent"
#: the Horovod-TF 1-worker runs of the setting the independent arm runs (its plain fp32
#: graph step), under this key in another setting's results: the ceiling is the machine's,
#: thr(independent) over twice *that* step, whatever the setting
CEILING_BASE = "ceiling-base"
SYNC_KEYS = ("allreduce_s", "exposed_s", "comm_hook_s", "no_comm_step_s")


def arm_result(rec: dict) -> dict:
    """One training run's figures from its record: the headline (uninstrumented) epoch
    time and throughput, medians over the non-warm-up epochs; time to the validation
    target (+inf when censored: the budget ended first); timing.sync per step."""
    eps = [e for e in rec["epochs"] if not e["warmup"]] or rec["epochs"]
    tgt = rec["target"]
    sync = (rec.get("timing") or {}).get("sync") or {}
    return {
        "run_id": rec["run_id"],
        "epoch_s": statistics.median(e["wall_s"] for e in eps),
        "throughput": statistics.median(e["throughput"] for e in eps),
        "ttt_s": tgt["time_to_target_s"] if tgt["reached"] else math.inf,
        "reached": bool(tgt["reached"]),
        "target_epoch": tgt["epoch"],
        "final_val_loss": rec["summary"].get("final_val_loss"),
        "test_loss": rec["summary"].get("final_test_loss"),
        **{k: sync.get(k) for k in SYNC_KEYS},
    }


def run_row(rep: int, batch: int, arm: str, workers: int, r: dict, fields: dict, wall: float):
    """The runs CSV row of one arm: its figures (``r``: arm_result, or for the
    independent arm its throughput; ``{"error": ...}`` when it failed) and the quiet
    guard's fields (load, foreign_cpu, valid). A failed run is invalid too."""
    row = {"phase": "paired", "repeat": rep, "batch": batch, "arm": arm, "workers": workers}
    row["status"] = "failed" if "error" in r else "ok"
    for k in ("run_id", "epoch_s", "throughput", "ttt_s", "reached", "target_epoch"):
        row[k] = r.get(k)
    for k in ("final_val_loss", "test_loss", *SYNC_KEYS):
        row[k] = r.get(k)
    row["wall_s"] = round(wall, 1)
    row.update(fields)
    if "error" in r and row.get("valid") != "false":
        row["valid"], row["invalid_reason"] = "false", "the run failed"
    return row


def _speedup_row(batch, metric, fw, base: dict, new: dict, loads, note="") -> dict | None:
    """median(base) / median(new) over the paired repeats with the bootstrap interval of
    hvdscale.analysis.stats.speedup_interval (+inf = censored run)."""
    reps = sorted(set(base) & set(new))
    if not reps:
        return None
    b, v = [base[k] for k in reps], [new[k] for k in reps]
    mb, mv = censored_median(b)[0], censored_median(v)[0]
    med = mb / mv if math.isfinite(mb) and math.isfinite(mv) and mv > 0 else math.nan
    lo, hi, why = speedup_interval(b, v, f"frameworks-{metric}-{fw}-{batch}",
                                   base_repeats=reps, repeats=reps)  # fmt: skip
    row = summary_row(batch, metric, [1.0], fw, 2, note, loads)  # the fields; figures below
    ok = math.isfinite(lo) and math.isfinite(hi)
    reached = f"reached {sum(map(math.isfinite, v))}/{len(v)} (2 workers), " + (
        f"{sum(map(math.isfinite, b))}/{len(b)} (1 worker)"
    )
    row.update(median=None if math.isnan(med) else med, ci_low=lo if ok else None)
    row.update(ci_high=hi if ok else None, n=len(reps))
    row["note"] = "; ".join(x for x in (note, why, reached if metric == "speedup_ttt" else "") if x)
    return row


def _per_repeat(num: dict, den: dict, factor: float = 1.0) -> list[float]:
    return [num[k] / (factor * den[k]) for k in sorted(num) if k in den and den[k]]


def _framework_rows(batch, fw, R, loads) -> list[dict]:
    """Speedups (epoch time, time to target), efficiency against 1 worker and against
    the ceiling, and the 2-worker sync figures of one framework."""
    rows = []
    one, two = R.get((fw, 1), {}), R.get((fw, 2), {})
    col = lambda reps, k: {r: x[k] for r, x in reps.items()}  # noqa: E731
    for metric, key in (("speedup_epoch", "epoch_s"), ("speedup_ttt", "ttt_s")):
        row = _speedup_row(batch, metric, fw, col(one, key), col(two, key), loads)
        if row is not None:
            rows.append(row)
    eff = {k: two[k]["throughput"] / (2 * one[k]["throughput"]) for k in sorted(two) if k in one}
    if eff:
        rows.append(summary_row(batch, "efficiency", list(eff.values()), fw, 2, "", loads))
    ceil = _ceiling(R)
    vs = [eff[k] / ceil[k] for k in sorted(eff) if k in ceil]
    if vs:
        note = "efficiency / ceiling of the same repeat"
        rows.append(summary_row(batch, "efficiency_vs_ceiling", vs, fw, 2, note, loads))
    for k in SYNC_KEYS:
        vals = [x[k] for x in two.values() if x.get(k) is not None]
        if vals:
            rows.append(summary_row(batch, f"sync_{k}", vals, fw, 2, "per step", loads))
    return rows


def _ceiling(R: dict) -> dict:
    """Per repeat: thr(two 1-worker runs at once) / (2 x thr(Horovod-TF, 1 worker)), the
    machine's ceiling as bench_scaling measures it (its independent arm runs hvdscale's
    TF step code, the Horovod arm's own)."""
    ind = {k: v["throughput"] for k, v in R.get((INDEPENDENT, 2), {}).items()}
    base = R.get((CEILING_BASE, 1)) or R.get(("horovod-tf", 1), {})
    hv1 = {k: v["throughput"] for k, v in base.items()}
    return {k: ind[k] / (2 * hv1[k]) for k in sorted(ind) if k in hv1}


def summarise(batches, results: dict, left_out: dict | None = None) -> list[dict]:
    """Summary rows from the valid runs (``results[batch][(arm, workers)][repeat]`` =
    arm_result plus ``fields``, the quiet guard's); every row carries the merged quality
    fields of all runs of its batch and ``runs_left_out`` (invalid runs of the batch)."""
    rows: list[dict] = []
    left_out = left_out or {}
    for batch in batches:
        R = results.get(batch, {})
        loads = [x["fields"] for (arm, _), reps in R.items() if arm != CEILING_BASE
                 for x in reps.values()]  # fmt: skip
        out = []
        for (arm, w), reps in sorted(R.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            if arm == CEILING_BASE:
                continue
            for metric in ("epoch_s", "throughput", "ttt_s"):
                vals = [x[metric] for x in reps.values() if x.get(metric) is not None]
                if metric == "ttt_s" and vals:
                    med, reached, total = censored_median(vals)
                    row = summary_row(batch, metric, [v for v in vals if math.isfinite(v)],
                                      arm, w, f"reached {reached}/{total}", loads)  # fmt: skip
                    row["median"] = None if math.isnan(med) else med
                    if reached < total:  # an interval of the reached runs alone would lie
                        row["ci_low"] = row["ci_high"] = None
                    out.append(row)
                elif vals:
                    out.append(summary_row(batch, metric, vals, arm, w, "", loads))
        ceil = _ceiling(R)
        if ceil:
            note = "two 1-worker Horovod-TF step runs at once / 2 x Horovod-TF 1 worker"
            out.append(summary_row(batch, "ceiling", list(ceil.values()), INDEPENDENT, 2,
                                   note, loads))  # fmt: skip
        for fw in FRAMEWORKS:
            out += _framework_rows(batch, fw, R, loads)
        for w in (1, 2):
            tor, hv = R.get(("torch-ddp", w), {}), R.get(("horovod-tf", w), {})
            ratio = _per_repeat({k: v["epoch_s"] for k, v in tor.items()},
                                {k: v["epoch_s"] for k, v in hv.items()})  # fmt: skip
            if ratio:
                note = "epoch time torch-ddp / horovod-tf, paired repeats"
                out.append(summary_row(batch, "ratio_epoch_torch_vs_horovod", ratio,
                                       "torch-ddp", w, note, loads))  # fmt: skip
        for r in out:
            r["runs_left_out"] = left_out.get(batch, 0)
        rows += out
    return rows


def left_out_counts(rows: list[dict]) -> dict:
    """Invalid runs per batch (the runs CSV rows)."""
    out: dict = {}
    for r in rows:
        if str(r.get("valid")) == "false":
            out[int(r["batch"])] = out.get(int(r["batch"]), 0) + 1
    return out
