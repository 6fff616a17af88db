"""Planning, checking, comparing and archiving a whole study (issue 13).

- ``plan``: the node-hour budget of a config before anything is submitted;
- ``references``: reference values with tolerances and verdicts;
- ``compare``: one study against another;
- ``export``: one archive of a finished study, and the rebuild of its report.

The selection (``hvdscale.select``) and the machine description (``hvdscale.system``)
live lower down: the core needs them.
"""
