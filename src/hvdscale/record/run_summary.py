"""The run record's derived blocks: the summary (medians, losses, time to target) and the
validation-loss ``target`` block (reached or censored). Pure Python;
hvdscale.record.build puts them into the record. (The gradient noise scale's sums are
per epoch: hvdscale.analysis.noise_scale reads them from epochs.csv.)"""

from __future__ import annotations

from hvdscale.record.timing import PHASES, median
from hvdscale.target import time_to
from hvdscale.workload.base import VAL_LOSS, Metric


def target_block(
    epochs: list[dict],
    target: float | None,
    mode: str,
    stop_reason: str,
    max_epochs: int,
    max_train_s: float | None,
    metric: Metric = VAL_LOSS,
) -> dict:
    """The record's ``target``: reached or censored (stopped by a budget without reaching
    it: reached false, time null, best validation loss kept)."""
    time_s, epoch, _ = time_to(epochs, target, metric)
    vals = [e["val_loss"] for e in epochs if e.get("val_loss") is not None]
    other = {}  # another metric than the loss (a classifier's accuracy): named, its best
    if metric is not VAL_LOSS:
        other = {"metric": metric.key, "best_value": metric.best(e.get(metric.key) for e in epochs)}
    return {
        **other,
        "value": target,
        "mode": mode,
        "reached": time_s is not None,
        "epoch": epoch,
        "time_to_target_s": time_s,
        "censored": time_s is None
        and target is not None
        and stop_reason in ("max_epochs", "max_train_s"),
        "stop_reason": stop_reason,
        "best_val_loss": min(vals) if vals else None,
        "budget": {"max_epochs": int(max_epochs), "max_train_s": max_train_s},
    }


def summarise(epochs: list[dict], target: float | None, metric: Metric = VAL_LOSS) -> dict:
    """Medians over the non-warm-up epochs (all epochs when every epoch is warm-up)."""
    timed = [e for e in epochs if not e["warmup"]] or list(epochs)
    split_total = sum(sum(e[f"time_{p}_s"] for p in PHASES) for e in timed)

    def share(phase):
        if not timed or split_total <= 0:
            return None
        return round(sum(e[f"time_{phase}_s"] for e in timed) / split_total, 6)

    test_losses = [e["test_loss"] for e in epochs if e.get("test_loss") is not None]
    val_losses = [e["val_loss"] for e in epochs if e.get("val_loss") is not None]
    return {
        "epoch_time_median_s": median([e["wall_s"] for e in timed]),
        "throughput_median": median([e["throughput"] for e in timed]),
        "sync_share": share("sync"),
        "data_share": share("data"),
        "compute_share": share("compute"),
        "update_share": share("update"),
        # the one test evaluation, at the end of training (the last epoch's entry)
        "final_test_loss": epochs[-1].get("test_loss") if epochs else None,
        "best_test_loss": min(test_losses) if test_losses else None,
        "best_val_loss": min(val_losses) if val_losses else None,
        "final_val_loss": epochs[-1].get("val_loss") if epochs else None,
        "time_to_target_s": time_to(epochs, target, metric)[0],
        "epochs_completed": len(epochs),
    }
