"""One archive of a finished study, and the rebuild of its report from that archive."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

from hvdscale.config.load import DEFAULT_RESULTS_DIR, config_hash
from hvdscale.errors import UserError
from hvdscale.io import atomic_path
from hvdscale.project import PROJECT_ROOT, git_commit
from hvdscale.record.system import collect_system
from hvdscale.report.provenance import workflow_versions

FORMAT = 1
PREFIX = "study/"
RUN_FILES = ("metrics.json", "history.csv", "config.json", "failure.json")
SCALING = ("runs.csv", "summary.csv", "status.csv", "epochs.csv", "costmodel.json")
# optional: archives of studies from before these products existed
OPTIONAL_PRODUCTS = (
    "scaling/references.csv",
    "scaling/systems.csv",
    "scaling/headline.csv",
    "scaling/tuned.csv",
    "scaling/selection.csv",
)
# the study's target validation loss (rule calibrate_target): fixed before the scaling runs
# and read by them, so it is an input of the report stage, archived as it was
TARGET = "scaling/target.json"


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _relative(path: str) -> str:
    p = Path(path)
    if p.is_absolute() or ".." in p.parts:
        raise UserError(
            f"config file {path}: give it relative to the project root (no '/' at the start, "
            "no '..'), as Snakemake was given it"
        )
    return p.as_posix()


def study_inputs(base: Path) -> dict[str, Path]:
    """The inputs of the report stage in the results directory ``base`` (path relative to
    it -> file): the validated config, every run's files, the allreduce tables, the target,
    the partitions' preflight records (none in a study from before the preflight). Also
    what ``hvdscale merge`` takes from each part (hvdscale.study.merge)."""
    inputs = {"config/full.json": base / "config" / "full.json"}
    for d in sorted((base / "runs").glob("*")):
        for name in RUN_FILES:
            if (d / name).is_file():
                inputs[f"runs/{d.name}/{name}"] = d / name
    for f in sorted((base / "allreduce").glob("*.csv")):
        inputs[f"allreduce/{f.name}"] = f
    for f in sorted((base / "preflight").glob("*.json")):
        inputs[f"preflight/{f.name}"] = f
    if (base / TARGET).is_file():
        inputs[TARGET] = base / TARGET
    return inputs


def archived_results_dir(results: str) -> str:
    """The results directory's name in an archive: as given, or ``results`` for an
    absolute one (a workspace on scratch); a rebuild recreates it under its own directory."""
    return DEFAULT_RESULTS_DIR if Path(results).is_absolute() else Path(results).as_posix()


def study_files(results: str, root: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """(inputs, products): archive path -> file on disk."""
    base = root / results
    if not (base / "config" / "full.json").exists():
        raise UserError(f"{base}/config/full.json: not found (is {results} a finished study?)")
    name_ = archived_results_dir(results)
    inputs = {f"{name_}/{name}": path for name, path in study_inputs(base).items()}
    products = {}
    for name in SCALING:
        products[f"{name_}/scaling/{name}"] = base / "scaling" / name
    for rel in OPTIONAL_PRODUCTS:
        if (base / rel).exists():
            products[f"{name_}/{rel}"] = base / rel
    for f in sorted((base / "plots").glob("*")):
        if f.suffix in (".pdf", ".png"):
            products[f"{name_}/plots/{f.name}"] = f
    products[f"{name_}/report.pdf"] = base / "report.pdf"
    missing = [k for k, p in products.items() if not p.exists()]
    if missing:
        raise UserError(f"not a finished study: missing {', '.join(missing)}")
    return inputs, products


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(PREFIX + name)
    info.size = len(data)
    info.mode = 0o644
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def export_study(
    out, *, config_files: list[str], results: str = "results", root: str | Path = "."
) -> dict:
    """Write the archive ``out``; returns its manifest."""
    root = Path(root)
    inputs, products = study_files(results, root)
    files = {_relative(c): root / c for c in config_files}
    for name in ("workflow.lock.txt", "train.lock.txt"):
        if (PROJECT_ROOT / "envs" / name).exists():
            files[f"envs/{name}"] = PROJECT_ROOT / "envs" / name
    members = {**files, **inputs, **products}
    data = {name: Path(p).read_bytes() for name, p in members.items()}
    archived = archived_results_dir(results)
    cfg = json.loads(data[f"{archived}/config/full.json"])
    manifest = {
        "format": FORMAT,
        "results_dir": archived,
        "config_files": [_relative(c) for c in config_files],
        "git_commit": git_commit(),
        "config_hash": config_hash(cfg),
        "source_date_epoch": os.environ.get("SOURCE_DATE_EPOCH") or None,
        "workflow_env": workflow_versions(),
        "inputs": {k: sha256(data[k]) for k in sorted(files) + sorted(inputs)},
        "products": {k: sha256(data[k]) for k in sorted(products)},
    }
    data["MANIFEST.json"] = (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode()
    data["system.json"] = (json.dumps(collect_system(), indent=2, sort_keys=True) + "\n").encode()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name in sorted(data):
                _add(tar, name, data[name])

    with atomic_path(out, ".tar.gz") as tmp:
        Path(tmp).write_bytes(buf.getvalue())
    return manifest


def read_archive(path) -> dict[str, bytes]:
    """Every member of an archive, by name without the prefix."""
    try:
        tar = tarfile.open(path, "r:gz")
    except (OSError, tarfile.TarError) as exc:
        raise UserError(f"archive {path}: cannot be read ({exc})") from None
    out = {}
    with tar:
        for m in tar.getmembers():
            if not m.isfile() or not m.name.startswith(PREFIX):
                continue
            name = m.name[len(PREFIX) :]
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise UserError(f"archive {path}: unsafe member name {m.name!r}")
            out[name] = tar.extractfile(m).read()
    if "MANIFEST.json" not in out:
        raise UserError(f"archive {path}: no MANIFEST.json (not written by hvdscale export)")
    return out


# the report stage of workflow/rules/report.smk (and tune.smk's checkpoint): the only rules
# a rebuild runs; every other file (run records, allreduce tables, the validated config,
# the target) is an archived input
REPORT_RULES = (
    "select_tuned",
    "aggregate_runs",
    "fit_costmodel",
    "check_references",
    "tabulate_systems",
    "plot_scaling",
    "build_report",
)


def report_rules_command(
    outdir: Path, config_files: list[str], results_dir: str, targets: list[str]
) -> list[str]:
    """The Snakemake invocation that builds ``targets`` in ``outdir`` with the report
    rules only (allowed and forced): the project's Snakefile on ``config_files`` (relative
    to ``outdir``) with ``results_dir``. Used by a rebuild and by hvdscale merge."""
    return [
        *(sys.executable, "-m", "snakemake", "--snakefile", str(PROJECT_ROOT / "Snakefile")),
        *("--directory", str(outdir), "--cores", "1"),
        *("--configfiles", *(str(outdir / c) for c in config_files)),
        *("--config", f"results_dir={results_dir}"),
        *("--allowed-rules", *REPORT_RULES),
        *("--forcerun", *REPORT_RULES),
        *("--", *targets),
    ]


def snakemake_command(manifest: dict, outdir: Path) -> list[str]:
    """The Snakemake invocation that rebuilds the archived products in ``outdir``: the
    archived config files (results_dir as archived), the products as targets."""
    return report_rules_command(
        outdir, manifest["config_files"], manifest["results_dir"], sorted(manifest["products"])
    )


def _unpack(members: dict[str, bytes], manifest: dict, outdir: Path) -> None:
    """The archived inputs and config files at their paths in ``outdir``; no product."""
    for name in [*manifest["inputs"], "MANIFEST.json", "system.json"]:
        dest = outdir / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(members[name])


def rebuild(archive, outdir) -> dict:
    """Rebuild every product of ``archive`` in ``outdir`` with the report rules run by
    Snakemake; returns {"manifest", "files": {path: identical|differs|missing}, "log"}."""
    members = read_archive(archive)
    manifest = json.loads(members["MANIFEST.json"])
    outdir = Path(outdir).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    _unpack(members, manifest, outdir)
    env = {**os.environ, "HVDSCALE_REPORT_COMMIT": manifest["git_commit"]}
    env.pop("SOURCE_DATE_EPOCH", None)
    env.pop("SNAKEMAKE_PROFILE", None)  # the rebuild runs here, never through a cluster profile
    if manifest.get("source_date_epoch"):
        env["SOURCE_DATE_EPOCH"] = manifest["source_date_epoch"]
    cmd = snakemake_command(manifest, outdir)
    proc = subprocess.run(cmd, cwd=outdir, env=env, capture_output=True, text=True)
    log = f"$ {shlex.join(cmd)}\n{proc.stdout}{proc.stderr}"
    if proc.returncode != 0:
        raise UserError(f"rebuild: the report rules failed (Snakemake):\n{log[-4000:]}")
    files = {}
    for name, digest in manifest["products"].items():
        p = outdir / name
        if not p.exists():
            files[name] = "missing"
        else:
            files[name] = "identical" if sha256(p.read_bytes()) == digest else "differs"
    return {"manifest": manifest, "files": files, "log": [log]}


# -------------------------------------------------- the command: hvdscale export


def add_arguments(p):
    p.add_argument(
        "--config-file",
        nargs="+",
        default=["config/config.yaml"],
        help="the config files the study ran with, in Snakemake's order, relative to the "
        "project root (default: %(default)s)",
    )
    p.add_argument(
        "--results",
        default="results",
        help="results directory, relative to the project root or absolute; an absolute one "
        "is archived as results/ (default: %(default)s)",
    )
    p.add_argument("--out", required=True, help="the archive to write (.tar.gz)")


def run(args) -> int:
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
                        ({results}: the results directory, or results/ for an absolute
                        one, e.g. a workspace on scratch)

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
    m = export_study(args.out, config_files=args.config_file, results=args.results)
    print(
        f"export: wrote {args.out} ({len(m['inputs'])} inputs, {len(m['products'])} "
        f"products, commit {m['git_commit'][:12]})"
    )
    return 0


# -------------------------------------------------- the command: hvdscale rebuild


def add_rebuild_arguments(p):
    p.add_argument("archive", help="the archive written by hvdscale export")
    p.add_argument("--out", required=True, help="directory to rebuild in (created)")


def run_rebuild(args) -> int:
    """Rebuild every figure and the report of an archive written by ``hvdscale export`` by
    running the report rules with Snakemake (workflow env only, no training), and compare
    each product with the archived bytes (exit 1 when one differs). See
    hvdscale.study.export.

    Example
      hvdscale rebuild study.tar.gz --out rebuilt
    """
    res = rebuild(args.archive, args.out)
    bad = {k: v for k, v in res["files"].items() if v != "identical"}
    for name, state in sorted(res["files"].items()):
        print(f"  {state:9s} {name}")
    print(
        f"rebuild: {len(res['files']) - len(bad)} of {len(res['files'])} products "
        f"byte-identical in {args.out}"
    )
    return 1 if bad else 0
