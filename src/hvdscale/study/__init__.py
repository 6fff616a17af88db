"""Top-level tools over a whole study (issue 13): planning, comparing, archiving.

- ``select``: run a subset of the scaling matrix without editing the sweeps;
- ``plan``: the node-hour budget of a config before anything is submitted;
- ``compare``: one study against another;
- ``export``: one archive of a finished study; ``rebuild``: its report rebuilt from it;
- ``system``: a description of the machine a run or a rebuild ran on.

The reference checks (values with tolerances and verdicts) are
``hvdscale.analysis.references``; the bootstrap is ``hvdscale.analysis.stats``.
"""
