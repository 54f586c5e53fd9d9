"""The packages depend one way: the task, oracle and measurements (``probes``) at the bottom; model code
(``models``) and CAPE (``cape``) above them, side by side; ``analyses`` and ``bench`` on top, imported by
nothing, and no analysis imports another (only ``analyses.common``, the shared main). Model code lives in
one of ``models``' rooms, and the rooms are a stack: each imports only the rooms below it (``ROOMS``, the
one declaration of their order). Every import counts, including those inside functions and the names
``models/__init__.py`` imports on first use (``_PUBLIC``): a cycle that a late import hides is still a cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RANK = {"probes": 0, "models": 1, "cape": 1, "analyses": 2, "bench": 2}
# models' rooms, bottom to top: each imports only those before it (each __init__'s docstring, or the module's,
# says what belongs there). plumbing: files, JSON, locks, errors (standard library only); nets: the networks;
# loading: a --checkpoint to a model; interp: what analyses do to a model; cli: the command-line convention
# and loading subjects for it; training: the trainers and their command lines.
ROOMS = ("plumbing", "nets", "loading", "interp", "cli", "training")
# `python -m models.train|standard|evaluate` as the docs write them (a __main__.py each): each runs its trainer
LAUNCHERS = {f"models.{m}.__main__": f"models.training.{m}" for m in ("train", "standard", "evaluate")}
FACADE = "models"  # models/__init__.py: the public names, each imported from its room on first use
SHARED_BY_ANALYSES = {"analyses.common"}  # what an analysis may import of analyses/
# an analysis re-run under another name, nothing of its own: inspect on the shipped standard GPT-2 (its own
# figure set, so the paper run keeps both models' reports)
VARIANTS = {("analyses.inspect_standard", "analyses.inspect")}


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


def facade_imports() -> set[str]:
    """The modules ``models/__init__.py`` imports its public names from on first use (its ``_PUBLIC`` table)."""
    tree = ast.parse((ROOT / "models" / "__init__.py").read_text())
    table = next(
        node.value for node in tree.body if isinstance(node, ast.AnnAssign | ast.Assign) and "_PUBLIC" in ast.unparse(node)
    )
    return {ast.literal_eval(v) for v in table.values}


def import_graph() -> dict[str, set[str]]:
    modules = our_modules()
    graph = {name: imports_of(path, name, set(modules)) for name, path in modules.items()}
    graph[FACADE] |= facade_imports()
    return graph


def room_of(module: str) -> int | None:
    """The rank of ``module``'s room in ``ROOMS`` (a launcher is above them all, the facade just above the
    rooms it draws from), or None outside ``models``."""
    parts = module.split(".")
    if parts[0] != "models":
        return None
    if module == FACADE:
        return max(room_of(m) for m in facade_imports())
    if module in LAUNCHERS:
        return len(ROOMS)
    return ROOMS.index(parts[1]) if parts[1] in ROOMS else None


def room_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports from one room of ``models`` into a room above it."""
    bad = []
    for src, targets in graph.items():
        for dst in sorted(targets):
            a, b = room_of(src), room_of(dst)
            if a is not None and b is not None and b > a:
                bad.append(f"{src} ({ROOMS[a] if a < len(ROOMS) else 'launcher'}) -> {dst} ({ROOMS[b] if b < len(ROOMS) else 'launcher'})")
    return bad


def layering_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports that go up, sideways between packages of one level, into analyses/bench, or from one
    analysis into another."""
    bad = []
    for src, targets in graph.items():
        a = src.split(".")[0]
        for dst in sorted(targets):
            b = dst.split(".")[0]
            if a == b == "analyses" and dst not in SHARED_BY_ANALYSES and (src, dst) not in VARIANTS:
                bad.append(f"{src} -> {dst}")
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


def test_every_room_imports_only_the_rooms_below_it():
    assert room_violations(import_graph()) == []


@pytest.mark.parametrize(
    "edge",
    [
        # the upward imports issue 42 counted on main at 3a6bec8, one per pair of rooms
        ("models.nets.causal_transformer", "models.interp.patching"),
        ("models.nets.theorem1", "models.loading.checkpoint"),
        ("models.loading.sources.state_dict", "models.cli"),
        ("models.interp.baselines", "models.training.standard"),
        ("models.plumbing.io", "models.loading.named"),
        ("models.cli", "models.training.evaluate"),
        ("models.nets.causal_transformer", "models"),  # the facade draws from interp
    ],
)
def test_the_room_check_catches_an_upward_import(edge):
    graph = {k: set(v) for k, v in import_graph().items()}
    graph[edge[0]].add(edge[1])
    assert room_violations(graph)


def test_model_code_lives_in_a_room():
    graph = import_graph()
    loose = [m for m in graph if m.startswith("models.") and m.split(".")[1] not in ROOMS and m not in LAUNCHERS]
    assert loose == []
    for launcher, module in LAUNCHERS.items():  # a launcher holds no code of its own
        assert graph[launcher] <= {module, "models.cli"}, launcher


@pytest.mark.parametrize(
    "edges",
    [
        # the cycles the architecture issue listed on main at a506855
        [("probes.tasks", "models.loading.checkpoint")],
        [("models.nets.causal_transformer", "models.loading.checkpoint")],
        [("models.loading.checkpoint", "models.loading.sources.folder")],  # models.formats then
        [("models.training.train", "models.nets.continuous"), ("models.nets.continuous", "models.training.train")],
        [("models.evaluate", "analyses.common")],
        [("bench.__main__", "analyses.common")],
        # the analysis-to-analysis imports issue 33 removed
        [("analyses.trajectory", "analyses.inspect")],
        [("analyses.bma_agreement", "analyses.block_structure")],
    ],
)
def test_the_checks_catch_the_cycles_that_were_there(edges):
    graph = {k: set(v) for k, v in import_graph().items()}
    for src, dst in edges:
        graph.setdefault(src, set()).add(dst)
    assert layering_violations(graph) or cycles(graph)


def test_imports_inside_functions_are_counted():
    src = "def f():\n    from models.loading.checkpoint import read_config\n"
    path = ROOT / "tests" / "_layering_probe.py"
    path.write_text(src)
    try:
        assert "models.loading.checkpoint" in imports_of(path, "probes.fake", set(our_modules()))
    finally:
        path.unlink()
