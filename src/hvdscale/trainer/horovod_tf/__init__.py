"""Training of one rank (train env): the ``hvdscale train`` command is
``hvdscale.trainer.horovod_tf.main`` (its docstring describes the run and the package layout).

Nothing here imports TensorFlow or Horovod at module level, and this file imports
nothing: import the module that defines a name (``hvdscale.trainer.horovod_tf.step``, ...).
"""
