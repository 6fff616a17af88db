"""How the train env reaches the ranks (config key ``environment``), checked against what
Snakemake was told and what the job's shell has loaded.

Pure functions, no process started:

- ``deployment_problem``: ``environment.deployment`` against Snakemake's
  ``--sdm``/``--software-deployment-method`` (the workflow refuses a disagreement at
  parse time, so ``snakemake -n`` stops before any job). Without ``--sdm env-modules``
  Snakemake ignores the rules' ``envmodules:`` directive and the ranks would run the
  ``python`` of the login shell; without ``--sdm conda`` it ignores ``conda:``.
- ``missing_modules`` / ``module_load_problem``: the configured modules against
  ``LOADEDMODULES`` (set by Lmod and Environment Modules alike). Snakemake 9 runs an
  env-modules job as ``module purge && module load A B; CMD``: CMD runs whatever
  ``module load`` returned, so ``hvdscale launch`` checks the list before it starts ranks.
"""

from __future__ import annotations

from collections.abc import Iterable

#: environment.deployment -> the --sdm method it needs (venv needs none)
SDM_OF = {"env-modules": "env-modules", "conda": "conda"}
# what Snakemake does without the method, and with it
_IGNORED = {
    "env-modules": "environment.modules would not be loaded and the ranks would run the "
    "`python` of the shell that started Snakemake",
    "conda": "the env of environment.conda_env would not be made and the ranks would run "
    "the `python` of the shell that started Snakemake",
}
_USED = {
    "env-modules": "load environment.modules",
    "conda": "run in the env of environment.conda_env",
}


def deployment_problem(
    deployment: str, modules: Iterable[str], sdm_methods: Iterable[str]
) -> str | None:
    """What is wrong with ``environment.deployment`` = ``deployment`` (and
    ``environment.modules`` = ``modules``) under Snakemake's deployment methods
    ``sdm_methods`` (``--sdm`` values: env-modules, conda, apptainer), or None."""
    modules = list(modules)
    sdm = sorted(set(sdm_methods))
    given = f"--sdm {' '.join(sdm)}" if sdm else "no --sdm"
    what = f"environment.deployment is {deployment!r}"
    needed = SDM_OF.get(deployment)
    if needed and needed not in sdm:
        return (
            f"{what} but Snakemake runs with {given}: {_IGNORED[needed]}. Add `--sdm "
            f"{needed}` (or software-deployment-method: [{needed}] in the profile), or set "
            "environment.deployment to venv"
        )
    for method, dep in SDM_OF.items():
        if method in sdm and deployment != dep:
            return (
                f"{what} but Snakemake runs with {given}: the training jobs would "
                f"{_USED[method]} instead of the {deployment} the config names. Set "
                f"environment.deployment to {dep}, or leave `--sdm {method}` out"
            )
    if deployment == "env-modules" and not modules:
        return (
            f"{what} but environment.modules is empty: list the modules that give the "
            "training jobs Python with TensorFlow, Horovod and MPI "
            "(e.g. [GCCcore/11.3.0, OpenMPI/4.1.4, TensorFlow/2.15.1, Horovod/0.28.1])"
        )
    return None


def _is_loaded(name: str, loaded: list[str]) -> bool:
    """Whether module ``name`` (as given to `module load`) is among ``loaded`` (full
    names): the same name, or a version of it (``OpenMPI`` -> ``OpenMPI/4.1.4``,
    ``TensorFlow/2.15.1`` -> ``TensorFlow/2.15.1-CUDA-11.7.0``)."""
    for full in loaded:
        if full == name or full.startswith(name + "/"):
            return True
        if "/" in name and full.startswith(name) and full[len(name)] in "-._+":
            return True
    return False


def missing_modules(modules: Iterable[str], loadedmodules: str | None) -> list[str]:
    """The names of ``modules`` that ``loadedmodules`` (the LOADEDMODULES variable:
    colon-separated full names; None when unset) does not hold, in config order."""
    loaded = [m for m in (loadedmodules or "").split(":") if m]
    return [m for m in modules if not _is_loaded(m, loaded)]


def module_load_problem(modules: Iterable[str], loadedmodules: str | None) -> str | None:
    """The message that stops an env-modules job whose `module load` did not load every
    module of environment.modules, or None when all are loaded."""
    missing = missing_modules(modules, loadedmodules)
    if not missing:
        return None
    have = (loadedmodules or "").replace(":", ", ") or "none"
    return (
        f"environment.modules: module(s) {', '.join(missing)} not loaded (loaded: {have}). "
        "`module load` failed for them (an unknown name, or a conflict): check "
        f"`module spider {missing[0].split('/')[0]}` on a compute node and fix "
        "environment.modules; no rank was started"
    )
