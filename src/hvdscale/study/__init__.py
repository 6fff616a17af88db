"""Planning, checking, comparing and archiving a whole study (issue 13).

- ``select``: run a subset of the scaling matrix without editing the sweeps;
- ``plan``: the node-hour budget of a config before anything is submitted;
- ``references``: reference values with tolerances and verdicts;
- ``compare``: one study against another;
- ``export``: one archive of a finished study, and the rebuild of its report;
- ``system``: a description of the machine a run or a rebuild ran on.
"""
