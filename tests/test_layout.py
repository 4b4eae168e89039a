"""The package's shape, checked: stages import only the stages before them (README "Layout"),
no import circles, and the run side loads nothing of the build side."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "kitdispatch"
# Data flows one way: a module imports only modules of its own stage or of earlier ones. The run
# side comes right after describe: it reads what a build describes and nothing of how it is built.
STAGES = ("shared", "describe", "run", "compile", "check", "emit", "iree", "builder", "models", "commands")
COMMANDS = {"kitdispatch", "kitdispatch.__main__", "kitdispatch.cli", "kitdispatch.doctor"}
BUILD_SIDE = ("compile", "check", "emit", "iree", "builder", "models")


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


def stage_of(module: str) -> str:
    if module in COMMANDS:
        return "commands"
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in STAGES) else "shared"


def _imports(module: str) -> list[tuple[str, bool, int]]:
    """(imported kitdispatch module, at the top level?, line) for each import in `module`."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        guarded = any(isinstance(p, ast.If) and "TYPE_CHECKING" in ast.unparse(p.test) for p in _parents(tree, node))
        for target in targets:
            if target in MODULES and target != module and not guarded:
                out.append((target, id(node) in top, node.lineno))
    return out


def _parents(tree: ast.AST, node: ast.AST) -> list[ast.AST]:
    chain = []
    for parent in ast.walk(tree):
        for child in ast.iter_child_nodes(parent):
            if child is node:
                return [parent, *_parents(tree, parent)]
    return chain


EDGES = {m: _imports(m) for m in MODULES}


def test_every_module_belongs_to_a_stage():
    assert {stage_of(m) for m in MODULES} <= set(STAGES)


def test_stages_import_only_earlier_stages():
    upward = [
        f"{MODULES[m].relative_to(REPO)}:{line}: {stage_of(m)} imports {t} ({stage_of(t)})"
        for m, edges in EDGES.items() for t, _, line in edges
        if STAGES.index(stage_of(t)) > STAGES.index(stage_of(m)) and stage_of(m) != "commands" and m != "kitdispatch"
    ]
    assert not upward, "\n".join(upward)


def test_no_import_circles():
    graph = {m: {t for t, _, _ in edges} for m, edges in EDGES.items()}
    done: set[str] = set()

    def visit(m: str, path: list[str]) -> list[str] | None:
        if m in path:
            return path[path.index(m):] + [m]
        if m in done:
            return None
        for t in sorted(graph[m]):
            circle = visit(t, path + [m])
            if circle:
                return circle
        done.add(m)
        return None

    for m in sorted(graph):
        circle = visit(m, [])
        assert circle is None, " -> ".join(circle)


def test_function_local_imports_of_the_kit_are_the_commands_own():
    """A module imports the kit's modules at its top; only the package's lazy names and the
    commands (each command loads its stage when it runs) import inside functions."""
    local = [
        f"{MODULES[m].relative_to(REPO)}:{line}: {t}"
        for m, edges in EDGES.items() if stage_of(m) != "commands"
        for t, at_top, line in edges if not at_top
    ]
    assert not local, "\n".join(local)


def test_running_a_module_imports_nothing_of_the_build_side():
    code = (
        "import sys\nfrom kitdispatch import load_module\n"
        "print('\\n'.join(sorted(m for m in sys.modules if m.startswith(('kitdispatch', 'jinja2', 'iree.compiler', 'cuda.bindings.nvrtc')))))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO, check=True)
    loaded = res.stdout.split()
    assert "kitdispatch.run.module" in loaded
    forbidden = [m for m in loaded if m.startswith(("jinja2", "iree.compiler", "cuda.bindings.nvrtc"))
                 or (m.startswith("kitdispatch.") and m.split(".")[1] in BUILD_SIDE)]
    assert not forbidden, forbidden
    for public in ("signature", "replace", "render"):  # the names the issue lists, in their new homes
        assert not any(m.endswith(public) for m in loaded)


@pytest.mark.parametrize("stage", STAGES[1:-1])
def test_each_stage_is_a_package_with_a_docstring(stage):
    init = PACKAGE / stage / "__init__.py"
    assert init.is_file() and ast.get_docstring(ast.parse(init.read_text()))


def test_every_parameter_is_annotated():
    """Every parameter of the kit's functions says its type (issue 22), `*args`/`**kwargs` too."""
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            a = node.args
            params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p is not None)]
            missing += [
                f"{path.relative_to(REPO)}:{p.lineno}: {node.name}({p.arg})"
                for p in params if p.annotation is None and p.arg not in ("self", "cls")
            ]
    assert not missing, "\n".join(missing)
