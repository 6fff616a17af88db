"""The run matrix: backends, the config and its schema, run ids, the run table and
each run's job layout (pure Python; both environments import it)."""
