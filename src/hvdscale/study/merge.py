"""One report from several studies of one config, each run on its own cluster (issue 29).

A site with one Slurm instance per cluster runs a study as one Snakemake run per cluster
(``--config only_cluster=NAME``, hvdscale.slurm.clusters), each on that cluster's login
node, each into its own results directory. ``hvdscale merge A B ... --out DIR``
(``make report FROM="A B"``) joins them: every part is a results directory or an archive
of ``hvdscale export``.

Checks (a UserError naming the key or file, nothing written):
  - the parts' validated configs (config/full.json) agree on everything but the
    partitions: ``only_cluster``, ``scaling.partitions`` and the partition lists of
    ``scaling.sweeps``, ``scaling.tune`` and ``allreduce.sweeps`` may differ, and
    ``results_dir`` (where a part's files lived is no part of its runs' configuration),
    nothing else;
  - no partition is in two parts (the partitions of a part are those of its run table);
  - the parts' targets (scaling/target.json: mode and value) agree.

DIR then holds one study: ``config/config.yaml`` (the merged config: the first part's,
with the union of the parts' partitions and partition lists, no only_cluster, a
``select`` of the parts' partitions when the config names more, and the first part's
results_dir, or ``results`` where that was an absolute path), ``<results_dir>/``
with every part's run records, allreduce tables and target, and
``<results_dir>/config/merged_from.json``, the provenance of each part (source, results
directory, config files, config hash, git commit, partitions), which ``hvdscale report``
puts into the report's provenance table. The report stage of the workflow (the rules of
``REPORT_RULES``, run by Snakemake as ``hvdscale rebuild`` runs them) then aggregates,
plots and typesets it: per-partition baselines as in any study (speedups are against the
1-worker run of the same partition), both partitions in every table.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hvdscale.config.load import DEFAULT_RESULTS_DIR, config_hash, validate_config
from hvdscale.errors import UserError
from hvdscale.io import atomic_path
from hvdscale.matrix.subset import describe as describe_selection
from hvdscale.study.export import TARGET, read_archive, report_rules_command, study_inputs

MERGED_FROM = "config/merged_from.json"
CONFIG_FILE = "config/config.yaml"


@dataclass
class Part:
    source: str
    kind: str  # "results directory" or "archive"
    config: dict
    files: dict[str, bytes] = field(default_factory=dict)  # path under results_dir -> bytes
    config_files: list[str] = field(default_factory=list)
    git_commits: list[str] = field(default_factory=list)
    partitions: list[str] = field(default_factory=list)


def _commits_of_records(files: dict[str, bytes]) -> list[str]:
    """The git commits the part's run records were trained at (environment.git_commit)."""
    out = set()
    for name, data in files.items():
        if name.startswith("runs/") and name.endswith("/metrics.json"):
            try:
                commit = (json.loads(data).get("environment") or {}).get("git_commit")
            except (ValueError, AttributeError):
                continue  # a malformed record: aggregate reports it
            if commit:
                out.add(str(commit))
    return sorted(out)


def _used_partitions(cfg: dict) -> list[str]:
    """The partitions of the part's run table, in config order."""
    from hvdscale.matrix.runtable import run_table

    used = {r.partition for r in run_table(cfg)}
    return [p for p in cfg["scaling"]["partitions"] if p in used]


def load_part(source) -> Part:
    """A results directory (config/full.json, runs/, allreduce/, scaling/target.json) or
    an archive of hvdscale export."""
    path = Path(source)
    if path.is_file():
        members = read_archive(path)
        manifest = json.loads(members["MANIFEST.json"])
        r = manifest["results_dir"]
        prefix = f"{r}/"
        files = {
            name[len(prefix) :]: data
            for name, data in members.items()
            if name in manifest["inputs"] and name.startswith(prefix)
        }
        if "config/full.json" not in files:
            raise UserError(f"archive {path}: no {r}/config/full.json")
        part = Part(
            str(source),
            "archive",
            json.loads(files["config/full.json"]),
            files,
            list(manifest.get("config_files") or []),
            [manifest["git_commit"]] if manifest.get("git_commit") else [],
        )
    elif path.is_dir():
        full = path / "config" / "full.json"
        if not full.is_file():
            raise UserError(
                f"{path}: no config/full.json (give a results directory of a study, or an "
                "archive of hvdscale export)"
            )
        files = {name: f.read_bytes() for name, f in study_inputs(path).items()}
        part = Part(str(source), "results directory", json.loads(full.read_text()), files)
    else:
        raise UserError(
            f"{source}: not found (a results directory or an archive of hvdscale export)"
        )
    try:
        part.config = validate_config(part.config)
    except UserError as exc:
        raise UserError(f"{source}: config/full.json: {exc}") from None
    part.partitions = _used_partitions(part.config)
    # the commits the runs were trained at; an archive without them: its export's commit
    part.git_commits = _commits_of_records(part.files) or part.git_commits
    if not any(k.startswith("runs/") for k in part.files):
        raise UserError(f"{source}: no run records (runs/*/metrics.json)")
    return part


