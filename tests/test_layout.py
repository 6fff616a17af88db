"""The package's units stay small enough to read: no function or method in src/ longer
than 80 lines (``def`` to its last line, docstring included) and no module longer than
500 lines. ``scripts/layout_report.py`` prints the longest ones."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "hvdscale"
MAX_FUNCTION_LINES = 80
MAX_FILE_LINES = 500


def _name(path: Path) -> str:
    return str(path.relative_to(SRC.parent)) if path.is_relative_to(SRC.parent) else str(path)


def long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """'file:line name (N lines)' for every function or method of ``path`` over ``limit``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = node.end_lineno - node.lineno + 1
            if n > limit:
                out.append(f"{_name(path)}:{node.lineno} {node.name} ({n} lines)")
    return out


def long_files(paths, limit: int = MAX_FILE_LINES) -> list[str]:
    out = []
    for p in paths:
        n = len(p.read_text().splitlines())
        if n > limit:
            out.append(f"{_name(p)} ({n} lines)")
    return out


def test_the_checks_catch_a_long_function_and_a_long_file(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    f = tmp_path / "m.py"
    f.write_text(f"def short():\n    pass\n\n\ndef too_long():\n{body}\n")  # 81 lines
    assert [s.split(" ", 1)[1] for s in long_functions(f)] == ["too_long (81 lines)"]
    assert long_functions(f, limit=81) == []
    assert long_files([f], limit=84) and not long_files([f], limit=85)


def test_no_function_in_src_is_over_80_lines():
    found = [s for p in sorted(SRC.rglob("*.py")) for s in long_functions(p)]
    assert not found, "split these along their seams:\n" + "\n".join(found)


def test_no_module_in_src_is_over_500_lines():
    found = long_files(sorted(SRC.rglob("*.py")))
    assert not found, "split these along their seams:\n" + "\n".join(found)
