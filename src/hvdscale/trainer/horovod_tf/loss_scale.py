"""Dynamic loss scaling of the Horovod-TF step's fp16 updates (issue 32,
``training.precision`` fp16; a mixed_float16 model). The scale and its counters follow the
allreduced gradient, so every rank keeps the same. No TensorFlow import at module level:
the step passes its ``tf``.
"""

from __future__ import annotations

#: Keras' LossScaleOptimizer's defaults (start at 2^15, double after 2000 finite updates,
#: halve and skip the update on a non-finite gradient)
LOSS_SCALE_INITIAL = 2.0**15
LOSS_SCALE_GROWTH_STEPS = 2000


class DynamicLossScale:
    """The loss scale and its counters, as variables of the step (create it inside the
    step's device scope)."""

    def __init__(self, tf):
        self.tf = tf
        self.scale = tf.Variable(
            LOSS_SCALE_INITIAL, dtype=tf.float32, trainable=False, name="loss_scale"
        )
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="good")
        self.skipped = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped")
        # every update the step made or skipped (the record's loss_scale.updates)
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name="updates")
        self.variables = [self.scale, self.good_steps, self.skipped, self.updates]

    def apply(self, apply_update, grads, read_back):
        """``apply_update()`` when every gradient is finite (the scale doubles after
        LOSS_SCALE_GROWTH_STEPS such updates), else no update and half the scale;
        ``read_back(deps)`` orders what the step returns after them."""
        tf = self.tf
        # the allreduced gradient is the same on every rank: all take the same branch
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])

        def update():
            it = apply_update()
            grow = self.good_steps + 1 >= LOSS_SCALE_GROWTH_STEPS
            with tf.control_dependencies([it]):
                scale = self.scale.assign(tf.where(grow, self.scale * 2.0, self.scale))
                good = self.good_steps.assign(
                    tf.where(grow, tf.constant(0, tf.int64), self.good_steps + 1)
                )
            return read_back([scale, good, self.updates.assign_add(1)])

        def skip():  # overflow: no update, a smaller scale
            scale = self.scale.assign(tf.maximum(self.scale * 0.5, 1.0))
            good = self.good_steps.assign(0)
            counts = [self.skipped.assign_add(1), self.updates.assign_add(1)]
            return read_back([scale, good, *counts])

        return tf.cond(finite, update, skip)

    def state(self) -> dict:
        """The record's ``loss_scale`` block: the loss scale now (``final``), the updates
        skipped for a non-finite gradient (``skipped_updates``) and all updates, made or
        skipped (``updates``), since the step was built."""
        return {"final": float(self.scale.numpy()),
                "skipped_updates": int(self.skipped.numpy()),
                "updates": int(self.updates.numpy())}  # fmt: skip
