"""The layer rule of docs/architecture.md, checked on the package's imports.

Every ``import`` of the package is read with ``ast`` (at module top, inside functions and
under ``if TYPE_CHECKING``) and mapped to its stage. An import may go to its own stage or to
one the table below allows (down only); the stages' table is acyclic, and so is the import
graph between modules. An import inside a function of another ``bayesprism`` module carries a
comment saying why (only ``cli/`` defers its imports as a rule, for start-up time).
"""

from __future__ import annotations

import ast
import graphlib
import textwrap
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "bayesprism"

#: Stage of each module: the first prefix that matches (most specific first).
STAGES: tuple[tuple[str, str], ...] = (
    ("bayesprism.cli", "cli"),
    ("bayesprism.report", "report"),
    ("bayesprism.checks", "checks"),
    ("bayesprism.analysis", "analysis"),
    ("bayesprism.forecast", "forecast"),
    ("bayesprism.simulate", "simulate"),
    ("bayesprism.inference", "inference"),
    ("bayesprism.learn_prior", "inference"),
    ("bayesprism.statistics", "inference"),
    ("bayesprism.model", "model"),
    ("bayesprism.ingest", "ingest"),
    ("bayesprism.costs", "costs"),
    ("bayesprism._version", "base"),
    ("bayesprism.errors", "base"),
    ("bayesprism.outputs", "base"),
    ("bayesprism.schema", "base"),
    ("bayesprism.spec", "base"),
    ("bayesprism.plan", "base"),
    ("bayesprism.io", "base"),
    ("bayesprism.inventory", "base"),
    ("bayesprism.posterior", "base"),
    ("bayesprism.layout_prior", "base"),
    ("bayesprism.population_prior", "base"),
    ("bayesprism", "api"),
)

#: What each stage may import besides itself (docs/architecture.md, "Layer rule").
ALLOWED: dict[str, set[str]] = {
    "base": set(),
    "costs": {"base"},
    "ingest": {"base"},
    "model": {"base", "costs"},
    "inference": {"base", "ingest", "model"},
    "simulate": {"base", "costs", "ingest"},
    "forecast": {"base", "costs"},
    "analysis": {"base", "forecast"},
    "checks": {"base", "costs", "model", "inference", "forecast"},
    "report": {"base", "forecast", "checks"},
    "api": {"base"},
    "cli": {"base", "costs", "ingest", "model", "inference", "simulate", "forecast", "analysis",
            "checks", "report", "api"},
}


def stage_of(module: str) -> str:
    for prefix, stage in STAGES:
        if module == prefix or module.startswith(prefix + "."):
            return stage
    raise KeyError(module)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class Import:
    """One imported ``bayesprism`` module: where, and whether inside a function."""

    def __init__(self, target: str, line: int, in_function: bool, commented: bool) -> None:
        self.target, self.line = target, line
        self.in_function, self.commented = in_function, commented


