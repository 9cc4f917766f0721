"""The package's layout rules (docs/design.md, "The layout"), checked on the source itself.

* no import cycle among top-level imports;
* ``analysis/`` imports nothing above it (no transform, sim, view, inductor, runtime), except
  Jupyter's one hook, ``StreamDAG._repr_html_``;
* no ``_private`` name imported from another module;
* graph-editing calls only in ``transform/``, ``runtime.py`` and ``synthetic.py`` (which builds
  graphs from nothing);
* no module over 400 lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "streampass"
MAX_LINES = 400

#: FX calls and assignments that change a graph
EDITS = (
    "create_node",
    "erase_node",
    "inserting_before",
    "inserting_after",
    "replace_all_uses_with",
    "replace_input_with",
    "add_submodule",
    "delete_submodule",
    "call_function",
    "recompile",
)
MAY_EDIT = ("transform/", "runtime.py", "synthetic.py")


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path):
    """``(imported module, names, at top level, enclosing function)`` for each streampass import."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def context(node):
        top, func = True, None
        while node in parents:
            node = parents[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                top, func = False, func or node.name
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                top = False
        return top, func

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("streampass"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield (full if full in MODULES else node.module), alias.name, *context(node)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("streampass"):
                    yield alias.name, None, *context(node)


def test_no_import_cycle():
    g = nx.DiGraph()
    for mod, path in MODULES.items():
        g.add_node(mod)
        for target, _, top, _ in _imports(path):
            if top and target != mod:
                g.add_edge(mod, target)
    assert list(nx.simple_cycles(g)) == []


@pytest.mark.parametrize("mod", [m for m in MODULES if m.startswith("streampass.analysis")])
def test_analysis_imports_nothing_above_it(mod):
    above = (
        "streampass.transform",
        "streampass.sim",
        "streampass.view",
        "streampass.inductor",
        "streampass.runtime",
        "streampass.commands",
    )
    bad = [
        target for target, _, _, func in _imports(MODULES[mod]) if target.startswith(above) and func != "_repr_html_"
    ]
    assert not bad, "\n".join(bad)


def test_no_private_name_imported_across_modules():
    bad = [
        f"{mod} imports {name} from {target}"
        for mod, path in MODULES.items()
        for target, name, _, _ in _imports(path)
        if name and name.startswith("_") and not name.startswith("__")
    ]
    assert not bad, "\n".join(bad)


#: functions outside MAY_EDIT that call FX's editing API on a graph they built themselves
OWN_GRAPHS = {"ops.py": {"_inputs_dict_is_kept"}}  # probes which input-node dict this FX keeps


def test_only_transform_and_runtime_edit_graphs():
    bad = []
    for path in MODULES.values():
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(MAY_EDIT):
            continue
        tree = ast.parse(path.read_text())
        skipped = {
            id(n)
            for f in ast.walk(tree)
            if isinstance(f, ast.FunctionDef) and f.name in OWN_GRAPHS.get(rel, ())
            for n in ast.walk(f)
        }
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Attribute) and node.attr in EDITS and isinstance(node.ctx, ast.Load):
                bad.append(f"{rel}:{node.lineno} .{node.attr}")
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and t.attr in ("args", "kwargs", "target", "meta"):
                        bad.append(f"{rel}:{node.lineno} sets .{t.attr}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("mod", list(MODULES))
def test_module_size(mod):
    lines = len(MODULES[mod].read_text().splitlines())
    assert lines <= MAX_LINES, f"{mod}: {lines} lines"
