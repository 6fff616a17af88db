"""Workloads: the model and data a study measures (``workload`` in the config).

A workload gives the shape and dtype of a sample and of its label, how its shards are
made (generated, or read from the user's own arrays), its network for each framework (one
layer description, or a builder per framework), its loss, and the validation metric the
study's target uses. ``stress-strain`` (the default) and ``digits`` ship with hvdscale; a
user's workload is any importable ``module:object`` (``docs/extending.md``, "Your own model
and data")."""
