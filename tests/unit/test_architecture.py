"""The house plan, enforced: no import cycle inside forgekit/, between modules or between packages (top-level
and function-level imports alike, ``if TYPE_CHECKING:`` ones excluded), modules under ~400 lines, one backend
package per device kind with one visible pipeline, and a CLI that only adapts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "forgekit"
MAX_LINES = 420
#: the only imports allowed to point up a layer: an old spelling of a name that moved up, forwarded on first use
#: with a DeprecationWarning (module -> where the names went); drop an entry with its alias
DEPRECATED_ALIASES = {"forgekit.offload.tidl_partition": "forgekit.model.tidl"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    walk(sub)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            walk(child)

    walk(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    """module -> the forgekit modules its import statements execute: the imported module and every package
    above it that is not a package above the importer (Python runs a package's ``__init__`` before any of
    its submodules, so a cycle through an ``__init__`` is a real cycle).  The one import left out is a
    :data:`DEPRECATED_ALIASES` module's import of where its names went."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                for alias in node.names:
                    sub = f"{prefix}.{alias.name}"
                    targets.append(sub if sub in modules else prefix)
            for target in targets:
                if not target.startswith("forgekit"):
                    continue
                while target not in modules and "." in target:
                    target = target.rpartition(".")[0]
                if DEPRECATED_ALIASES.get(name) == target:
                    continue
                chain = target.split(".")
                own = name.split(".")
                for depth in range(1, len(chain) + 1):
                    module = ".".join(chain[:depth])
                    if module in modules and own[:depth] != chain[:depth] and module != name:
                        graph[name].add(module)
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return cycles


def test_no_import_cycle_inside_forgekit() -> None:
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """forgekit's packages and top-level modules (``forgekit.targets``, ``forgekit.build``) -> those that any of
    their modules imports.  A function-level (lazy) import counts: it runs as surely as a top-level one, only
    later, and a lazy import that closes a cycle between packages is a layering fault that a module-level
    check cannot see (targets <-> backends <-> artifact <-> runtime <-> devices, and model <-> offload, were).
    ``forgekit/__init__`` is left out: it re-exports the public API of every layer."""
    def unit(module: str) -> str:
        return ".".join(module.split(".")[:2])

    packages: dict[str, set[str]] = {}
    for module, imported in graph.items():
        if module == "forgekit":
            continue
        edges = packages.setdefault(unit(module), set())
        edges.update(unit(t) for t in imported if t != "forgekit" and unit(t) != unit(module))
    return packages


def test_no_import_cycle_between_packages() -> None:
    cycles = find_cycles(package_graph(import_graph()))
    assert not cycles, "package cycles (move the shared code down a layer): " + "; ".join(
        " <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("alias", sorted(DEPRECATED_ALIASES))
def test_deprecated_aliases_warn_and_forward(alias: str) -> None:
    """An alias the package check lets through must be one: each moved name still resolves, with a warning."""
    import importlib

    module = importlib.import_module(alias)
    assert module._MOVED and set(module._MOVED.values()) == {DEPRECATED_ALIASES[alias]}
    for name, target in module._MOVED.items():
        with pytest.warns(DeprecationWarning, match=target):
            assert getattr(module, name) is getattr(importlib.import_module(target), name)


def test_each_device_kind_has_one_backend_package_with_one_visible_pipeline() -> None:
    """backends/<kind>/pipeline.py holds the whole lowering of that kind (numbered phases, as TVM's
    relax/backend/<kind>/pipeline.py), and backends/pipeline.py picks it by kind."""
    from forgekit.targets.families import FAMILIES

    kinds = {family.DEVICE for family in FAMILIES.values()}
    assert kinds == {"cpu", "cuda"}, f"a new device kind: give it forgekit/backends/<kind>/ ({kinds})"
    for kind in sorted(kinds):
        pipeline = PACKAGE / "backends" / kind / "pipeline.py"
        assert pipeline.is_file(), f"{kind}: no backends/{kind}/pipeline.py"
        text = pipeline.read_text()
        assert "def lowering_pipeline(" in text and "phase 1" in text, f"{pipeline}: no phased lowering_pipeline"


def test_cuda_compile_knowledge_stays_in_the_cuda_backend() -> None:
    """Only forgekit.backends reaches into backends/cuda (nvcc, the fatbin, the CUDA pipeline); targets/ keeps the
    host side and the tag table, build.py and the artifact writer ask backends/ by device kind."""
    reaching = {module for module, imported in import_graph().items()
                if any(t.startswith("forgekit.backends.cuda") for t in imported)}
    outside = {m for m in reaching if not m.startswith("forgekit.backends")}
    assert not outside, f"modules outside forgekit/backends/ import the CUDA backend: {sorted(outside)}"


def test_packages_import_only_the_layers_below_theirs() -> None:
    """docs/architecture.md draws the layers, top to bottom; every package and top-level module is on one line,
    and imports only from lines below its own."""
    import re

    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    block = doc.split("Packages (and top-level modules) import only", 1)[1].split("```", 2)[1]
    rows = [re.findall(r"(?:^|\s)([a-z_]+)(?:/|\.py)", re.sub(r"\([^)]*\)", "", line)) for line in block.splitlines()]
    layer = {f"forgekit.{name}": -depth for depth, names in enumerate(r for r in rows if r) for name in names}
    graph = package_graph(import_graph())
    missing = sorted(set(graph) - set(layer) - {"forgekit.__main__"})
    assert not missing, f"add these to the layers of docs/architecture.md: {missing}"
    upward = [f"{a} -> {b}" for a, imported in graph.items() for b in imported
              if a in layer and b in layer and layer[b] >= layer[a]]
    assert not upward, f"imports at or above their own layer (docs/architecture.md): {sorted(upward)}"


def test_a_lazy_import_between_packages_makes_a_package_cycle() -> None:
    graph = {"forgekit.a.x": {"forgekit.b", "forgekit.b.y"}, "forgekit.b": set(), "forgekit.b.y": {"forgekit.a.z"},
             "forgekit.a.z": set(), "forgekit.c": {"forgekit.a.x"}}
    assert find_cycles(package_graph(graph)) == [["forgekit.a", "forgekit.b"]]


def test_the_cycle_finder_finds_cycles() -> None:
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name", sorted(_modules()))
def test_modules_stay_small(name: str) -> None:
    lines = len(_modules()[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it by concern (house rule: ~400)"


def test_cli_holds_no_artifact_crypto_or_compile_logic() -> None:
    """The verbs adapt: they never call the crypto byte functions, TVM, or write artifact files themselves."""
    forbidden = ("encrypt_library", "decrypt_library", "export_library", "render_metadata", "atomic_directory",
                 "import tvm", "from tvm")
    for path in (PACKAGE / "cli").glob("*.py"):
        text = path.read_text()
        hits = [f for f in forbidden if f in text]
        assert not hits, f"{path.name} does stage work itself: {hits}"


def test_every_package_ships_in_the_wheel() -> None:
    """pyproject.toml lists packages by hand: a package left out installs nowhere (forgekit.quantize once did)."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")
               for p in [p.parent]}
    assert on_disk - listed == set(), "add these packages to [tool.setuptools] packages in pyproject.toml"
