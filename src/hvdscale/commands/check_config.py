"""Validate a config file (schema, defaults, cross-key checks) and print its run table."""

from __future__ import annotations

from hvdscale.config.load import config_hash, load_config
from hvdscale.matrix.runtable import run_table


def add_arguments(p):
    p.add_argument("config", help="YAML config file, e.g. config/config.yaml")
    p.add_argument("--quiet", action="store_true", help="print only the summary line")


def run(args) -> int:
    cfg = load_config(args.config)
    runs = run_table(cfg)
    if not args.quiet:
        for r in runs:
            print(
                f"{r.run_id}\tnodes={r.nodes}\tworkers={r.workers}\tglobal_batch={r.global_batch}"
            )
    print(f"{args.config}: valid; {len(runs)} training runs; config hash {config_hash(cfg)[:12]}")
    return 0
