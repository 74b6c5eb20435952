"""The modules of pyfastensor and of the repository's benchmarks import each other without cycles,
and the installed package never imports the benchmarks.

The graph is read from the source with :mod:`ast`: every ``import`` and
``from ... import`` statement, at module level or inside a function,
resolved to the module it names (``from . import x`` to the submodule ``x``
where there is one, else to the package). Imports under ``if TYPE_CHECKING:``
are left out: they never run. A package's own ``__init__`` that its
submodules load implicitly is not an edge either (every submodule would
otherwise "import" its package).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pyfastensor", "benchmarks")


def modules() -> dict[str, Path]:
    """Dotted name -> source file of every module of :data:`PACKAGES`."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    out: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if _type_checking(child):
                for sub in child.orelse:  # the else branch does run
                    walk_node(sub)
                continue
            walk_node(child)

    def walk_node(node: ast.AST) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        walk(node)

    walk(tree)
    return out


def _known(name: str, known: dict[str, Path]) -> str | None:
    """``name`` or its longest prefix that is one of ``known``."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        candidate = ".".join(parts[:i])
        if candidate in known:
            return candidate
    return None


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of :data:`PACKAGES` it imports (itself left out)."""
    known = modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        is_pkg = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text(), str(path))):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [_known(a.name, known) for a in node.names]
            else:
                if node.level:
                    base_parts = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for a in node.names:
                    sub = f"{base}.{a.name}"
                    targets.append(sub if sub in known else _known(base, known))
            graph[mod] |= {t for t in targets if t and t != mod}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


GRAPH = import_graph()


def test_the_graph_sees_both_packages_and_function_level_imports():
    assert len([m for m in GRAPH if m.startswith("pyfastensor.")]) > 30
    assert "benchmarks.harness" in GRAPH["benchmarks.checkpoint"]
    assert "benchmarks.data_nodes" in GRAPH["benchmarks.data"]  # inside _cmd_data
    assert "pyfastensor.engines" in GRAPH["benchmarks.checkpoint"]  # inside read_into_new_memory
    assert "pyfastensor.bench.io" in GRAPH["pyfastensor.bench"]  # inside add_parsers


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("mod", sorted(m for m in GRAPH if m.split(".")[0] == "pyfastensor"))
def test_the_package_never_imports_the_benchmarks(mod):
    assert not {t for t in GRAPH[mod] if t.split(".")[0] == "benchmarks"}


def test_benchmarks_use_only_the_public_api():
    private = {m: sorted(t for t in targets if t.startswith("pyfastensor")
                         and any(p.startswith("_") for p in t.split(".")))
               for m, targets in GRAPH.items() if m.split(".")[0] == "benchmarks"}
    assert {m: t for m, t in private.items() if t} == {}


def private_torch_names(source: str) -> set[str]:
    """The private torch names ``source`` reaches: ``torch._C``, ``torch.serialization._load``,
    ``from torch.utils._pytree import ...``, ``from torch import _weights_only_unpickler``.
    Each is written up to its first private part (``torch._C`` for ``torch._C._foo``)."""
    found: set[str] = set()

    def private(parts: list[str]) -> str | None:
        for i, p in enumerate(parts):
            if p.startswith("_") and not p.startswith("__"):
                return ".".join(parts[: i + 1])
        return None

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            parts: list[str] = []
            n: ast.AST = node
            while isinstance(n, ast.Attribute):
                parts.append(n.attr)
                n = n.value
            if isinstance(n, ast.Name) and n.id == "torch":
                name = private(["torch", *reversed(parts)])
                if name:
                    found.add(name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch" and (name := private(a.name.split("."))):
                    found.add(name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            for a in node.names:
                if name := private([*node.module.split("."), a.name]):
                    found.add(name)
    return found


def test_private_torch_names_are_found():
    src = ("import torch._guards\nfrom torch import _weights_only_unpickler, nn\n"
           "from torch.utils._pytree import tree_flatten\nfrom torch.utils.data import DataLoader\n"
           "x = torch._C._storage_Use_Count(s)\ny = torch.serialization._load(z)\n"
           "z = torch.UntypedStorage._new_shared(1)\nw = torch.serialization.location_tag(s)\n")
    assert private_torch_names(src) == {
        "torch._guards", "torch._weights_only_unpickler", "torch.utils._pytree", "torch._C",
        "torch.serialization._load", "torch.UntypedStorage._new_shared"}


#: Private torch names a benchmark may reach itself: a peer's own knob, which the peer is measured
#: by (torch.compile's ``torch._functorch.config.activation_memory_budget``, applied by a backend
#: over inductor's ``compile_fx``), not a name pyfastensor depends on.
PEER_KNOBS = {"benchmarks.pareto": ["torch._functorch", "torch._inductor"]}


def test_only_the_torch_module_uses_torchs_private_names():
    """pyfastensor/_torch.py is where every private torch name is reached, with what each
    supported torch does; the package and the benchmarks import them from there (but for a
    peer's own knob, :data:`PEER_KNOBS`)."""
    users = {m: sorted(private_torch_names(p.read_text())) for m, p in modules().items()
             if m != "pyfastensor._torch"}
    assert {m: names for m, names in users.items() if names} == PEER_KNOBS
    assert "torch.serialization._load" in private_torch_names(
        (ROOT / "pyfastensor" / "_torch.py").read_text())
