"""Training of one rank (train env): the ``hvdscale train`` command is
``hvdscale.train.main`` (its docstring describes the run and the package layout).

Nothing here imports TensorFlow or Horovod at module level, and this file imports
nothing: import the module that defines a name (``hvdscale.train.step``, ...).
"""
