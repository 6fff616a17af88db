"""The clocks of the Horovod-TF step (``hvdscale.trainer.horovod_tf.step``):
``PhaseClock`` puts ``tf.timestamp()`` ops at the phase boundaries (data | compute | sync |
update, see hvdscale.record.timing) and sums the phase durations into a variable;
``NoClock`` runs the same step without them. No TensorFlow import at module level: the
step passes its ``tf``.
"""

from __future__ import annotations

import contextlib


class PhaseClock:
    """In-graph timestamps at the phase boundaries; durations summed into ``timers``."""

    timed = True

    def __init__(self, tf, device: str, timers):
        self.tf = tf
        self.device = device
        self.on_gpu = "GPU" in device
        self.timers = timers

    def start(self):
        return self.tf.timestamp()

    def stamp(self, deps):
        """tf.timestamp() that runs after ``deps`` (on a GPU: after the device finished them)."""
        tf = self.tf
        deps = [d for d in deps if d is not None]
        if self.on_gpu and deps:
            with tf.device(self.device):
                one = tf.reshape(deps[-1], [-1])[:1]  # one element, taken on the GPU
            with tf.device("/CPU:0"):  # its copy to the host waits for the GPU stream
                deps = [tf.identity(one)]
        with tf.control_dependencies(deps):
            return tf.timestamp()

    def after(self, t):
        """Context: ops created inside start after timestamp ``t``."""
        return self.tf.control_dependencies([t])

    def record(self, t_prev, t1, t2, t3, t4, gap):
        """Add one step's four phase durations and ``gap`` (timers' fifth slot); returns
        the step's end (the next t_prev). ``gap``: the time between the end of the sync
        phase (t3) and the start of the update that belongs to no phase (the noise-scale
        sums of a timed multi-worker update), so that the five add up to the in-graph
        time."""
        parts = [t1 - t_prev, t2 - t1, t3 - t2, t4 - t3 - gap, gap]
        self.timers.assign_add(self.tf.stack(parts))
        return t4


class NoClock:
    """The same step without timestamps (calls that are not instrumented)."""

    timed = False

    def __init__(self, tf):
        self.tf = tf

    def start(self):
        return self.tf.constant(0.0, self.tf.float64)

    def stamp(self, deps):
        return self.tf.constant(0.0, self.tf.float64)

    def after(self, t):
        return contextlib.nullcontext()

    def record(self, t_prev, t1, t2, t3, t4, gap):
        return t_prev
