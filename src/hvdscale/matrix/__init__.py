"""The run matrix: backends, run ids, the run table, run kinds and the selection
(pure Python; both environments import it)."""
