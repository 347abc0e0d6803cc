"""House rules for model families: a config's family is decided in one place, the family
contract type-checks strictly, each family keeps to its own package (shared model code
imports none, none imports another), and the one type-level knot left in `pipeline` is the
config and its families' rows."""

import ast
from pathlib import Path

from support.house import PACKAGES, ROOT, import_cycles, import_graph, sources

# Where a config's family is decided: everything else asks the family's row
# (`pipeline.families.Family`) what it does, never which family it is.
STACK_READER = ROOT / "pipeline" / "families.py"


def _stack_comparisons(path: Path) -> list[str]:
    """`runtime.stack` compared (==, !=, in, not in) in `path`'s code, as file:line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        if any(ast.unparse(s).endswith("runtime.stack") for s in sides):
            found.append(
                f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{node.lineno}"
            )
    return found


def test_runtime_stack_is_compared_only_in_the_families_module():
    found = [
        hit
        for path in sources(*PACKAGES, "bench")
        if path != STACK_READER
        for hit in _stack_comparisons(path)
    ]
    assert not found, f"ask the family's row (pipeline.families) instead: {found}"


def test_the_stack_check_sees_what_it_should(tmp_path):
    code = tmp_path / "code.py"
    code.write_text(
        "a = cfg.runtime.stack == 'photo'\n"
        "b = engine.cfg.runtime.stack in ('photo', 'flashhead')\n"
        "c = 'x' != cfg.runtime.stack\n"
        "d = cfg.runtime.stack  # read, not compared: fine\n"
        "e = cfg.family.photos\n"
    )
    assert [hit.rpartition(":")[2] for hit in _stack_comparisons(code)] == ["1", "2", "3"]


# The start-up contract and the family rows type-check strictly: each says so on its first
# lines, so the rule travels with the file (mypy reads the comment).
STRICT_MODULES = ("pipeline/families.py", "pipeline/family_engine.py")
STRICT = "# mypy: disallow-untyped-defs"


def test_the_family_contract_modules_type_check_strictly():
    lax = [
        name for name in STRICT_MODULES if STRICT not in (ROOT / name).read_text().splitlines()[:40]
    ]
    assert not lax, f"{lax} must carry {STRICT!r} near the top"


# A family's code (`pipeline.families`) lies in its own package. The shared model code
# (`pipeline/models/`) imports no family, and no family imports another: what two families
# share lies below them (`pipeline.models`, `pipeline.faces`, `pipeline.random_weights`, …).
def _family_packages() -> dict[str, str]:
    """Each family's package by its stack: the package its engine lies in, or the engine's
    module itself where that lies at the top of `pipeline` (none does now: `pipeline.diffusion`)."""
    from pipeline.families import FAMILIES

    modules = {f.stack: f.engine.partition(":")[0] for f in FAMILIES}
    return {s: m.rpartition(".")[0] if m.count(".") > 1 else m for s, m in modules.items()}


def _familyimports(graph: dict[str, set[str]], packages: dict[str, str]) -> list[tuple]:
    """(module, its family or None, the module it imports) for each import that reaches into
    a family's package from outside it."""

    def family(module: str) -> str | None:
        return next((s for s, p in packages.items() if f"{module}.".startswith(f"{p}.")), None)

    return [
        (m, family(m), d) for m in graph for d in graph[m] if family(d) not in (None, family(m))
    ]


def test_shared_model_code_imports_no_family():
    imports = _familyimports(import_graph(typing=True), _family_packages())
    found = sorted(f"{m} imports {d}" for m, _, d in imports if m.startswith("pipeline.models."))
    assert not found, "move what it needs below the families:\n" + "\n".join(found)


def test_no_family_imports_another():
    imports = _familyimports(import_graph(typing=True), _family_packages())
    found = sorted(f"{m} imports {d}" for m, family, d in imports if family)
    assert not found, "share it from below the families instead:\n" + "\n".join(found)


def test_the_family_checks_see_what_they_should():
    packages = {"a": "pipeline.a", "b": "pipeline.b", "top": "pipeline.engine"}
    graph = {
        "pipeline.a.x": {"pipeline.a.y", "pipeline.b.z", "pipeline.ab"},
        "pipeline.models.m": {"pipeline.engine"},
        "pipeline.ab": {"pipeline.a.y"},
    }
    assert _familyimports(graph, packages) == [
        ("pipeline.a.x", "a", "pipeline.b.z"),
        ("pipeline.models.m", None, "pipeline.engine"),
        ("pipeline.ab", None, "pipeline.a.y"),
    ]
    assert _family_packages()["photo"] == "pipeline.photo"


def test_pipelines_only_type_level_cycle_is_the_config_and_its_families():
    """`pipeline.config` reads each family's row to validate a config, and the rows and the
    families' sections name `FacecastConfig` in their signatures: that registry knot is the
    one type-level cycle allowed in `pipeline`. The engines and start-up no longer name
    each other's types (the start-up report lives in the seam, `pipeline.stream`)."""

    def registry(module: str) -> bool:
        names = ("pipeline.config", "pipeline.families", "pipeline.sections")
        return module in names or module.endswith(".config")

    graph = {
        m: {d for d in deps if d.startswith("pipeline.")}
        for m, deps in import_graph(typing=True).items()
        if m.startswith("pipeline.")
    }
    outside = [c for c in import_cycles(graph) if not all(map(registry, c.split(" -> ")))]
    assert not outside, "a type-level import cycle in pipeline:\n" + "\n".join(outside)
