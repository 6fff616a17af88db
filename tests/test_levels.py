"""The package's levels: every module of src/hvdscale has a level in docs/extending.md,
imports only from its own level or a lower one, and the imports have no cycle, imports
inside functions included. The levels are read from the page, so page and code cannot
drift."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "hvdscale"
DOC = ROOT / "docs" / "extending.md"


def doc_levels(text: str) -> dict[str, int]:
    """{module name: level} from the numbered list under '## Levels'."""
    section = text.split("## Levels", 1)[1]
    levels: dict[str, int] = {}
    current = None
    for line in section.splitlines():
        m = re.match(r"^(\d+)\. (.*)", line)
        if m:
            current = int(m.group(1))
            body = m.group(2)
        elif current is not None and line.startswith("   "):
            body = line
        else:
            current = None if not line.strip() else current
            continue
        body = body.split(":")[0]  # names come before the description
        for name in re.findall(r"`([a-z_.]+)`", body):
            levels.setdefault(name, current)
    return levels


def level_of(module: str, levels: dict[str, int]) -> int | None:
    """Longest listed name that is the module or a parent; __main__ modules are entry points."""
    if module.split(".")[-1] == "__main__":
        return max(levels.values())
    best = None
    for name, lv in levels.items():
        if (module == name or module.startswith(name + ".")) and (
            best is None or len(name) > len(best[0])
        ):
            best = (name, lv)
    return best[1] if best else None


def modules(src: Path = SRC) -> dict[str, Path]:
    """{dotted module name below hvdscale: its file} of the package under ``src``."""
    out = {}
    for p in sorted(src.rglob("*.py")):
        parts = p.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts:
            out[".".join(parts)] = p
    return out


def imports(path: Path, top_level_only: bool) -> list[tuple[str, int]]:
    """(imported hvdscale module or module.name, line) of one file."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = []
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hvdscale"):
            base = node.module[len("hvdscale") :].lstrip(".")
            out += [(f"{base}.{a.name}" if base else a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.Import):
            out += [(a.name[9:], node.lineno) for a in node.names if a.name.startswith("hvdscale.")]
    return out


def resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The module an imported name belongs to ('analysis.stats.CI_METHOD' -> 'analysis.stats')."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


LEVELS = doc_levels(DOC.read_text())
MODULES = modules()


def test_the_page_lists_the_levels():
    assert LEVELS["errors"] == 1 and LEVELS["matrix"] == 2 and LEVELS["cli"] == 9
    assert level_of("launch.command", LEVELS) == 4 and level_of("slurm.jobspec", LEVELS) == 2
    assert level_of("trainer.horovod_tf.__main__", LEVELS) == 9


def test_every_module_has_a_level():
    missing = [m for m in MODULES if level_of(m, LEVELS) is None]
    assert not missing, f"modules without a level in {DOC.name} (## Levels): {missing}"


def test_no_import_from_a_higher_level():
    bad = []
    for mod, path in MODULES.items():
        mine = level_of(mod, LEVELS)
        for name, line in imports(path, top_level_only=False):
            target = resolve(name, MODULES)
            theirs = level_of(target, LEVELS) if target else None
            if mine is not None and theirs is not None and theirs > mine:
                bad.append(
                    f"{path.relative_to(ROOT)}:{line}: {mod} (level {mine}) imports "
                    f"{target} (level {theirs})"
                )
    assert not bad, "\n".join(bad)


def import_graph(mods: dict[str, Path], top_level_only: bool) -> dict[str, set[str]]:
    """{module: the package modules it imports} (``top_level_only``: module-level imports
    only; otherwise those inside functions too)."""
    return {
        mod: {t for n, _ in imports(path, top_level_only) if (t := resolve(n, mods))} - {mod}
        for mod, path in mods.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n) :] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (cycle := visit(m)):
            return cycle
    return None


@pytest.mark.parametrize("top_level_only", [True, False], ids=["module-level", "all imports"])
def test_no_import_cycle(top_level_only):
    """No circle among the package's imports, function-local imports included."""
    cycle = find_cycle(import_graph(MODULES, top_level_only))
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_check_sees_a_cycle_through_a_function_local_import(tmp_path):
    """A circle closed by an import inside a function is a circle too (the one
    clusters <-> runtable had): the full graph finds it, the module-level one does not."""
    pkg = tmp_path / "hvdscale"
    (pkg / "a").mkdir(parents=True)
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "low.py").write_text(
        "def problems(cfg):\n    from hvdscale.a.high import table\n\n    return table(cfg)\n"
    )
    (pkg / "a" / "high.py").write_text("from hvdscale.a.low import problems\n")
    mods = modules(pkg)
    assert find_cycle(import_graph(mods, top_level_only=True)) is None
    assert find_cycle(import_graph(mods, top_level_only=False)) in (
        ["a.high", "a.low", "a.high"],
        ["a.low", "a.high", "a.low"],
    )


def test_the_check_sees_an_upward_import(tmp_path):
    """The checker is not blind: a low module importing the report is found."""
    p = tmp_path / "x.py"
    p.write_text("from hvdscale.report.fmt import speedup\n")
    ((name, _),) = imports(p, top_level_only=True)
    assert level_of(resolve(name, MODULES), LEVELS) == 7 > LEVELS["errors"]


def top_level_names(path: Path) -> set[str]:
    """The functions a module defines at its top level, by ``def`` or by assignment
    (``add_x_arguments, run_x = make(...)``)."""
    names = set()
    for n in ast.parse(path.read_text()).body:
        if isinstance(n, ast.FunctionDef):
            names.add(n.name)
        elif isinstance(n, ast.Assign):
            for t in n.targets:
                names |= {e.id for e in getattr(t, "elts", [t]) if isinstance(e, ast.Name)}
    return names


def test_every_command_is_an_entry_beside_its_logic():
    """cli.COMMANDS names, for each subcommand, the module that does its work and defines
    its ``add_arguments``/``run`` ("module:name": ``add_<name>_arguments``/``run_<name>``);
    read from the source, so no environment's heavy library is imported here."""
    tree = ast.parse((SRC / "cli.py").read_text())
    table = next(
        n.value
        for n in tree.body
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "COMMANDS"
    )
    targets = [ast.literal_eval(v)[0] for v in table.values]
    assert len(targets) == len(table.keys) >= 20
    bad = []
    for target in targets:
        module, _, name = target.partition(":")
        path = MODULES.get(module[len("hvdscale.") :])
        wanted = {f"add_{name}_arguments", f"run_{name}"} if name else {"add_arguments", "run"}
        defined = top_level_names(path) if path else set()
        if not wanted <= defined:
            bad.append(f"{target}: lacks {sorted(wanted - defined)}")
    assert not bad, "\n".join(bad)


# fragments of the run-id grammar: a regex with one of them parses run ids
RUN_ID_FRAGMENTS = (r"_r[0-9]+$", r"_rerun_r", r"_cal_r", r"_wu[0-9]", r"_lr(")


def test_run_ids_are_parsed_only_where_they_are_defined():
    """matrix/runid.py defines and parses run ids; no other module carries a piece of
    their grammar (the analysis and the report call run_id_parts, run_kind, config_id)."""
    bad = []
    for mod, path in MODULES.items():
        if mod == "matrix.runid":
            continue
        tree = ast.parse(path.read_text())
        docs = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # docstrings
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
            ):
                hits = [f for f in RUN_ID_FRAGMENTS if f in node.value]
                if hits:
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {hits[0]!r}")
    assert not bad, "run-id grammar outside matrix/runid.py:\n" + "\n".join(bad)
