"""One report from several studies of one config, each run on its own cluster (issue 29):
``hvdscale merge A B ... --out DIR``; every part is a results directory or an archive of
``hvdscale export``. See hvdscale.study.merge for the checks (configs that differ in
anything but the partitions, overlapping partitions and different targets are refused)
and what DIR holds; the report is DIR/<results_dir>/report.pdf, built by the workflow's
report rules (workflow env only, no training).

Example (one Snakemake run per cluster, then one report)
  snakemake --profile profiles/slurm --configfile config/thesis.yaml \\
      --config only_cluster=alpha           # on alpha's login node
  ...                                        # the same on hpdlf's, into its own checkout
  hvdscale merge alpha/results hpdlf/results --out merged
  make report FROM="alpha/study.tar.gz hpdlf/study.tar.gz" OUT=merged
"""

from __future__ import annotations

from hvdscale.study.merge import merge


def add_arguments(p):
    p.add_argument(
        "sources",
        nargs="+",
        metavar="SOURCE",
        help="results directories or archives of hvdscale export (at least two), one per "
        "cluster of the study",
    )
    p.add_argument("--out", required=True, help="directory of the merged study (new or empty)")


def run(args) -> int:
    res = merge(args.sources, args.out)
    for i, part in enumerate(res["parts"], 1):
        print(f"  part {i}: {part.source} ({part.kind}): partitions {', '.join(part.partitions)}")
    print(f"merge: wrote {res['report']} ({len(res['parts'])} parts)")
    return 0
