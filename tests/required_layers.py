"""Required test layers: CI fails where a layer it must run would skip (issue 29).

A *layer* is a part of the suite that needs something of the machine, and skips
without it:

- ``slurm``: root, slurm-wlm and munge for the one-node local cluster
  (``slurm_support.slurm_cluster``);
- ``multinode``: the same plus iproute2/util-linux for the two-node cluster
  (``slurm_support.slurm_cluster_two_nodes``, the alpha cluster of test_slurm_multinode);
- ``horovod``: Horovod in .venv-train (``slurm_support.horovod_skip_reason``), and the
  compilers, MPI and cmake that build it (tests/test_setup_script.py);
- ``train-env``: .venv-train itself (``conftest_train.needs_train_env``);
- ``torch``: torch in .venv-train (``test_torch_ddp.needs_torch``);
- ``poppler``: pdftotext/pdftoppm for the rendered-report tests;
- ``lmod``: root and Debian's Lmod for the non-root cluster user of tests/test_lmod_user.py
  (``lmod_support.lmod_skip_reason``);
- ``gpu-env``: what ``HVD_GPU=1 scripts/setup.sh`` needs to build the GPU train env in
  tests/test_gpu_env.py (compilers, MPI, cmake, Linux x86_64, disk room).

Such a test skips through ``require_layer`` (in a fixture or test) or ``layer_skipif``
(a marker); its skip reason starts with the layer's tag, ``[horovod] ...``. With
``HVDSCALE_REQUIRE_LAYERS`` set to a comma-separated list of layers (or ``all``), the
hook ``pytest_runtest_makereport`` (imported by tests/conftest.py) turns the skip of a
listed layer into a failure naming the layer, what was missing and the variable.
``.ci/run`` lists every layer; without the variable every layer skips as before.

Skips that are not layers stay skips whatever the variable says, but only those listed
in ``NO_LAYER_SKIPS`` (the start of their reason, and why they may skip in CI):

- tests/test_torch_gpu.py's CPU checks skip on a machine *with* a GPU; the CI machine
  has none, and torch missing there fails the ``torch`` layer of test_torch_ddp.
- tests/test_bench_scaling.py's cgroup checks skip without a writable cgroup: that
  depends on the container CI runs in, not on scripts/setup.sh, and the benchmark's
  meter falls back to sampling processes without one (benchmarks/_quiet.py).

With the variable set, any other skip without a layer tag is a failure too (a test
module or a test that skips untagged): a new skip must name its layer, or be added to
``NO_LAYER_SKIPS`` with its reason, so that no test leaves CI silently.
"""

from __future__ import annotations

import os
import re

import pytest

ENV_VAR = "HVDSCALE_REQUIRE_LAYERS"
LAYERS = ("slurm", "multinode", "horovod", "train-env", "torch", "poppler", "lmod", "gpu-env")
_TAGGED = re.compile(r"(?:Skipped: )?\[([a-z-]+)\] (.*)", re.DOTALL)

# Skips that are no layer's: the start of the skip reason -> why it may skip in CI.
NO_LAYER_SKIPS = {
    "needs torch without a GPU in .venv-train": (
        "GPU: test_torch_gpu's CPU checks skip on a machine with a GPU (CI has none)"
    ),
    "no writable cgroup here": (
        "cgroup: depends on the container, not on setup; the meter samples without one"
    ),
}


def required_layers() -> frozenset[str]:
    """The layers ``HVDSCALE_REQUIRE_LAYERS`` lists (``all``: every one); a name that is
    no layer is a usage error, so a typo cannot switch a layer off."""
    names = {n.strip() for n in os.environ.get(ENV_VAR, "").split(",") if n.strip()}
    if "all" in names:
        return frozenset(LAYERS)
    unknown = sorted(names - set(LAYERS))
    if unknown:
        raise pytest.UsageError(
            f"{ENV_VAR}: unknown layer(s) {', '.join(unknown)}; layers: {', '.join(LAYERS)} or all"
        )
    return frozenset(names)


def _tag(layer: str, missing: str) -> str:
    if layer not in LAYERS:
        raise ValueError(f"unknown test layer {layer!r}; layers: {', '.join(LAYERS)}")
    return f"[{layer}] {missing}"


def require_layer(layer: str, missing: str | None) -> None:
    """Skip the test (or fixture) when ``missing`` says what ``layer`` lacks here;
    ``None``: nothing is missing, go on."""
    __tracebackhide__ = True  # the skip's location is the caller's line
    if missing is not None:
        pytest.skip(_tag(layer, missing))


def layer_skipif(layer: str, missing: str | None) -> pytest.MarkDecorator:
    """``pytest.mark.skipif`` for ``layer``: skips when ``missing`` is not None."""
    return pytest.mark.skipif(missing is not None, reason=_tag(layer, missing or ""))


def layer_failure(skip_reason: str) -> str | None:
    """The failure message for a skip with this reason, or None when it may skip: its
    layer is not required, or it carries no layer tag and is one of ``NO_LAYER_SKIPS``
    (an untagged skip that is not there fails whenever a layer is required)."""
    required = required_layers()
    if not required:
        return None
    m = _TAGGED.fullmatch(skip_reason)
    if m is None:
        reason = skip_reason.removeprefix("Skipped: ")
        if reason.startswith(tuple(NO_LAYER_SKIPS)):
            return None
        return (
            f"a skip without a layer tag: {reason}\n"
            f"({ENV_VAR}={os.environ[ENV_VAR]} makes it a failure: skip through "
            "required_layers.require_layer or layer_skipif with the layer it needs, or add "
            "the reason to required_layers.NO_LAYER_SKIPS if it may skip in CI)"
        )
    if m.group(1) not in required:
        return None
    layer, missing = m.groups()
    return (
        f"required test layer '{layer}' cannot run here: {missing}\n"
        f"({ENV_VAR}={os.environ[ENV_VAR]} makes this skip a failure; "
        "unset it to let the layer skip)"
    )


# ----------------------------------------------------------------- hooks (tests/conftest.py)


def pytest_configure(config: pytest.Config) -> None:
    required_layers()  # a bad value stops the run before any test


def pytest_report_header(config: pytest.Config) -> list[str]:
    layers = required_layers()
    return [f"required test layers ({ENV_VAR}): {', '.join(sorted(layers))}"] if layers else []


def _fail_a_required_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail") and isinstance(report.longrepr, tuple):
        failure = layer_failure(report.longrepr[2])
        if failure:
            report.outcome = "failed"
            report.longrepr = failure


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    report = yield
    _fail_a_required_skip(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> pytest.CollectReport:
    """A module that skips as a whole (``pytest.skip(..., allow_module_level=True)``):
    the same rule, as a collection error."""
    report = yield
    _fail_a_required_skip(report)
    return report
