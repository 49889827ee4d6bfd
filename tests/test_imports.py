"""Every module of the package imports alone, the repository's import graph has no cycle, and no module of the package
imports one of a layer above its own.

The import graph is read from the source: every ``import`` of a repository module, wherever it stands (inside a
function, or under ``if TYPE_CHECKING:``: an annotation-only import still makes a module know the one it names). It
spans the package, the benchmarks (``benchmarks/``'s scripts, ``results_io`` and the ``learning`` package), the test
helpers, scripts/ and examples/, named as they import each other (each puts the repository root, benchmarks/ and tests/
on ``sys.path``). Checks:

- no cycle anywhere in that graph, so no module imports another that imports it back, even lazily;
- the package's layers (:data:`LAYERS`, low to high): a module imports only modules of its own layer or lower ones,
  and every top-level module or subpackage has a layer;
- each module of the package is imported in a fresh process; none is over 500 lines; at most 8 modules at the
  package's top level; every package's ``__init__`` has a docstring (what it owns, its public names).

A test that imports modules inside pytest's process cannot see a cycle (earlier test files have imported
``gigpo_trl.envs`` already), so each module is imported in a child process that has never loaded any ``gigpo_trl``
module. The children are forked from one fresh interpreter that has loaded only the heavy third-party libraries
(torch, transformers, TRL, ...), so the whole package is checked in seconds rather than one torch import per module.
"""

from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "gigpo_trl"

# Run in a fresh interpreter: preload third-party libraries, then fork one child per module.
_DRIVER = r"""
import importlib, json, os, sys, traceback
for lib in ("torch", "transformers", "trl", "datasets", "accelerate", "peft"):
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
assert not any(m == "gigpo_trl" or m.startswith("gigpo_trl.") for m in sys.modules), "parent loaded gigpo_trl"
failures = {}
for name in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            importlib.import_module(name)
        except BaseException:
            os.write(write, traceback.format_exc().encode())
            code = 1
        os.close(write)
        os._exit(code)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        message = pipe.read().decode(errors="replace")
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failures[name] = message or f"child exited with status {status}"
print(json.dumps(failures))
"""


