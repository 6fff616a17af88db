"""Top-level tools over a whole study (issue 13): planning, comparing, archiving.

- ``plan``: the node-hour budget of a config before anything is submitted;
- ``compare``: one study against another;
- ``export``: one archive of a finished study; ``rebuild``: its report rebuilt from it
  through the workflow's report rules;
- ``merge``: one report from several studies of one config, one per cluster (issue 29).

Lower down, because the core needs them: the selection (``hvdscale.matrix.subset``), the
machine description (``hvdscale.record.system``), the reference checks (values with tolerances
and verdicts, ``hvdscale.analysis.references``) and the bootstrap
(``hvdscale.analysis.stats``).
"""
