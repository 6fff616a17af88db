"""Rebuild every figure and the report of an archive written by ``hvdscale export`` by
running the report rules with Snakemake (workflow env only, no training), and compare
each product with the archived bytes (exit 1 when one differs). See
hvdscale.study.export.

Example
  hvdscale rebuild study.tar.gz --out rebuilt
"""

from __future__ import annotations

from hvdscale.study.export import rebuild


def add_arguments(p):
    p.add_argument("archive", help="the archive written by hvdscale export")
    p.add_argument("--out", required=True, help="directory to rebuild in (created)")


def run(args) -> int:
    res = rebuild(args.archive, args.out)
    bad = {k: v for k, v in res["files"].items() if v != "identical"}
    for name, state in sorted(res["files"].items()):
        print(f"  {state:9s} {name}")
    print(
        f"rebuild: {len(res['files']) - len(bad)} of {len(res['files'])} products "
        f"byte-identical in {args.out}"
    )
    return 1 if bad else 0
