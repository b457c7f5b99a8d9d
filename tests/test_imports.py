"""zrl's import graph, read from the source with `ast` (nothing is imported): no module may
import itself back through others, counting imports inside functions, and an import inside a
function (of a zrl module or a heavy third-party one) says why it is there with `# lazy:`.
Also: `zrl --help` and config checks start without torch.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "zrl"

# Third-party packages whose import costs enough start-up time that importing one inside a
# function is a deliberate choice (torch: seconds; numpy, gymnasium, zmq, psutil: tens of ms).
HEAVY = {"torch", "numpy", "gymnasium", "tensorboard", "zmq", "psutil", "ale_py", "matplotlib",
         "stable_baselines3", "cpprb", "scipy", "pandas"}
LAZY_MARK = "# lazy:"


@dataclass(frozen=True)
class Import:
    importer: str  # the module whose source holds the import
    target: str  # the module imported (a zrl module resolved, or the name as written)
    path: Path
    line: int
    local: bool  # inside a function


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":  # a package's __init__ stands for the package
        parts.pop()
    return ".".join(parts)


def zrl_modules() -> dict[str, Path]:
    modules = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    for ext in PACKAGE.rglob("*.pyi"):  # a compiled extension (zrl._core): a module with no imports of its own
        modules.setdefault(module_name(ext), ext)
    return modules


def resolve(name: str, modules: dict[str, Path]) -> str:
    """`import a.b.c` names a.b.c; the longest prefix that is a zrl module is what it loads."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return name


def from_base(node: ast.ImportFrom, importer: str, path: Path) -> str:
    """The module a `from X import ...` reads from, relative imports resolved."""
    if node.level == 0:
        return node.module or ""
    package = importer.split(".") if path.name == "__init__.py" else importer.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(importer: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """Every import that runs when the module (or one of its functions) does: those under
    `if TYPE_CHECKING:` never run, so they make no cycle."""
    found: list[Import] = []

    def visit(node: ast.AST, local: bool) -> None:
        if isinstance(node, ast.If) and is_type_checking(node.test):
            for child in node.orelse:
                visit(child, local)
            return
        if isinstance(node, ast.Import):
            found.extend(Import(importer, resolve(a.name, modules), path, node.lineno, local) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = from_base(node, importer, path)
            for a in node.names:  # `from zrl import x`: zrl.x when x is a module, else zrl itself
                sub = f"{base}.{a.name}"
                found.append(Import(importer, sub if sub in modules else resolve(base, modules), path, node.lineno, local))
        inner = local or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    if path.suffix == ".py":
        visit(ast.parse(path.read_text(), str(path)), False)
    return found


def all_imports() -> list[Import]:
    modules = zrl_modules()
    return [i for name, path in modules.items() for i in imports_of(name, path, modules)]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, and modules that import themselves (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
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
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(edges):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def where(i: Import) -> str:
    return f"{i.path.relative_to(PACKAGE.parent)}:{i.line}"


def test_no_import_cycles():
    modules = zrl_modules()
    imports = [i for i in all_imports() if i.target in modules]
    edges: dict[str, set[str]] = {}
    for i in imports:
        edges.setdefault(i.importer, set()).add(i.target)
    problems = []
    for component in cycles(edges):
        members = set(component)
        links = [f"    {i.importer} -> {i.target} ({where(i)}{', in a function' if i.local else ''})"
                 for i in imports if i.importer in members and i.target in members]
        problems.append(f"cycle {' / '.join(component)}:\n" + "\n".join(sorted(set(links))))
    assert not problems, "import cycles:\n" + "\n".join(problems)


def has_lazy_mark(lines: list[str], line: int) -> bool:
    """`# lazy:` on the import's line, or alone on the line above it."""
    above = lines[line - 2].strip() if line >= 2 else ""
    return LAZY_MARK in lines[line - 1] or (above.startswith("#") and LAZY_MARK in above)


def test_function_local_imports_say_why():
    modules = zrl_modules()
    sources: dict[Path, list[str]] = {}
    unexplained: set[tuple[Path, int, str]] = set()
    for i in all_imports():
        if not i.local or not (i.target in modules or i.target.split(".")[0] in HEAVY):
            continue
        lines = sources.setdefault(i.path, i.path.read_text().splitlines())
        if not has_lazy_mark(lines, i.line):
            unexplained.add((i.path, i.line, f"  {where(i)}: {lines[i.line - 1].strip()}"))
    assert not unexplained, (f"imports inside functions without a `{LAZY_MARK} reason` comment (move them to the top "
                             "of the module, or say why they must wait):\n" + "\n".join(u[2] for u in sorted(unexplained)))


def test_the_graph_reader_resolves_what_it_reads(tmp_path):
    """The parser's own rules, on zrl's real layout: a module named in `from zrl import x`,
    relative imports, `import a.b`, and imports inside functions."""
    modules = zrl_modules()
    assert "zrl" in modules and "zrl.cli" in modules and "zrl._core" in modules
    src = tmp_path / "probe.py"
    src.write_text("import zrl.config\nfrom zrl import spaces, __version__\nfrom . import cli\nfrom .config import load_config\n"
                   "def f():\n    import torch.nn  # lazy: a test\n")
    found = imports_of("zrl.probe", src, modules)
    assert [(i.target, i.local) for i in found] == [
        ("zrl.config", False), ("zrl.spaces", False), ("zrl", False), ("zrl.cli", False), ("zrl.config", False), ("torch.nn", True)]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"c"}, "d": {"a"}}) == [["a", "b"], ["c"]]


@pytest.mark.parametrize("code", [
    "import zrl.cli",
    "import sys; from zrl.cli import main; sys.argv = ['zrl', '--help']\ntry:\n    main()\nexcept SystemExit:\n    pass",
    "from zrl.config import load_config; load_config(None, [])",
])
def test_help_and_config_checks_do_not_import_torch(code):
    probe = f"{code}\nimport sys\nheavy = sorted(m for m in ('torch', 'gymnasium') if m in sys.modules)\nassert not heavy, heavy"
    p = subprocess.run([sys.executable, "-c", probe], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
