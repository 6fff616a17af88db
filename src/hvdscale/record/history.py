"""The run record's per-epoch history as ``history.csv``: its columns, in file order,
and the writer. Pure Python; the run record (hvdscale.record.build) writes it and the
aggregation's epochs table (hvdscale.analysis.columns) takes its columns from here."""

from __future__ import annotations

import csv
import io

HISTORY_COLUMNS = [
    "epoch",
    "warmup",
    "wall_s",
    "steps",
    "samples",
    "throughput",
    "time_data_s",
    "time_compute_s",
    "time_sync_s",
    "time_update_s",
    "time_other_s",
    "time_dispatch_s",
    "time_train_s",
    "time_eval_s",
    "train_loss",
    "val_loss",
    "test_loss",
    "elapsed_s",
    "utilisation_mean",
    "learning_rate",
    "attempt",
]


def history_csv(epochs: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(
        buf, fieldnames=HISTORY_COLUMNS, extrasaction="ignore", lineterminator="\n"
    )
    writer.writeheader()
    for ep in epochs:
        row = {k: ep.get(k) for k in HISTORY_COLUMNS}
        for k, v in row.items():
            if v is None:
                row[k] = ""
            elif isinstance(v, bool):
                row[k] = int(v)
        writer.writerow(row)
    return buf.getvalue()
