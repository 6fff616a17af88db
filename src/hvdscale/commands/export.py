"""One archive of a finished study, and the rebuild of its report from that archive.

``hvdscale export`` writes a .tar.gz (deterministic: sorted members, no time stamps):

  MANIFEST.json     format, results_dir, config files, git commit, config hash, the
                    workflow env's versions, SOURCE_DATE_EPOCH if set, sha256 of every
                    member (inputs and products)
  system.json       the exporting machine (hvdscale.record.system)
  config files      at the paths they were given (relative to the project root)
  envs/*.lock.txt   the pinned environments
  inputs            {results}/config/full.json, {results}/runs/*/ (metrics.json,
                    history.csv, config.json, failure.json; no checkpoints),
                    {results}/allreduce/*.csv
  products          {results}/scaling/*.csv, costmodel.json, references.csv,
                    systems.csv (the system description per partition, from the
                    run records), {results}/plots/*.pdf|png, {results}/report.pdf

``hvdscale rebuild ARCHIVE --out DIR`` (``make report FROM=ARCHIVE``) extracts the
inputs and config files into DIR and runs the report rules themselves there: Snakemake
(the workflow env's) with the project's Snakefile, ``--directory DIR``, the archived
config files, only the report-stage rules allowed (``REPORT_RULES``: no training, the
archived run records are its inputs) and the archived products as targets. It then
compares every product with the archived bytes and exits 1 if one differs.

Example
  hvdscale export --config-file config/config.yaml --out study.tar.gz
  hvdscale rebuild study.tar.gz --out rebuilt
"""

from __future__ import annotations

from hvdscale.study.export import export_study


def add_arguments(p):
    p.add_argument(
        "--config-file",
        nargs="+",
        default=["config/config.yaml"],
        help="the config files the study ran with, in Snakemake's order, relative to the "
        "project root (default: %(default)s)",
    )
    p.add_argument("--results", default="results", help="results directory (default: %(default)s)")
    p.add_argument("--out", required=True, help="the archive to write (.tar.gz)")


def run(args) -> int:
    m = export_study(args.out, config_files=args.config_file, results=args.results)
    print(
        f"export: wrote {args.out} ({len(m['inputs'])} inputs, {len(m['products'])} "
        f"products, commit {m['git_commit'][:12]})"
    )
    return 0
