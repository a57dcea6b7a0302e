"""The module boundaries of the design, checked from the source (``ast``; nothing is imported).

* Every top-level package is in one layer, and dependencies run one way:
  ``config -> demo -> console -> api -> operators -> sagas -> ledger -> core`` (``config`` is only
  the wiring: settings, URLs, ASGI/WSGI; ``demo`` is the example app, installed by
  ``config.settings_demo`` only; ``console`` is the web pages, ``api`` the HTTP API, and
  ``operators`` what both let a person do: roles, tenants, audit and the actions; ``core`` is the
  bottom layer every app shares). So there is no cycle between packages,
  and none inside a package either. Every import counts, at module level or inside a function:
  a function-level import is how a cycle usually hides. Imports under ``if TYPE_CHECKING:``
  never run and are left out.
* No module uses another module's private name (``from m import _x``, ``m._x``,
  ``obj._x`` where ``_x`` is not defined in the module itself). Dunder names are public.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("config", "demo", "console", "api", "operators", "sagas", "ledger", "core")  # each may import only the ones after it
SKIP_DIRS = {"migrations", "bench", "node_modules", "__pycache__"}

# Private-looking names that are documented public API of what they belong to.
PUBLIC_PRIVATES = {
    "_meta",  # Django's model options API (documented: "Model _meta API")
    "_exit",  # os._exit: end the process without cleanup (crash points)
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_files(package: str) -> list[Path]:
    return sorted(
        p for p in (ROOT / package).rglob("*.py") if not SKIP_DIRS.intersection(p.relative_to(ROOT).parts)
    )


ALL_MODULES = {module_name(p): p for package in LAYERS for p in package_files(package)}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node, except what sits under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def imports_of(module: str, tree: ast.AST) -> set[str]:
    """The modules of ours that ``module`` imports (resolved: ``from sagas.runtime import queue`` is
    ``sagas.runtime.queue``; ``from sagas import start`` is the package ``sagas`` itself)."""
    found: set[str] = set()
    package = module if ALL_MODULES.get(module, Path()).name == "__init__.py" else module.rpartition(".")[0]
    for node in runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in ALL_MODULES else base)
    return {name for name in found if name in ALL_MODULES and name != module}


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


GRAPH = {module: imports_of(module, parse(path)) for module, path in ALL_MODULES.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle in ``graph``, as a list of modules, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        state[node] = 2
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


@pytest.mark.parametrize("package", LAYERS)
def test_it_finds_no_import_cycle_inside_a_package(package):
    inside = {
        module: {m for m in targets if m.split(".")[0] == package}
        for module, targets in GRAPH.items()
        if module.split(".")[0] == package
    }
    cycle = find_cycle(inside)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_it_finds_every_package_importing_only_the_layers_below_it():
    wrong = []
    for module, targets in sorted(GRAPH.items()):
        layer = LAYERS.index(module.split(".")[0])
        for target in sorted(targets):
            if LAYERS.index(target.split(".")[0]) < layer:
                wrong.append(f"{module} imports {target}")
    assert wrong == []


def test_it_catches_a_cycle_and_a_function_level_import():
    """The checks above can fail: a made-up cycle, hidden in a function, is found."""
    source = "import ledger.models\n\ndef f():\n    from sagas.runtime import queue\n"
    assert imports_of("sagas.a", ast.parse(source)) == {"ledger.models", "sagas.runtime.queue"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def private_uses(tree: ast.Module) -> list[str]:
    """Uses of a private name that this module does not define itself."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
    found: list[tuple[int, str]] = []
    for node in runtime_nodes(tree):
        names: list[tuple[str, int]] = []
        if isinstance(node, ast.ImportFrom):
            names = [(f"from {node.module} import {a.name}", node.lineno) for a in node.names if _private(a.name)]
        elif isinstance(node, ast.Attribute) and _private(node.attr) and node.attr not in PUBLIC_PRIVATES:
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if node.attr in own:
                continue
            names = [(f"{ast.unparse(node)}", node.lineno)]
        found += [(line, f"line {line}: {text}") for text, line in names]
    return [text for _, text in sorted(found)]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@pytest.mark.parametrize("module", sorted(ALL_MODULES))
def test_it_finds_no_module_using_another_modules_private_name(module):
    assert private_uses(parse(ALL_MODULES[module])) == []


def test_it_catches_a_private_name_from_elsewhere():
    tree = ast.parse("from sagas.effects import _KINDS\nctx._append(1)\nself._ok = 1\nself._ok\nx._ok\n")
    assert private_uses(tree) == ["line 1: from sagas.effects import _KINDS", "line 2: ctx._append"]


def test_it_places_every_top_level_package_in_a_layer():
    """A new package cannot escape the checks: each one at the top is in LAYERS (tests and the
    benchmarks are not shipped: pyproject.toml packages only the layers)."""
    packages = {p.parent.name for p in ROOT.glob("*/__init__.py")} - {"tests", "bench"}
    assert packages == set(LAYERS)


def test_it_finds_no_cycle_between_packages():
    between: dict[str, set[str]] = {}
    for module, targets in GRAPH.items():
        between.setdefault(module.split(".")[0], set()).update(
            t.split(".")[0] for t in targets if t.split(".")[0] != module.split(".")[0])
    assert set(between) == set(LAYERS)
    assert find_cycle(between) is None


# What other packages may import from sagas: the public API, and the documented extension
# modules (sagas/integration.py's docstring lists them). The rest of sagas is internal.
SAGAS_EXTENSIONS = {"sagas", "sagas.integration", "sagas.models", "sagas.selectors", "sagas.errors", "sagas.events",
                    "sagas.agents", "sagas.testing"}


def test_it_finds_other_packages_importing_only_the_public_api_of_sagas():
    internal = [
        f"{module} imports {target}"
        for module, targets in sorted(GRAPH.items()) if module.split(".")[0] != "sagas"
        for target in sorted(targets) if target.split(".")[0] == "sagas" and target not in SAGAS_EXTENSIONS
    ]
    assert internal == []