# the keys in which the parts of one study may differ (their partitions)
def _without_partitions(cfg: dict) -> dict:
    c = copy.deepcopy(cfg)
    c.pop("only_cluster", None)
    c.pop("results_dir", None)
    c["scaling"]["partitions"] = {}
    for sweep in c["scaling"]["sweeps"]:
        sweep["partitions"] = []
    if c["scaling"].get("tune"):
        c["scaling"]["tune"]["partitions"] = []
    for sweep in (c.get("allreduce") or {}).get("sweeps") or []:
        sweep["partitions"] = []
    return c


def first_difference(a, b, path: str = "") -> tuple[str, object, object] | None:
    """(key path, a's value, b's value) of the first difference, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            key = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                return key, a.get(k, "<absent>"), b.get(k, "<absent>")
            d = first_difference(a[k], b[k], key)
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}.{i}")
            if d:
                return d
        return None
    return None if a == b else (path, a, b)


def _short(v) -> str:
    text = json.dumps(v, sort_keys=True) if not isinstance(v, str) else repr(v)
    return text if len(text) <= 120 else text[:117] + "..."


def check_parts(parts: list[Part]) -> None:
    """Refuse parts of different studies or with overlapping partitions."""
    first = parts[0]
    base = _without_partitions(first.config)
    for p in parts[1:]:
        d = first_difference(base, _without_partitions(p.config))
        if d:
            key, a, b = d
            raise UserError(
                f"merge: {first.source} and {p.source} are not parts of one study: their "
                f"configs differ in config key {key}: {_short(a)} against {_short(b)}; "
                "only the partitions (only_cluster, scaling.partitions and the partition "
                "lists of the sweeps) and results_dir may differ"
            )
    seen: dict[str, str] = {}
    for p in parts:
        if not p.partitions:
            raise UserError(f"merge: {p.source}: its config's run table has no partition")
        for name in p.partitions:
            if name in seen:
                raise UserError(
                    f"merge: partition {name!r} is in both {seen[name]} and {p.source}; the "
                    "parts of one study must have disjoint partitions (one run per cluster)"
                )
            seen[name] = p.source
    targets = []
    for p in parts:
        if TARGET in p.files:
            t = json.loads(p.files[TARGET])
            targets.append((p.source, t.get("mode"), t.get("value")))
    for src, mode, value in targets[1:]:
        if (mode, value) != targets[0][1:]:
            raise UserError(
                f"merge: the parts have different targets ({TARGET}): {targets[0][0]}: "
                f"{targets[0][1]} {targets[0][2]!r}, {src}: {mode} {value!r}; times to target "
                "of one study need one target (for several clusters: training.target "
                "{mode: absolute, value: ...})"
            )


def _union(lists) -> list:
    out: list = []
    for items in lists:
        out += [x for x in items if x not in out]
    return out


def _calibration_partition(cfg: dict) -> str | None:
    tgt = cfg["training"].get("target") or {}
    return (
        (tgt.get("calibration") or {}).get("partition") if tgt.get("mode") == "calibrated" else None
    )


def merged_config(parts: list[Part]) -> dict:
    """The first part's config with every part's partitions (definitions and the
    partition lists of the sweeps), no only_cluster, restricted by ``select`` to the
    parts' partitions when it names more."""
    cfg = copy.deepcopy(parts[0].config)
    cfg["only_cluster"] = ""
    if Path(cfg["results_dir"]).is_absolute():  # the merged study lives in DIR
        cfg["results_dir"] = DEFAULT_RESULTS_DIR
    for i, sweep in enumerate(cfg["scaling"]["sweeps"]):
        sweep["partitions"] = _union(p.config["scaling"]["sweeps"][i]["partitions"] for p in parts)
    if cfg["scaling"].get("tune"):
        cfg["scaling"]["tune"]["partitions"] = _union(
            p.config["scaling"]["tune"]["partitions"] for p in parts
        )
    for i, sweep in enumerate((cfg.get("allreduce") or {}).get("sweeps") or []):
        sweep["partitions"] = _union(
            p.config["allreduce"]["sweeps"][i]["partitions"] for p in parts
        )
    wanted = _union(p.partitions for p in parts)
    # the definitions of the partitions the merged config names: a part's own partitions
    # as that part ran them, the others (named by the sweeps, never run) from any part
    named = _union(
        [
            wanted,
            *(sw["partitions"] for sw in cfg["scaling"]["sweeps"]),
            (cfg["scaling"].get("tune") or {}).get("partitions") or [],
            *(sw["partitions"] for sw in (cfg.get("allreduce") or {}).get("sweeps") or []),
            [cal] if (cal := _calibration_partition(cfg)) else [],
        ]
    )
    defs: dict = {}
    for p in parts:
        for name in p.partitions:
            defs[name] = p.config["scaling"]["partitions"][name]
    for name in named:
        for p in parts:
            if name not in defs and name in p.config["scaling"]["partitions"]:
                defs[name] = p.config["scaling"]["partitions"][name]
    cfg["scaling"]["partitions"] = {name: defs[name] for name in named}
    if set(_used_partitions(validate_config(cfg))) != set(wanted):
        rest = [
            item
            for item in describe_selection(cfg.get("select")).split()
            if not item.startswith("partition=")
        ]
        cfg["select"] = " ".join([*rest, f"partition={','.join(wanted)}"])
    cfg = validate_config(cfg)
    got = _used_partitions(cfg)
    if got != [p for p in cfg["scaling"]["partitions"] if p in wanted]:
        raise UserError(
            f"merge: the merged config runs on partitions {got}, not the parts' {wanted} "
            "(calibration runs on a partition no part ran?)"
        )
    return cfg


