"""The import graph runs one way: no module of voicepipe/, scheduler/ or kernels/ imports one that imports
it back. Type-only imports (under TYPE_CHECKING) and imports inside functions never fail at load time, but
a circle through them is still two modules that each need the other: they are held to the same rule. And
the layers hold: scheduler never imports voicepipe, kernels neither."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("voicepipe", "scheduler", "kernels")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def load_time_imports(path: Path, name: str, known: set[str], types: bool = False, inside: bool = False
                      ) -> set[str]:
    """The project modules `path` imports when it loads (with `types`, and those it imports for types; with
    `inside`, and those its functions import when they run)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If):
                if types or "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
            elif inside and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.With
                                       | ast.AsyncWith | ast.For | ast.AsyncFor | ast.While):
                visit(node.body + getattr(node, "orelse", []))
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1]) if node.level else ""
                base = ".".join(p for p in (base, node.module or "") if p)
                found.add(base)
                found.update(f"{base}.{a.name}" for a in node.names)

    visit(tree.body)
    return {m for m in found if m in known and m != name}


def graph(types: bool = False, inside: bool = False) -> dict[str, set[str]]:
    paths = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    known = set(paths)
    edges = {name: load_time_imports(path, name, known, types, inside) for name, path in paths.items()}
    for name in edges:  # importing a.b.c loads a and a.b first: the importer's own and those of what it imports
        ancestors = parents(name)
        edges[name] |= ancestors & known - {name}
        edges[name] |= {p for m in list(edges[name]) for p in parents(m)} & known - ancestors - {name}
    return edges


def parents(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle found by a depth-first walk, as the path around it."""
    found, state, stack = [], {}, []

    def walk(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            walk(node)
    return found


@pytest.mark.parametrize("types, inside", [(False, False), (True, False), (True, True)],
                         ids=["load-time", "with-type-only", "with-imports-in-functions"])
def test_no_module_imports_one_that_imports_it_back(types: bool, inside: bool):
    edges = graph(types, inside)
    # a package's __init__ importing its own modules is how a package loads, not a circle through it
    edges = {n: {m for m in e if not n.startswith(m + ".")} for n, e in edges.items()}
    assert cycles(edges) == []


@pytest.mark.parametrize("types", [False, True], ids=["load-time", "with-type-only"])
def test_the_scheduler_and_the_kernels_know_nothing_of_the_layers_above(types: bool):
    for name, imports in graph(types).items():
        if name.startswith("scheduler"):
            assert not {m for m in imports if m.startswith("voicepipe")}, name
        if name.startswith("kernels"):
            assert not {m for m in imports if m.startswith(("voicepipe", "scheduler"))}, name


def test_a_circle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_type_only_imports_and_imports_in_functions_are_seen(tmp_path: Path):
    module = tmp_path / "a.py"
    module.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import b\nimport c\n"
                      "def f():\n    with open('x'):\n        import d\n")
    assert load_time_imports(module, "a", {"b", "c", "d"}) == {"c"}
    assert load_time_imports(module, "a", {"b", "c", "d"}, types=True) == {"b", "c"}
    assert load_time_imports(module, "a", {"b", "c", "d"}, types=True, inside=True) == {"b", "c", "d"}


def test_the_engine_bench_entry_point_loads_no_command_line():
    """`python -m voicepipe.bench` runs where the audio packages the commands import are missing."""
    edges, seen, todo = graph(), set(), ["voicepipe.bench.__main__"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(edges[name])
    assert not {m for m in seen if m.startswith("voicepipe.cli")}


# The folders of voicepipe/ from the bottom floor up (with the scheduler and the kernels beneath them): a
# module imports only its own folder and the floors below, never a folder beside it or above. The order is
# written in docs/development.md.
FLOORS = (("kernels",), ("scheduler",),
          ("voicepipe", "ids", "audio", "wire_audio", "web_files", "samples", "metric_families"),
          ("backends", "constrained", "sip"), ("mcp_servers",), ("protocol",), ("pipeline",), ("frontend", "turns"),
          ("call",), ("server", "local"), ("cluster", "bench"), ("simulate",), ("cli",), ("__main__",))


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if parts[0] == "voicepipe" and len(parts) > 1 else parts[0]


def test_each_folder_imports_only_the_floors_below_it_imports_in_functions_and_for_types_too():
    floor = {name: level for level, names in enumerate(FLOORS) for name in names}
    up = []
    for module, imports in graph(types=True, inside=True).items():
        here = folder(module)
        assert here in floor, f"{here} (of {module}) is on no floor: add it to FLOORS and docs/development.md"
        up += [f"{module} -> {m}" for m in imports if folder(m) != here and floor[folder(m)] >= floor[here]
               and not module.startswith(m + ".")]  # its own packages load first: no arrow
    assert up == []


def defined_names(path: Path) -> set[str]:
    """What a module defines at its top level (functions, classes, assignments, imports, and what its
    `__all__` names, which a lazy `__getattr__` provides)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                names.update(ast.literal_eval(node.value))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, optional imports
            names.update((a.asname or a.name).split(".")[0] for inner in ast.walk(node)
                         if isinstance(inner, ast.Import | ast.ImportFrom) for a in inner.names)
    return names


def test_every_name_imported_from_the_project_exists_where_it_is_imported_from():
    """Imports inside functions (the commands load what they run on first use) fail only when they run: a
    name moved to another module must be followed everywhere, or a command breaks that no test runs."""
    paths = {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    defined = {name: defined_names(path) for name, path in paths.items()}
    missing = []
    for name, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in paths:
                missing += [f"{name}: {node.module}.{a.name}" for a in node.names
                            if a.name not in defined[node.module] and f"{node.module}.{a.name}" not in paths]
    assert not missing, missing
