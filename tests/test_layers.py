"""The package's imports point one way (docs/architecture.md, "The import rule").

Every `import capacity...` / `from capacity... import` in every module is read from the source with
`ast`, function-local ones included, and checked against the layer order

    util, errors, paths  <-  inputs  <-  cost  <-  spec  <-  sim  <-  {measurements, studies}
        <-  fidelity  <-  report  <-  cli

A module may import its own layer or a lower one; measurements and studies share a rank and do not
import each other; nothing imports `cli`; the module graph (function-local imports included) has no
cycle. The one exception is `capacity/__main__.py`, the `python -m capacity` shim over `cli`, and
the package's front door `capacity/__init__.py`, which sits at the top beside `cli` and the notebook API
`capacity/api.py` (api and cli do not import each other).
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "capacity"

RANK = {"util": 0, "errors": 0, "paths": 0, "data": 0, "inputs": 1, "cost": 2, "spec": 3, "sim": 4,
        "measurements": 5, "studies": 5, "fidelity": 6, "report": 7, "api": 8, "cli": 8, "__init__": 8}
SHIMS = {"capacity.__main__"}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1 and parts != ["capacity", "__init__"]:
        parts = parts[:-1]
    return ".".join(parts)


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules `path` imports, wherever the import statement stands."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("capacity."))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and (node.module == "capacity" or node.module.startswith("capacity.")):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in modules else node.module)
    return {m for m in out if m != "capacity"}


def violations(root: Path = PACKAGE) -> list[str]:
    """Every upward import, import of `cli`, sibling import and cycle under `root` (a package dir)."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    modules = set(files)
    graph = {m: _imports(p, modules) for m, p in files.items() if m not in SHIMS}
    found: list[str] = []
    for mod, deps in sorted(graph.items()):
        for dep in sorted(deps):
            a, b = _layer(mod), _layer(dep)
            if dep == "capacity.cli" and mod != "capacity.cli":
                found.append(f"{mod} imports the CLI ({dep})")
            elif RANK[b] > RANK[a]:
                found.append(f"{mod} ({a}) imports upward: {dep} ({b})")
            elif RANK[b] == RANK[a] and a != b and mod != "capacity.__init__":   # the front door may lazy-load the api
                found.append(f"{mod} ({a}) imports its sibling layer: {dep} ({b})")
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                found.append("cycle: " + " -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def test_every_layer_is_named_in_the_rule():
    layers = {_layer(_module_name(p, PACKAGE)) for p in PACKAGE.rglob("*.py")}
    assert layers - set(RANK) - {"__main__"} == set()


def test_imports_point_one_way_with_no_cycle():
    assert violations() == []


def test_a_planted_upward_import_is_caught(tmp_path):
    root = tmp_path / "capacity"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "data"))
    target = root / "cost" / "step_cost.py"
    # function-local, as the hidden ones were: the step cost reaching up into the simulator
    target.write_text(target.read_text() + "\n\ndef _planted():\n    from capacity.sim import simulate\n")
    found = violations(root)
    assert "capacity.cost.step_cost (cost) imports upward: capacity.sim.simulate (sim)" in found
    assert any(f.startswith("cycle: ") and "capacity.cost.step_cost" in f for f in found)


def test_a_planted_import_of_the_cli_is_caught(tmp_path):
    root = tmp_path / "capacity"
    shutil.copytree(PACKAGE, root, ignore=shutil.ignore_patterns("__pycache__", "data"))
    target = root / "studies" / "plan.py"
    target.write_text(target.read_text() + "\nfrom capacity.cli import main as _main\n")
    assert "capacity.studies.plan imports the CLI (capacity.cli)" in violations(root)


def test_the_cli_parser_imports_no_heavy_library():
    """Building `capacity`'s parser and printing --help imports neither numpy, pandas, scipy nor
    plotly (cli.py's docstring: each command imports its layers on use)."""
    import subprocess
    import sys

    code = ("import sys, contextlib, io\nfrom capacity import cli\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        cli.main(['--help'])\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('numpy', 'pandas', 'scipy', 'plotly', 'simpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
