"""What the house tests read the project with: its modules, their imports (at run time and
as the type checker reads them) and the cycles among them, from the source alone."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGES = ("pipeline", "realtime", "facecast_client", "facecast")


def sources(*folders: str) -> list[Path]:
    return sorted(p for f in folders for p in (ROOT / f).rglob("*.py"))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str], typing: bool = False) -> set[str]:
    """Project modules `path` imports, at any level of the file (a lazy import inside a
    function is still a dependency); `if TYPE_CHECKING:` blocks are left out unless
    `typing` (what the type checker reads: a module that names another's type needs it)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if not typing and isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            subs = {f"{node.module}.{a.name}" for a in node.names}
            found = subs & modules
            names.update(found if found == subs else found | {node.module})

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    me = module_name(path) if path.is_relative_to(ROOT) else None
    return {m for m in map(owner, names) if m and m != me}


def import_graph(typing: bool = False) -> dict[str, set[str]]:
    files = {module_name(p): p for p in sources(*PACKAGES)}
    return {m: imports(p, set(files), typing) for m, p in files.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each import cycle of `graph` (module → the modules it imports) found by a walk."""
    state: dict[str, str] = {}
    path: list[str] = []
    cycles: list[str] = []

    def visit(m: str) -> None:
        state[m] = "open"
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                cycles.append(" -> ".join(path[path.index(d) :] + [d]))
            elif d not in state:
                visit(d)
        path.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return cycles
