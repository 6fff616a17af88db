"""The user-facing text: a short README, links that resolve, no issue numbers."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from hvdscale.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 160
# "issue 29", "Issue 12": tracker numbers mean nothing to a user
ISSUE_NUMBER = re.compile(r"[Ii]ssue [0-9]+")
# a Markdown link or image: [text](target) / ![alt](target)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def markdown_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def user_text_files() -> list[Path]:
    files = markdown_pages()
    for folder in ("config", "profiles"):
        files += sorted(p for p in (ROOT / folder).rglob("*") if p.is_file())
    return files


def broken_links(page: Path) -> list[str]:
    """Relative link targets of ``page`` (anchors stripped) that name no file or folder."""
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # http:, https:, mailto: and anchors within the page
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    return broken


def issue_numbers(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if ISSUE_NUMBER.search(line)]


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move reference "
        "detail to docs/"
    )


def test_broken_links_are_found(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("x")
    page.write_text(
        "[a](there.md) [b](there.md#part) [c](missing.md) ![d](img/none.png) "
        "[e](https://example.org/x) [f](#local)"
    )
    assert broken_links(page) == ["missing.md", "img/none.png"]


@pytest.mark.parametrize("page", markdown_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == [], f"{page.relative_to(ROOT)}: links to nothing"


def test_issue_numbers_are_found():
    assert issue_numbers("fine\nsee issue 29 here\nIssue 7\nissues tracker") == [
        "see issue 29 here",
        "Issue 7",
    ]


def test_no_issue_numbers_in_user_text():
    found = {}
    for path in user_text_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if hits := issue_numbers(text):
            found[str(path.relative_to(ROOT))] = hits
    assert found == {}, f"issue numbers in user-facing text: {found}"


def command_help(name: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
        main([name, "--help"])
    assert exit_info.value.code == 0, f"hvdscale {name} --help exited {exit_info.value.code}"
    return out.getvalue()


def test_no_issue_numbers_in_cli_help():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])
    helps = {"hvdscale": out.getvalue()}
    helps.update({name: command_help(name) for name in COMMANDS})
    assert all(f"hvdscale {name}" in text for name, text in helps.items() if name != "hvdscale")
    found = {name: hits for name, text in helps.items() if (hits := issue_numbers(text))}
    assert found == {}, f"issue numbers in the command-line help: {found}"