def provenance(parts: list[Part]) -> dict:
    out = {}
    for i, p in enumerate(parts, 1):
        out[f"part {i}"] = {  # the report's provenance table: "part 1.source", ...
            "source": f"{p.source} ({p.kind})",
            "partitions": ", ".join(p.partitions),
            "cluster": p.config.get("only_cluster") or "-",
            "results_dir": p.config["results_dir"],
            "config_files": " + ".join(p.config_files) or "- (a results directory)",
            "config_hash": config_hash(p.config),
            "git_commit": ", ".join(p.git_commits) or "-",
            "run_records": sum(1 for k in p.files if k.endswith("/metrics.json")),
        }
    return out


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        Path(tmp).write_bytes(data)


def merge(sources: list, outdir) -> dict:
    """Merge ``sources`` (results directories or archives) into a study in ``outdir`` and
    build its report; returns {"config", "parts", "report", "log"}."""
    if len(sources) < 2:
        raise UserError("merge: give at least two results directories or archives")
    parts = [load_part(s) for s in sources]
    check_parts(parts)
    cfg = merged_config(parts)
    outdir = Path(outdir).resolve()
    if outdir.exists() and any(outdir.iterdir()):
        raise UserError(f"merge: --out {outdir}: exists and is not empty (give a new directory)")
    results = cfg["results_dir"]
    base = outdir / results
    files = {"config/full.json": (json.dumps(cfg, indent=2) + "\n").encode()}
    files[MERGED_FROM] = (json.dumps(provenance(parts), indent=2) + "\n").encode()
    for p in parts:  # no name in two parts but the target (checked equal): partitions differ
        for name, data in p.files.items():
            files.setdefault(name, data)
    # the config first, then the inputs in name order as hvdscale rebuild unpacks them (no
    # input newer than what Snakemake could think it is made from)
    _write(outdir / CONFIG_FILE, yaml.safe_dump(cfg, sort_keys=False).encode())
    for name in sorted(files):
        _write(base / name, files[name])
    env = {k: v for k, v in os.environ.items() if k not in ("SNAKEMAKE_PROFILE",)}
    commits = _union(p.git_commits for p in parts)
    if commits:
        env["HVDSCALE_REPORT_COMMIT"] = ", ".join(commits)
    cmd = report_rules_command(outdir, [CONFIG_FILE], results, [f"{results}/report.pdf"])
    proc = subprocess.run(cmd, cwd=outdir, env=env, capture_output=True, text=True)
    log = f"$ {shlex.join(cmd)}\n{proc.stdout}{proc.stderr}"
    if proc.returncode != 0:
        raise UserError(f"merge: the report rules failed (Snakemake):\n{log[-4000:]}")
    return {"config": cfg, "parts": parts, "report": base / "report.pdf", "log": log}


# -------------------------------------------------- the command: hvdscale merge


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
    """One report from several studies of one config, each run on its own cluster:
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
    res = merge(args.sources, args.out)
    for i, part in enumerate(res["parts"], 1):
        print(f"  part {i}: {part.source} ({part.kind}): partitions {', '.join(part.partitions)}")
    print(f"merge: wrote {res['report']} ({len(res['parts'])} parts)")
    return 0
