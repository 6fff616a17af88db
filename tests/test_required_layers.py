"""The required-layer switch (issue 29, tests/required_layers.py): without
HVDSCALE_REQUIRE_LAYERS a layer that cannot run skips; with its layer listed the skip
is a failure naming the layer, what was missing and the variable; a skip that is no
layer's stays a skip only where ``NO_LAYER_SKIPS`` lists it, any other untagged skip
(in a test or of a whole module) fails as well. Tiny test files in a pytester session,
in this process."""

from __future__ import annotations

import pytest
from required_layers import ENV_VAR, LAYERS

pytest_plugins = ["pytester"]

CONFTEST = """
from required_layers import (
    pytest_configure,
    pytest_make_collect_report,
    pytest_report_header,
    pytest_runtest_makereport,
)
"""
TESTS = """
import pytest
from required_layers import layer_skipif, require_layer

@pytest.fixture
def cluster():
    require_layer("slurm", "SLURM/munge not installed (missing munge)")

def test_in_fixture(cluster):
    pass

def test_in_body():
    require_layer("horovod", "Horovod is not installed in .venv-train yet")

@layer_skipif("poppler", "poppler-utils not installed")
def test_marker():
    pass

@layer_skipif("torch", None)
def test_layer_present():
    pass

def test_no_layer():
    pytest.skip("no writable cgroup here (not root)")

@pytest.mark.skipif(True, reason="needs torch without a GPU in .venv-train")
def test_no_layer_marker():
    pass

def test_untagged():
    pytest.skip("torch missing in .venv-train")

@pytest.mark.xfail(reason="[slurm] an expected failure is no skip")
def test_xfail():
    assert False
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    """Runs the tiny suite with ENV_VAR set to the given value (None: unset)."""
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_layers=TESTS)

    def run(value):
        if value is None:
            monkeypatch.delenv(ENV_VAR, raising=False)
        else:
            monkeypatch.setenv(ENV_VAR, value)
        return pytester.runpytest("-rA")

    return run


def test_without_the_variable_every_layer_skips(suite):
    result = suite(None)
    result.assert_outcomes(passed=1, skipped=6, xfailed=1)
    result.stdout.fnmatch_lines(["*[[]slurm[]] SLURM/munge not installed (missing munge)*"])
    result.stdout.no_fnmatch_line("*required test layers*")


def test_a_required_layer_fails_naming_layer_missing_thing_and_variable(suite):
    result = suite("slurm,horovod,poppler")
    # a skip in setup (fixture, marker) is an error at setup, in the test's body a failure
    # (the untagged skip is the second failure)
    result.assert_outcomes(passed=1, failed=2, errors=2, skipped=2, xfailed=1)
    result.stdout.fnmatch_lines(["required test layers (*): horovod, poppler, slurm"])
    for layer, missing in [
        ("slurm", "SLURM/munge not installed (missing munge)"),
        ("horovod", "Horovod is not installed in .venv-train yet"),
        ("poppler", "poppler-utils not installed"),
    ]:
        result.stdout.fnmatch_lines(
            [
                f"*required test layer '{layer}' cannot run here: {missing}*",
                f"*({ENV_VAR}=slurm,horovod,poppler makes this skip a failure*",
            ]
        )
    # the skips that are no layer's (NO_LAYER_SKIPS) stay skips
    result.stdout.fnmatch_lines(
        ["SKIPPED*no writable cgroup here (not root)", "SKIPPED*needs torch without a GPU*"]
    )


def test_only_the_listed_layers_fail(suite):
    result = suite("poppler")
    result.assert_outcomes(passed=1, failed=1, errors=1, skipped=4, xfailed=1)
    result.stdout.fnmatch_lines(["*required test layer 'poppler' cannot run here*"])


def test_all_requires_every_layer(suite):
    result = suite("all")
    result.assert_outcomes(passed=1, failed=2, errors=2, skipped=2, xfailed=1)
    result.stdout.fnmatch_lines([f"required test layers (*): {', '.join(sorted(LAYERS))}"])


@pytest.mark.parametrize("value", ["poppler", "all"])
def test_an_untagged_skip_fails_whatever_layer_is_required(suite, value):
    """No layer tag, not in NO_LAYER_SKIPS: it cannot be told from a layer that went
    missing, so it fails as soon as any layer is required, saying how to tag it."""
    result = suite(value)
    result.stdout.fnmatch_lines(
        [
            "*test_untagged*",
            "*a skip without a layer tag: torch missing in .venv-train*",
            f"*({ENV_VAR}={value} makes it a failure: skip through*NO_LAYER_SKIPS*",
        ]
    )
    result.stdout.fnmatch_lines(["FAILED*test_untagged*"])


def test_a_module_skipped_as_a_whole_fails_untagged_and_skips_tagged(pytester, monkeypatch):
    """``pytest.skip(allow_module_level=True)`` at import: a skipped collection, the same
    rule (a collection error when it fails)."""
    pytester.makeconftest(CONFTEST)
    body = "import pytest\npytest.skip({!r}, allow_module_level=True)\ndef test_x(): pass\n"
    pytester.makepyfile(
        test_untagged_module=body.format("needs the compilers on PATH"),
        test_tagged_module=body.format("[horovod] needs the compilers on PATH"),
    )
    monkeypatch.delenv(ENV_VAR, raising=False)
    pytester.runpytest().assert_outcomes(skipped=2)
    monkeypatch.setenv(ENV_VAR, "poppler")
    result = pytester.runpytest()
    result.assert_outcomes(skipped=1, errors=1)  # horovod is not required
    result.stdout.fnmatch_lines(
        ["*ERROR collecting test_untagged_module.py*", "*a skip without a layer tag: needs*"]
    )
    monkeypatch.setenv(ENV_VAR, "horovod")
    result = pytester.runpytest()
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*required test layer 'horovod' cannot run here: needs*"])


def test_an_unknown_layer_stops_the_run(suite):
    result = suite("slurm,multinod")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{ENV_VAR}: unknown layer(s) multinod; layers: *"])


def test_a_site_cannot_name_an_unknown_layer():
    from required_layers import require_layer

    with pytest.raises(ValueError, match="unknown test layer 'gpu'"):
        require_layer("gpu", "no GPU")
