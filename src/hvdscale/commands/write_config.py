"""Write the validated config (all of it, or the data section) as canonical JSON.

Snakemake passes the config as JSON; the output is the snapshot that later steps read
and whose hash goes into every run record.
"""

from __future__ import annotations

import json

from hvdscale.config.load import data_section, validate_config
from hvdscale.io import write_json_atomic


def add_arguments(p):
    p.add_argument("--json", required=True, help="the config as a JSON string")
    p.add_argument(
        "--section",
        choices=["full", "data"],
        default="full",
        help="full config, or only what the data stage depends on (default: full)",
    )
    p.add_argument("--out", required=True, help="output JSON file")


def run(args) -> int:
    cfg = validate_config(json.loads(args.json))
    write_json_atomic(args.out, data_section(cfg) if args.section == "data" else cfg)
    return 0
