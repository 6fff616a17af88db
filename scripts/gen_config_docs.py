#!/usr/bin/env python3
"""Write config/README.md from workflow/schemas/config.schema.yaml (every key, its
type, default, allowed values and description). `--check` exits 1 when the file is
out of date (the tests run it)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
OUT = ROOT / "config" / "README.md"

HEADER = """# Configuration reference

Generated from `workflow/schemas/config.schema.yaml` by `scripts/gen_config_docs.py`;
do not edit by hand. Every config file is validated against that schema (unknown keys
are rejected, every key has a default). The configs that ship with the project:

- `config/config.yaml`: the default, the whole equal-accuracy study on 2 cores (24,000
  curves; 1 and 2 workers, batch 75 and 1000 per worker, MPI, 5 repeats; a calibrated
  target; an epoch-time Gloo sweep; a small LR re-tuning sweep; its run time: README.md).
- `config/digits.yaml`: the same study on another workload (scikit-learn's handwritten
  digits, a small CNN, a target validation accuracy), in both frameworks.
- `config/smoke.yaml`: an overlay that makes the smoke study of the config before it
  (`make smoke CONFIG=...`; docs/study.md, "Start small").
- `config/accuracy.yaml`: the same study with a longer budget, more calibration seeds
  and the full re-tuning sweep.
- `config/partial.yaml`: an overlay that builds the report from partial results.
- `config/thesis.yaml`: the reference study (1,000,000 curves, batch 75, learning rate
  4.7331e-4, the 153,441-parameter network, partitions alpha/hpdlf/gpu2). Values marked
  `EDIT` in it are per-cluster.

Pass another file with `snakemake --configfile FILE` (it extends `config/config.yaml`;
lists replace, mappings merge) and check it with `.venv/bin/hvdscale check-config FILE`.

| key | type | default | allowed | description |
|---|---|---|---|---|
"""


def resolve(node, defs):
    if "$ref" in node:
        ref = defs[node["$ref"].split("/")[-1]]
        merged = {**ref, **{k: v for k, v in node.items() if k != "$ref"}}
        return resolve(merged, defs)
    return node


def allowed(node, defs) -> str:
    parts = []
    if "enum" in node:
        parts.append(", ".join(f"`{v}`" for v in node["enum"]))
    if "pattern" in node:
        parts.append(f"pattern `{node['pattern']}`")
    for k, op in (
        ("minimum", ">="),
        ("exclusiveMinimum", ">"),
        ("maximum", "<="),
        ("exclusiveMaximum", "<"),
    ):
        if k in node:
            parts.append(f"{op} {node[k]}")
    for alt in node.get("oneOf", []):  # a branch with a constant or bounds (not a $ref)
        if "const" in alt:
            parts.append(f"`{alt['const']}`")
        elif alt.get("type") in ("number", "integer") and (bounds := allowed(alt, defs)):
            parts.append(f"{alt['type']} {bounds}")
    if node.get("type") == "array" and "items" in node:
        inner = resolve(node["items"], defs)
        if inner.get("type") != "object":
            sub = allowed(inner, defs)
            parts.append("items: " + (inner.get("type", "") + (f" {sub}" if sub else "")))
    return "; ".join(parts).replace("|", "\\|")


def walk(node, path, defs, rows):
    node = resolve(node, defs)
    typ = node.get("type", "")
    typ = "/".join(typ) if isinstance(typ, list) else typ
    if not typ and node.get("oneOf"):  # e.g. number/null/string (a constant such as auto)
        names = {str: "string", int: "integer", float: "number", bool: "boolean"}
        kinds = [
            names.get(type(a["const"]), "") if "const" in a else resolve(a, defs).get("type", "")
            for a in node["oneOf"]
        ]
        typ = "/".join(dict.fromkeys(k for k in kinds if k))
    if path:
        default = node.get("default", "(required)")
        default_s = json.dumps(default) if typ == "object" else f"`{json.dumps(default)}`"
        if typ == "object" and len(default_s) > 60:
            default_s = "see sub-keys"
        desc = " ".join(str(node.get("description", "")).split())
        rows.append(f"| `{path}` | {typ} | {default_s} | {allowed(node, defs)} | {desc} |")
    for key, sub in node.get("properties", {}).items():
        walk(sub, f"{path}.{key}" if path else key, defs, rows)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict):
        walk(extra, f"{path}.<name>", defs, rows)
    items = node.get("items")
    if isinstance(items, dict) and resolve(items, defs).get("type") == "object":
        walk(items, f"{path}[]", defs, rows)


def render() -> str:
    schema = yaml.safe_load(SCHEMA.read_text())
    rows: list[str] = []
    walk(schema, "", schema.get("$defs", {}), rows)
    return HEADER + "\n".join(rows) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument(
        "--check", action="store_true", help="exit 1 if config/README.md is out of date"
    )
    args = ap.parse_args()
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is out of date: run scripts/gen_config_docs.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
