"""The packages depend one way: the task, oracle and measurements (``probes``) at the bottom; model code
(``models``) and CAPE (``cape``) above them, side by side; ``analyses`` and ``bench`` on top, imported by
nothing. Every import counts, including those inside functions: a cycle that a late import hides is
still a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RANK = {"probes": 0, "models": 1, "cape": 1, "analyses": 2, "bench": 2}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def our_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in RANK for p in sorted((ROOT / pkg).rglob("*.py"))}


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """Our modules that ``path`` imports anywhere in its body (``from P import x`` counts as P.x when
    that is a module, else P)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found.update(t for t in targets if t.split(".")[0] in RANK)
    found.discard(name)
    return found


def import_graph() -> dict[str, set[str]]:
    modules = our_modules()
    return {name: imports_of(path, name, set(modules)) for name, path in modules.items()}


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that go up, sideways between packages of one level, or into analyses/bench."""
    bad = []
    for src, targets in graph.items():
        a = src.split(".")[0]
        for dst in sorted(targets):
            b = dst.split(".")[0]
            if a == b:
                continue
            if RANK[b] > RANK[a] or RANK[b] == RANK[a] or b in ("analyses", "bench"):
                bad.append(f"{src} -> {dst}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle found by depth-first search (one representative per back edge)."""
    found, state, stack = [], {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_no_upward_or_sideways_import():
    assert layering_violations(import_graph()) == []


def test_no_import_cycle():
    assert cycles(import_graph()) == []


@pytest.mark.parametrize(
    "edges",
    [
        # the cycles the architecture issue listed on main at a506855
        [("probes.tasks", "models.checkpoint")],
        [("models.causal_transformer", "models.checkpoint")],
        [("models.checkpoint", "models.sources.folder")],  # models.formats then
        [("models.train", "models.continuous"), ("models.continuous", "models.train")],
        [("models.evaluate", "analyses.common")],
        [("bench.__main__", "analyses.common")],
    ],
)
def test_the_checks_catch_the_cycles_that_were_there(edges):
    graph = {k: set(v) for k, v in import_graph().items()}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)
    assert layering_violations(graph) or cycles(graph)


def test_imports_inside_functions_are_counted():
    src = "def f():\n    from models.checkpoint import read_config\n"
    path = ROOT / "tests" / "_layering_probe.py"
    path.write_text(src)
    try:
        assert "models.checkpoint" in imports_of(path, "probes.fake", set(our_modules()))
    finally:
        path.unlink()