def module_paths(package: pathlib.Path = PACKAGE) -> dict[str, pathlib.Path]:
    """``{dotted name: source file}`` of every module of ``package`` (``__init__`` as its package)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def package_modules() -> list[str]:
    """Dotted names of every module of the package, from the source tree."""
    return list(module_paths())


REPO = PACKAGE.parent
# Folders whose files import each other by top-level name: each script of benchmarks/ puts the root, benchmarks/ and
# tests/ on sys.path (benchmarks/learning/__init__.py does it for the learning package).
SCRIPT_ROOTS = ("benchmarks", "tests", "scripts", "examples")


def repository_modules(repo: pathlib.Path = REPO, script_roots=SCRIPT_ROOTS) -> dict[str, pathlib.Path]:
    """``{name: source file}`` of every Python file of the repository: the root's packages (``gigpo_trl``) and, in
    each folder of ``script_roots``, its packages and top-level files by dotted name as they import each other. A
    file no import can reach (a script a same-named package shadows, one in a folder that is no package) is named
    by its path, so its own imports still count."""
    out = {}
    for package in sorted(p.parent for p in repo.glob("*/__init__.py")):
        out.update(module_paths(package))
    for folder in script_roots:
        root = repo / folder
        loose = []
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root)
            dirs = rel.parts[:-1]
            if any(not root.joinpath(*dirs[:i + 1], "__init__.py").is_file() for i in range(len(dirs))):
                loose.append(path)  # inside a folder that is no package (tests/scripts/)
                continue
            parts = rel.with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            if dirs:
                out[".".join(parts)] = path
            else:
                loose.append(path)  # top-level files after the packages: a package shadows a same-named file
        for path in loose:
            name = path.stem if path.parent == root else None
            out[name if name and name not in out else path.relative_to(repo).as_posix()] = path
    return out


def import_graph(paths: dict[str, pathlib.Path] | None = None) -> dict[str, set[str]]:
    """``{module: modules of ``paths`` it imports}`` (default: the package's, :func:`module_paths`), from every import
    statement of its source, wherever it is (a function's lazy import and an ``if TYPE_CHECKING:`` import included).
    ``from .x import y`` points at ``x.y`` when that is a module, else at ``x``; a package's ``__init__`` being run
    before its submodules is not an edge."""
    paths = module_paths() if paths is None else paths
    graph = {}
    for name, path in paths.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(alias.name for alias in node.names if alias.name in paths)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
                    for _ in range(node.level - 1):
                        base = base.rpartition(".")[0]
                    target = f"{base}.{node.module}" if node.module else base
                else:
                    target = node.module or ""
                if target in paths:
                    edges.update(f"{target}.{a.name}" if f"{target}.{a.name}" in paths else target for a in node.names)
        edges.discard(name)
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (each one holds a cycle), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


# The package's layers, low to high: a module may import modules of its own layer or of lower ones only (a name is a
# top-level module or subpackage of gigpo_trl, a subpackage with all its modules). The package's own __init__ (lazy
# public names, no import statement) is above them all.
LAYERS = (
    ("trl_compat", "models"),
    # forward: the model's forwards over rows (trl_compat and models only); critic: PEFT adapter + value head, its
    # forwards built as the policy's (forward), its trainer hooks through trl_compat
    ("envs", "advantage", "forward", "critic"),
    ("checks",),  # configuration checks: they take the config's values, never import config
    ("config",),
    ("generation",),
    ("rollout", "records", "observers"),  # observers name the rollout's row types; the collector calls them
    ("checkpoint", "warmup"),
    ("trainer",),
    ("report", "job"),
)


def layer_of(module: str, package: str = "gigpo_trl", layers=LAYERS) -> int:
    """The layer index of ``module`` (a dotted name in ``package``); ``len(layers)`` for the package itself.
    Raises KeyError for a top-level module or subpackage no layer names."""
    if module == package:
        return len(layers)
    top = module.split(".")[1]
    for i, names in enumerate(layers):
        if top in names:
            return i
    raise KeyError(f"{package}.{top} has no layer: add it to LAYERS in tests/test_imports.py")


def back_edges(graph: dict[str, set[str]], package: str = "gigpo_trl", layers=LAYERS) -> list[str]:
    """Every import of ``graph`` (the modules of ``package``) into a higher layer, as ``"a (layer) -> b (layer)"``.
    Raises KeyError naming a top-level module or subpackage that no layer holds."""
    def where(module: str) -> str:
        i = layer_of(module, package, layers)
        return f"{module} (layer {i}: {', '.join(layers[i]) if i < len(layers) else package})"

    layer = {module: layer_of(module, package, layers) for module in graph}  # every module has a layer
    return [f"{where(a)} -> {where(b)}" for a in sorted(graph) for b in sorted(graph[a]) if layer[b] > layer[a]]


def test_import_graph_finds_lazy_and_annotation_imports_and_ignores_the_package_init(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .a import A\n")  # a package re-exporting its module: no cycle
    (pkg / "sub" / "a.py").write_text("from ..b import B\nA = 1\n")
    (pkg / "b.py").write_text("import os\nB = 2\ndef f():\n    from .sub import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nfrom pkg.sub.a import A\n"
                              "if TYPE_CHECKING:\n    from .b import B\n")
    graph = import_graph(module_paths(pkg))
    assert graph == {"pkg": set(), "pkg.sub": {"pkg.sub.a"}, "pkg.sub.a": {"pkg.b"}, "pkg.b": {"pkg.sub.a"},
                     "pkg.c": {"pkg.sub.a", "pkg.b"}}
    assert import_cycles(graph) == [["pkg.b", "pkg.sub.a"]]
    (pkg / "b.py").write_text("B = 2\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n")
    (pkg / "c.py").write_text("from . import a\nC = 3\n")  # an annotation-only import back is a cycle too
    assert import_cycles(import_graph(module_paths(pkg))) == [["pkg.a", "pkg.c"]]


def test_repository_modules_name_scripts_as_they_import_each_other(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    bench = tmp_path / "benchmarks"
    (bench / "learning").mkdir(parents=True)
    (bench / "learning" / "__init__.py").write_text("")
    (bench / "learning" / "runner.py").write_text("from .runs import load\nfrom results_io import save\n")
    (bench / "learning" / "runs.py").write_text("import pkg\n")
    (bench / "learning.py").write_text("from learning.runner import main\n")  # shadowed by the package
    (bench / "results_io.py").write_text("")
    (bench / "loose").mkdir()
    (bench / "loose" / "tool.py").write_text("import results_io\n")
    paths = repository_modules(tmp_path, ("benchmarks",))
    assert sorted(paths) == ["benchmarks/learning.py", "benchmarks/loose/tool.py", "learning", "learning.runner",
                             "learning.runs", "pkg", "results_io"]
    graph = import_graph(paths)
    assert graph["learning.runner"] == {"learning.runs", "results_io"} and graph["learning.runs"] == {"pkg"}
    assert graph["benchmarks/learning.py"] == {"learning.runner"} and graph["benchmarks/loose/tool.py"] == {"results_io"}


def test_no_import_cycle_in_the_repository():
    paths = repository_modules()
    assert {"gigpo_trl.envs.base", "learning.runner", "results_io", "tiny_models"} <= set(paths)
    graph = import_graph(paths)
    assert "gigpo_trl.envs.adapters" in graph["gigpo_trl.envs.checker"]  # the graph reads relative imports
    assert "gigpo_trl.trl_compat" in graph["gigpo_trl.envs.alfworld.engine"]  # and lazy ones, three levels up
    assert "gigpo_trl.envs.pool" in graph["gigpo_trl.rollout.stepping"]  # and annotation-only ones
    assert "learning.runs" in graph["learning.runner"] and "results_io" in graph["learning.map"]
    cycles = import_cycles(graph)
    assert not cycles, "modules that import each other (directly or through others): " + "; ".join(
        " <-> ".join(c) for c in cycles)


def test_back_edges_name_each_import_into_a_higher_layer():
    layers = (("low",), ("mid", "side"), ("high",))
    graph = {"p": {"p.high"}, "p.low": {"p.low.x"}, "p.low.x": set(), "p.mid": {"p.low", "p.side.y"},
             "p.side.y": {"p.high", "p"}, "p.high": {"p.mid"}}
    assert back_edges(graph, "p", layers) == ["p.side.y (layer 1: mid, side) -> p (layer 3: p)",
                                              "p.side.y (layer 1: mid, side) -> p.high (layer 2: high)"]
    with pytest.raises(KeyError, match="p.other has no layer"):
        back_edges({"p.other": set()}, "p", layers)


def test_no_module_imports_a_higher_layer():
    """The package's layer order (:data:`LAYERS`), function-level and ``TYPE_CHECKING`` imports included."""
    graph = import_graph()
    edges = back_edges(graph)
    assert not edges, f"{len(edges)} import(s) into a higher layer (LAYERS in tests/test_imports.py):\n" + "\n".join(
        edges)


def test_package_layout():
    """At most 8 modules at the package's top level, and every package's __init__ says what it owns."""
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert "__init__" in top and len(top) <= 8, f"{len(top)} modules at the top of gigpo_trl: {top}"
    undocumented = [p.relative_to(REPO).as_posix() for p in sorted(PACKAGE.rglob("__init__.py"))
                    if len((ast.get_docstring(ast.parse(p.read_text())) or "").split()) < 3]
    assert not undocumented, f"packages whose __init__ has no docstring: {undocumented}"


def test_subpackages_with_lazy_names_resolve_them_and_load_nothing_first():
    """rollout/ and records/ list their public names and load each module on first access only: importing the
    folder imports no torch (environment workers import light modules of the package)."""
    code = ("import sys, gigpo_trl.rollout as r, gigpo_trl.records as m\n"
            "print(sorted(k for k in sys.modules if k.startswith('gigpo_trl')), 'torch' in sys.modules)\n"
            "print(all(getattr(p, n) is getattr(__import__(f'{p.__name__}.{p._LAZY[n]}', fromlist=['_']), n)"
            " for p in (r, m) for n in p.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines() == ["['gigpo_trl', 'gigpo_trl.records', 'gigpo_trl.rollout'] False", "True"]


def test_package_modules_lists_the_package():
    names = package_modules()
    assert "gigpo_trl" in names and "gigpo_trl.rollout.parsing" in names and "gigpo_trl.envs.base" in names
    assert len(names) == len(set(names))


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_every_module_imports_alone_in_a_fresh_process():
    names = package_modules()
    out = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(names)], capture_output=True, text=True,
                         timeout=600, cwd=PACKAGE.parent)
    assert out.returncode == 0, out.stderr[-4000:]
    failures = json.loads(out.stdout.strip().splitlines()[-1])
    assert not failures, "\n\n".join(f"import {name} failed:\n{tb}" for name, tb in failures.items())


MAX_LINES = 500


def test_no_module_over_500_lines():
    """One module, one job: a module that grows past 500 lines holds more than one concern; split it."""
    sizes = {path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text().splitlines())
             for path in module_paths().values()}
    assert sizes["gigpo_trl/config.py"] > 100  # the count reads the source files
    too_long = {name: n for name, n in sorted(sizes.items()) if n > MAX_LINES}
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"
