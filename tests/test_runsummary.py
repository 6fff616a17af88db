"""The run record's derived blocks (hvdscale.record.run_summary, hvdscale.record.timing): the target
block (reached / censored) and the instrumentation block. Unit tests in the workflow env."""

from __future__ import annotations

import pytest
from test_runrecord import epoch


def test_target_block_reached_censored_and_without_target():
    from hvdscale.record.run_summary import target_block

    eps = [epoch(0, val=0.5, elapsed=2.0), epoch(1, val=0.3, elapsed=3.0)]
    hit = target_block(eps, 0.3, "absolute", "target", 10, None)
    assert hit["reached"] and not hit["censored"] and hit["epoch"] == 1
    assert hit["time_to_target_s"] == 3.0 and hit["best_val_loss"] == 0.3
    miss = target_block(eps, 0.1, "calibrated", "max_epochs", 2, 60.0)
    assert not miss["reached"] and miss["censored"] and miss["time_to_target_s"] is None
    assert miss["best_val_loss"] == 0.3 and miss["budget"] == {"max_epochs": 2, "max_train_s": 60.0}
    assert target_block(eps, 0.1, "absolute", "max_train_s", 9, 1.0)["censored"]
    assert not target_block(eps, 0.1, "absolute", "nan_loss", 9, None)["censored"]
    free = target_block(eps, None, "none", "max_epochs", 2, None)
    assert not free["reached"] and not free["censored"] and free["value"] is None


def test_instrumentation_block_counts_and_medians():
    from hvdscale.record.timing import instrumentation_block

    eps = [epoch(0, warmup=True), epoch(1), epoch(2), epoch(3)]
    for e, (p, sp, st) in zip(eps, [(9, 9.0, 9.0), (90, 1.0, 1.1), (90, 2.0, 2.2), (90, 3.0, 3.3)]):
        e.update(timed_steps=10, plain_steps=p, step_s_plain=sp, step_s_timed=st)
    b = instrumentation_block(eps, 10)
    assert (b["instrumented_steps"], b["uninstrumented_steps"]) == (40, 279)
    assert b["uninstrumented_step_s"] == 2.0 and b["instrumented_step_s"] == 2.2
    assert b["overhead"] == pytest.approx(0.1)
    for e in eps:
        e["step_s_plain"] = None  # every call instrumented: no overhead measurable
    assert instrumentation_block(eps, 1)["overhead"] is None