def imports_of(source: str, module: str, is_package: bool, modules: set[str]) -> list[Import]:
    """The ``bayesprism`` modules ``source`` imports (``from pkg import sub`` is ``pkg.sub``)."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found: list[Import] = []

    def commented(node: ast.stmt) -> bool:
        here = lines[node.lineno - 1]
        above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
        return "#" in here or above.startswith("#")

    def add(target: str, node: ast.stmt, depth: int) -> None:
        if target == "bayesprism" or target.startswith("bayesprism."):
            found.append(Import(target, node.lineno, depth > 0, commented(node)))

    def visit(node: ast.AST, depth: int) -> None:
        for child in ast.iter_child_nodes(node):
            inner = depth + isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(alias.name, child, depth)
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - (child.level - 1)]
                    name = ".".join([*base, *([child.module] if child.module else [])])
                else:
                    name = child.module or ""
                for alias in child.names:
                    sub = f"{name}.{alias.name}"
                    add(sub if sub in modules else name, child, depth)
            visit(child, inner)

    visit(tree, 0)
    return found


def package_imports(sources: dict[str, tuple[str, bool]]) -> dict[str, list[Import]]:
    """``{module: [Import, ...]}`` of ``{module: (source, is_package)}``."""
    modules = set(sources)
    return {name: imports_of(src, name, pkg, modules) for name, (src, pkg) in sources.items()}


def read_package(root: Path = PACKAGE) -> dict[str, tuple[str, bool]]:
    return {module_name(p, root): (p.read_text(encoding="utf-8"), p.name == "__init__.py")
            for p in sorted(root.rglob("*.py"))}


def upward_imports(graph: dict[str, list[Import]]) -> list[str]:
    """Imports of a stage the importing stage may not use, as ``module:line -> target``."""
    out = []
    for module, found in graph.items():
        stage = stage_of(module)
        for imp in found:
            target = stage_of(imp.target)
            if target != stage and target not in ALLOWED[stage]:
                out.append(f"{module}:{imp.line} ({stage}) -> {imp.target} ({target})")
    return out


def module_cycle(graph: dict[str, list[Import]]) -> list[str] | None:
    """One cycle of the module import graph (function-level imports included), if any."""
    sorter = graphlib.TopologicalSorter(
        {module: {imp.target for imp in found if imp.target != module}
         for module, found in graph.items()})
    try:
        sorter.prepare()
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def unexplained_deferred_imports(graph: dict[str, list[Import]]) -> list[str]:
    """Imports of ``bayesprism`` modules inside functions, outside ``cli/``, with no comment."""
    return [f"{module}:{imp.line} -> {imp.target}" for module, found in graph.items()
            if stage_of(module) != "cli" for imp in found
            if imp.in_function and not imp.commented]


# --------------------------------------------------------------------------- the package


@pytest.fixture(scope="module")
def graph() -> dict[str, list[Import]]:
    return package_imports(read_package())


def test_every_module_has_a_stage(graph):
    for module in graph:
        assert stage_of(module) in ALLOWED, module


def test_the_stages_table_goes_down_only():
    order = list(graphlib.TopologicalSorter(ALLOWED).static_order())  # raises on a cycle
    assert order[0] == "base"


def test_imports_go_down_only(graph):
    assert upward_imports(graph) == []


def test_no_import_cycle_between_modules(graph):
    assert module_cycle(graph) is None


def test_imports_inside_functions_say_why(graph):
    assert unexplained_deferred_imports(graph) == []


def test_forecast_never_imports_the_model_or_pymc():
    for path in (PACKAGE / "forecast").rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("pymc", "pytensor", "bayesprism.model")), (path, name)


# --------------------------------------------------------------------------- the checker


def _fake(**modules: str) -> dict[str, list[Import]]:
    sources = {name: (textwrap.dedent(src), False) for name, src in modules.items()}
    sources |= {"bayesprism.forecast": ("", True), "bayesprism.model": ("", True)}
    return package_imports(sources)


def test_an_upward_import_is_found_also_inside_a_function():
    graph = _fake(**{
        "bayesprism.forecast.composition": """
            def compose():
                from bayesprism.model.step import comm_terms  # upward
        """,
        "bayesprism.model.step": "import numpy\n",
        "bayesprism.costs.step": "from bayesprism.forecast import composition\n",
    })
    assert upward_imports(graph) == [
        "bayesprism.forecast.composition:3 (forecast) -> bayesprism.model.step (model)",
        "bayesprism.costs.step:1 (costs) -> bayesprism.forecast.composition (forecast)",
    ]


def test_a_cycle_through_a_deferred_import_is_found():
    graph = _fake(**{
        "bayesprism.model.kernel": "from bayesprism.model import prepared\n",
        "bayesprism.model.prepared": "def f():\n    from bayesprism.model import kernel\n",
    })
    cycle = module_cycle(graph)
    assert cycle is not None and set(cycle) == {"bayesprism.model.kernel",
                                                "bayesprism.model.prepared"}


def test_a_deferred_import_needs_a_comment_outside_the_cli():
    graph = _fake(**{
        "bayesprism.forecast.a": "def f():\n    from bayesprism.forecast import b\n",
        "bayesprism.forecast.b": "def f():\n    # start-up time\n    from bayesprism import plan\n",
        "bayesprism.cli.c": "def run():\n    from bayesprism.forecast import a\n",
        "bayesprism.plan": "",
    })
    assert unexplained_deferred_imports(graph) == [
        "bayesprism.forecast.a:2 -> bayesprism.forecast.b"]


@pytest.mark.parametrize("folder", ["benchmarks", "examples"])
def test_benchmarks_and_examples_import_names_that_exist(folder):
    """Scripts outside the package are not imported by the suite; a module split or a rename
    must not leave them importing a name that moved (benchmarks/accuracy.py did, once)."""
    import importlib.util  # only this test resolves modules

    missing = []
    for path in sorted((PACKAGE.parent / folder).glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.module
                    and node.module.split(".")[0] == "bayesprism"):
                continue
            module = importlib.import_module(node.module)
            missing += [f"{path.name}: {node.module}.{alias.name}" for alias in node.names
                        if not hasattr(module, alias.name)
                        and importlib.util.find_spec(f"{node.module}.{alias.name}") is None]
    assert not missing
