"""Fault hook of the tests: a known delay inside one phase of every training step.

Python imports this module at start-up when tests/hooks is on PYTHONPATH (the launcher
passes PYTHONPATH to every rank). With ``HVDSCALE_FAULT_DELAY=<phase>:<seconds>`` (phase:
data, compute, sync, update, or noise: the noise-scale sums of timed multi-worker updates)
it replaces the no-op ``_phase_end`` of the step programs
(hvdscale.trainer.horovod_tf.step.StepProgram, hvdscale.trainer.torch_ddp.step.
TorchStepProgram) when their module is imported: the step then sleeps that long after the
phase's work and before the timestamp that ends the phase (Horovod-TF: a
``tf.numpy_function`` sleep that waits for the phase's tensors and that the timestamp waits
for), so the delay adds to the phase's work instead of overlapping it. Without the variable
this module does nothing. A process it delays says so on stderr (its timings are no
results). docs/timing.md; tests/test_train.py checks the attribution with it.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import os
import sys
import time

ENV_VAR = "HVDSCALE_FAULT_DELAY"
#: hvdscale.record.timing.STEP_PARTS: the four phases and the noise-scale sums
PHASES = ("data", "compute", "sync", "update", "noise")


def parse(text: str | None) -> tuple[str, float] | None:
    """(phase, seconds) of the variable's value; None when unset or empty."""
    text = (text or "").strip()
    if not text:
        return None
    phase, _, secs = text.partition(":")
    try:
        seconds = float(secs)
    except ValueError:
        seconds = -1.0
    if phase not in PHASES or not 0.0 <= seconds <= 60.0:
        raise SystemExit(
            f"{ENV_VAR}={text!r}: expected <phase>:<seconds> with phase one of "
            f"{', '.join(PHASES)} and 0 <= seconds <= 60, e.g. compute:0.03"
        )
    return phase, seconds


def _sleep(seconds: float):
    import numpy as np

    time.sleep(seconds)
    return np.float64(seconds)


def _tf_phase_end(delay: tuple[str, float]):
    phase_delayed, seconds = delay

    def phase_end(self, phase: str, tensors: list) -> list:
        if phase != phase_delayed:
            return list(tensors)
        tf = self.tf
        sleep = functools.partial(_sleep, seconds)
        with tf.control_dependencies(list(tensors)):
            slept = tf.numpy_function(sleep, [], tf.float64, stateful=True, name="fault_delay")
        with tf.control_dependencies([slept]):
            return [tf.identity(t) for t in tensors]

    return "StepProgram", phase_end


def _torch_phase_end(delay: tuple[str, float]):
    phase_delayed, seconds = delay

    def phase_end(self, phase: str) -> None:
        if phase == phase_delayed:
            time.sleep(seconds)

    return "TorchStepProgram", phase_end


PATCHES = {
    "hvdscale.trainer.horovod_tf.step": _tf_phase_end,
    "hvdscale.trainer.torch_ddp.step": _torch_phase_end,
}


class _PatchingLoader(importlib.abc.Loader):
    """The module's own loader, then the delay in its step program's ``_phase_end``."""

    def __init__(self, inner, name: str, delay: tuple[str, float]):
        self.inner, self.name, self.delay = inner, name, delay

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        cls_name, phase_end = PATCHES[self.name](self.delay)
        getattr(module, cls_name)._phase_end = phase_end
        phase, seconds = self.delay
        print(
            f"hvdscale train: WARNING: fault injection {phase}:{seconds:g} s per step "
            f"({ENV_VAR}; test only): the timings of this run are not results",
            file=sys.stderr,
            flush=True,
        )


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def __init__(self, delay: tuple[str, float]):
        self.delay = delay
        self.busy: set[str] = set()

    def find_spec(self, name, path, target=None):
        if name not in PATCHES or name in self.busy:
            return None
        self.busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy.discard(name)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader, name, self.delay)
        return spec


_delay = parse(os.environ.get(ENV_VAR))
if _delay is not None:
    sys.meta_path.insert(0, _PatchOnImport(_delay))
