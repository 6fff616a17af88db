"""One archive of a finished study, and the rebuild of its report from that archive.

``hvdscale export`` writes a .tar.gz (deterministic: sorted members, no time stamps):

  MANIFEST.json     format, results_dir, config files, git commit, config hash, the
                    workflow env's versions, SOURCE_DATE_EPOCH if set, sha256 of every
                    member (inputs and products)
  system.json       the exporting machine (hvdscale.study.system)
  config files      at the paths they were given (relative to the project root)
  envs/*.lock.txt   the pinned environments
  inputs            {results}/config/full.json, {results}/runs/*/ (metrics.json,
                    history.csv, config.json, failure.json; no checkpoints),
                    {results}/allreduce/*.csv
  products          {results}/scaling/*.csv, costmodel.json, references.csv,
                    systems.csv (the system description per partition, from the
                    run records), {results}/plots/*.pdf|png, {results}/report.pdf

``hvdscale rebuild ARCHIVE --out DIR`` (``make report FROM=ARCHIVE``) extracts the
inputs and config files into DIR and runs, in DIR and with the workflow env only (in
this process), what the Snakemake rules run: aggregate, fit-costmodel, check-references,
tabulate-systems, plot, report. It then compares every product with the archived bytes
and exits 1 if one differs.

Example
  hvdscale export --config-file config/config.yaml --out study.tar.gz
  hvdscale rebuild study.tar.gz --out rebuilt
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

from hvdscale.errors import UserError

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


def study_files(results: str, root: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """(inputs, products): archive path -> file on disk."""
    base = root / results
    if not (base / "config" / "full.json").exists():
        raise UserError(f"{base}/config/full.json: not found (is {results} a finished study?)")
    inputs = {f"{results}/config/full.json": base / "config" / "full.json"}
    for d in sorted((base / "runs").glob("*")):
        for name in RUN_FILES:
            if (d / name).is_file():
                inputs[f"{results}/runs/{d.name}/{name}"] = d / name
    for f in sorted((base / "allreduce").glob("*.csv")):
        inputs[f"{results}/allreduce/{f.name}"] = f
    if (base / TARGET).is_file():
        inputs[f"{results}/{TARGET}"] = base / TARGET
    products = {}
    for name in SCALING:
        products[f"{results}/scaling/{name}"] = base / "scaling" / name
    for rel in OPTIONAL_PRODUCTS:
        if (base / rel).exists():
            products[f"{results}/{rel}"] = base / rel
    for f in sorted((base / "plots").glob("*")):
        if f.suffix in (".pdf", ".png"):
            products[f"{results}/plots/{f.name}"] = f
    products[f"{results}/report.pdf"] = base / "report.pdf"
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
    from hvdscale.common import PROJECT_ROOT, git_commit
    from hvdscale.config import config_hash
    from hvdscale.report.provenance import workflow_versions
    from hvdscale.study.system import collect_system

    root = Path(root)
    inputs, products = study_files(results, root)
    files = {_relative(c): root / c for c in config_files}
    for name in ("workflow.lock.txt", "train.lock.txt"):
        if (PROJECT_ROOT / "envs" / name).exists():
            files[f"envs/{name}"] = PROJECT_ROOT / "envs" / name
    members = {**files, **inputs, **products}
    data = {name: Path(p).read_bytes() for name, p in members.items()}
    cfg = json.loads(data[f"{results}/config/full.json"])
    manifest = {
        "format": FORMAT,
        "results_dir": results,
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
    from hvdscale.io import atomic_path

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


def _steps(cfg: dict, manifest: dict, allreduce: list[str]) -> list[list[str]]:
    """The commands of the report rules (workflow/rules/report.smk), in their order
    (tabulate-systems and the report's --systems only where the archive has systems.csv)."""
    from hvdscale.config import count_parameters

    r = manifest["results_dir"]
    s = f"{r}/scaling"
    has = set(manifest["products"]) | set(manifest.get("inputs", {}))
    systems = f"{s}/systems.csv" in has
    tabulate = ["tabulate-systems", "--runs-dir", f"{r}/runs", "--runs", f"{s}/runs.csv"]
    tabulate += ["--out", f"{s}/systems.csv"]
    target = f"{r}/{TARGET}" in has
    tuned = f"{s}/tuned.csv" in manifest["products"]
    headline = f"{s}/headline.csv" in manifest["products"]
    select = ["select-tuned", "--runs-dir", f"{r}/runs", "--config", f"{r}/config/full.json"]
    select += ["--target", f"{r}/{TARGET}", "--out", f"{s}/tuned.csv"]
    steps = [
        *([select] if tuned and target else []),
        ["aggregate", "--runs-dir", f"{r}/runs", "--config", f"{r}/config/full.json"]
        + ["--out-runs", f"{s}/runs.csv", "--out-summary", f"{s}/summary.csv"]
        + ["--out-status", f"{s}/status.csv", "--out-epochs", f"{s}/epochs.csv"]
        + (["--out-headline", f"{s}/headline.csv"] if headline else []),
        ["fit-costmodel", "--allreduce", *allreduce, "--runs", f"{s}/runs.csv"]
        + ["--summary", f"{s}/summary.csv", "--model-bytes", str(4 * count_parameters(cfg))]
        + ["--max-workers", str(cfg["report"]["max_extrapolation_workers"])]
        + ["--out", f"{s}/costmodel.json"],
        ["check-references", "--config", f"{r}/config/full.json", "--runs", f"{s}/runs.csv"]
        + ["--summary", f"{s}/summary.csv", "--out", f"{s}/references.csv"],
        *([tabulate] if systems else []),
        ["plot", "--runs", f"{s}/runs.csv", "--summary", f"{s}/summary.csv"]
        + ["--epochs", f"{s}/epochs.csv", "--costmodel", f"{s}/costmodel.json"]
        + ["--outdir", f"{r}/plots"],
        ["report", "--config-file", *manifest["config_files"]]
        + ["--config", f"{r}/config/full.json", "--runs", f"{s}/runs.csv"]
        + ["--summary", f"{s}/summary.csv", "--status", f"{s}/status.csv"]
        + ["--costmodel", f"{s}/costmodel.json", "--plots-dir", f"{r}/plots"]
        + ["--references", f"{s}/references.csv", "--epochs", f"{s}/epochs.csv"]
        + (["--tuned", f"{s}/tuned.csv"] if tuned else [])
        + (["--systems", f"{s}/systems.csv"] if systems else [])
        + (["--headline", f"{s}/headline.csv"] if headline else [])
        + (["--target", f"{r}/{TARGET}"] if target else [])
        + ["--out", f"{r}/report.pdf"],
    ]
    return steps


@contextlib.contextmanager
def _inside(directory: Path, env: dict[str, str | None]):
    """Run in ``directory`` with these environment variables (None: unset); restore."""
    old_cwd, old_env = os.getcwd(), {k: os.environ.get(k) for k in env}
    try:
        os.chdir(directory)
        _set_environ(env)
        yield
    finally:
        os.chdir(old_cwd)
        _set_environ(old_env)


def _set_environ(env: dict[str, str | None]) -> None:
    """Set these environment variables; unset those given as None."""
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _run_step(step: list[str]) -> str:
    """One ``hvdscale`` command in this process (the workflow env); its output."""
    from hvdscale.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        rc = main(step)
    text = f"$ hvdscale {' '.join(step)}\n{buf.getvalue()}"
    if rc != 0:
        raise UserError(f"rebuild step 'hvdscale {step[0]}' failed:\n{text}")
    return text


def rebuild(archive, outdir) -> dict:
    """Rebuild every product of ``archive`` in ``outdir``; returns
    {"manifest", "files": {path: identical|differs|missing}, "log"}."""
    from hvdscale.config import validate_config
    from hvdscale.runtable import allreduce_jobs

    members = read_archive(archive)
    manifest = json.loads(members["MANIFEST.json"])
    outdir = Path(outdir).resolve()
    outdir.mkdir(parents=True, exist_ok=True)
    r = manifest["results_dir"]
    for name in manifest["inputs"]:
        dest = outdir / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(members[name])
    for name in ("MANIFEST.json", "system.json"):
        (outdir / name).write_bytes(members[name])
    cfg = validate_config(json.loads(members[f"{r}/config/full.json"]))
    allreduce = [
        f"{r}/allreduce/{j['id']}.csv"
        for j in allreduce_jobs(cfg)
        if f"{r}/allreduce/{j['id']}.csv" in manifest["inputs"]
    ]
    env = {"HVDSCALE_REPORT_COMMIT": manifest["git_commit"]}
    env["SOURCE_DATE_EPOCH"] = manifest.get("source_date_epoch")
    log = []
    with _inside(outdir, env):
        for step in _steps(cfg, manifest, allreduce):
            if step[0] == "check-references" and (
                f"{r}/scaling/references.csv" not in manifest["products"]
            ):
                continue
            log.append(_run_step(step))
    files = {}
    for name, digest in manifest["products"].items():
        p = outdir / name
        if not p.exists():
            files[name] = "missing"
        else:
            files[name] = "identical" if sha256(p.read_bytes()) == digest else "differs"
    return {"manifest": manifest, "files": files, "log": log}


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
