"""Test-only fault hook: a known delay inside one phase of the compiled step.

``HVDSCALE_FAULT_DELAY=<phase>:<seconds>`` (phase: data, compute, sync or update; off when
unset or empty) makes every training step sleep that long inside that phase: after the
phase's work and before the timestamp that ends it. The test of the phase attribution
(tests/test_train.py) checks that exactly that phase's measured time grows by the delay.
``noise`` delays the noise-scale sums of a timed multi-worker update instead, which lie
between the sync and the update phase and belong to neither (their test checks that).
The launcher passes the variable to every rank (hvdscale.launch.launchspec.PASS_ENV); a run with a
delay says so in its record (``config.fault_delay``) and on stderr. docs/timing.md.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

from hvdscale.errors import UserError
from hvdscale.record.timing import STEP_PARTS

ENV_VAR = "HVDSCALE_FAULT_DELAY"
#: where a delay can go: a phase of the split, or the noise-scale sums (in no phase)
FAULT_PHASES = STEP_PARTS


@dataclass(frozen=True)
class FaultDelay:
    phase: str | None = None  # None: off
    seconds: float = 0.0

    @classmethod
    def parse(cls, text: str | None) -> FaultDelay:
        text = (text or "").strip()
        if not text:
            return cls()
        phase, _, secs = text.partition(":")
        try:
            seconds = float(secs)
        except ValueError:
            seconds = -1.0
        if phase not in FAULT_PHASES or not (0.0 <= seconds <= 60.0):
            raise UserError(
                f"{ENV_VAR}={text!r}: expected <phase>:<seconds> with phase one of "
                f"{', '.join(FAULT_PHASES)} and 0 <= seconds <= 60, e.g. compute:0.03"
            )
        return cls(phase, seconds)

    @classmethod
    def from_env(cls, environ=None) -> FaultDelay:
        return cls.parse((os.environ if environ is None else environ).get(ENV_VAR))

    @property
    def active(self) -> bool:
        return self.phase is not None

    def describe(self) -> str | None:
        """``phase:seconds`` for the run record, None when off."""
        return f"{self.phase}:{self.seconds:g}" if self.active else None

    def inject(self, phase: str, tensors: list) -> list:
        """``tensors`` unchanged, or (in the fault's phase) identities of them that wait
        for a sleep, which itself waits for ``tensors``: the delay lies inside the phase
        and adds to its work instead of overlapping it."""
        if phase != self.phase:
            return list(tensors)
        import tensorflow as tf

        sleep = functools.partial(_sleep, self.seconds)
        with tf.control_dependencies(list(tensors)):
            slept = tf.numpy_function(sleep, [], tf.float64, stateful=True, name="fault_delay")
        with tf.control_dependencies([slept]):
            return [tf.identity(t) for t in tensors]


def _sleep(seconds: float):
    import numpy as np

    time.sleep(seconds)
    return np.float64(seconds)
