"""House rules that tools check: one clock, the engine package never imports the server nor
the server the client, no import cycle among the project's modules (nor, outside the
engine package, among what the type checker reads). Each model family's own rules are in
`test_house_families.py`."""

import ast
import io
import tokenize
from pathlib import Path

import pytest
from support.house import PACKAGES, ROOT, import_cycles, import_graph, imports, sources

CLOCK = ROOT / "pipeline" / "clock.py"
# rates (Hz) and samples or ticks per frame or packet that only pipeline/clock.py may spell
CLOCK_NUMBERS = {"16000", "48000", "90000", "640", "1920", "3600", "960"}
# a 25 that is not the frame rate says so on its line
NOT_THE_CLOCK = "# not the clock"


def _clock_literals(path: Path, root: Path = ROOT) -> list[str]:
    """Numbers in code (not comments or docstrings) that are the clock's: a rate, a
    samples-per-frame or per-packet count, a 50 divided by (packets per second), or any 25
    (frames per second) unless its line says `# not the clock` and why."""
    toks = [
        t
        for t in tokenize.generate_tokens(io.StringIO(path.read_text()).readline)
        if t.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)
    ]
    found = []
    for i, t in enumerate(toks):
        if t.type != tokenize.NUMBER:
            continue
        number, before = t.string.replace("_", ""), toks[i - 1].string if i else ""
        if (
            number in CLOCK_NUMBERS
            or (number == "50" and before in {"/", "//"})
            or (number == "25" and NOT_THE_CLOCK not in t.line)
        ):
            found.append(f"{path.relative_to(root)}:{t.start[0]}: {t.string}")
    return found


def test_no_clock_number_outside_the_clock_module():
    found = [f for p in sources(*PACKAGES, "bench") if p != CLOCK for f in _clock_literals(p)]
    assert not found, "use pipeline.clock instead:\n" + "\n".join(found)


def test_the_clock_check_sees_what_it_should(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""16000 in a docstring is fine"""\nRATE = 48_000  # 640 here too\nx = n / 25\n'
        "FRAME = 960\nPACKET = OUTPUT_RATE // 50\nhalf = n // 50 + 50\n"
        "def f(fps: int = 25): ...\n"
        "pitch = rng.integers(25, 75)  # not the clock: espeak's pitch\n"
    )
    assert [f.split(": ")[1] for f in _clock_literals(bad, tmp_path)] == [
        "48_000",
        "25",
        "960",
        "50",
        "50",
        "25",
    ]


def _renamed_clockimports(path: Path, root: Path = ROOT) -> list[str]:
    """`from pipeline.clock import X as Y`: the clock's names keep their names, so that a
    search for one finds every use."""
    return [
        f"{path.relative_to(root)}:{node.lineno}: {a.name} as {a.asname}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module == "pipeline.clock"
        for a in node.names
        if a.asname and a.asname != a.name
    ]


def test_clock_names_are_imported_under_their_own_names():
    found = [f for p in sources(*PACKAGES, "bench", "tests") for f in _renamed_clockimports(p)]
    assert not found, "import the clock's names as they are:\n" + "\n".join(found)


def test_the_renamed_import_check_sees_what_it_should(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from pipeline.clock import FPS, OUTPUT_RATE as RATE\n"
        "from pipeline.clock import (\n    MODEL_RATE,\n    VIDEO_CLOCK as CLOCK,\n)\n"
        "from pipeline.media import resample as rs\n"
    )
    assert [f.split(": ")[1] for f in _renamed_clockimports(bad, tmp_path)] == [
        "OUTPUT_RATE as RATE",
        "VIDEO_CLOCK as CLOCK",
    ]


def test_the_engine_package_never_imports_the_server():
    offenders = [
        f"{m} imports {d}"
        for m, deps in import_graph().items()
        if m.startswith("pipeline")
        for d in deps
        if d.split(".")[0] != "pipeline"
    ]
    assert not offenders, offenders


def test_no_import_cycle():
    cycles = import_cycles(import_graph())
    assert not cycles, cycles


# Packages whose imports form no cycle even as the type checker reads them (TYPE_CHECKING
# imports included). What several parts share lives below them (realtime.buffers); what a
# part asks of the one that holds it is a Protocol beside it (realtime.whep). `pipeline` has
# one knot left, checked on its own (the config and its families' rows).
TYPED_ACYCLIC = ("realtime", "facecast_client", "facecast")


def test_no_import_cycle_even_for_the_type_checker():
    def ours(module: str) -> bool:
        return module.split(".")[0] in TYPED_ACYCLIC

    graph = {
        m: {d for d in deps if ours(d)} for m, deps in import_graph(typing=True).items() if ours(m)
    }
    cycles = import_cycles(graph)
    assert not cycles, "a type-level import cycle (see TYPED_ACYCLIC):\n" + "\n".join(cycles)


def test_the_type_level_check_sees_what_it_should(tmp_path):
    part = tmp_path / "part.py"
    part.write_text(
        "from typing import TYPE_CHECKING\n"
        "from realtime.buffers import FrameQueue\n"
        "if TYPE_CHECKING:\n    from realtime.session import PeerSession\n"
    )
    modules = {"realtime.buffers", "realtime.session"}
    assert imports(part, modules) == {"realtime.buffers"}
    assert imports(part, modules, typing=True) == modules
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a -> b -> c -> a"]


def test_the_server_never_imports_the_client_side():
    """`facecast_client` calls a server; the engine and the server know nothing of it."""
    offenders = [
        f"{m} imports {d}"
        for m, deps in import_graph(typing=True).items()
        if m.split(".")[0] in ("pipeline", "realtime")
        for d in deps
        if d.split(".")[0] == "facecast_client"
    ]
    assert not offenders, offenders


@pytest.mark.slow  # runs the command line in a process of its own
def test_every_bench_script_starts():
    """Benchmarks run on the GPU machine, far from CI: each must at least import and parse
    its arguments here, so that a rename in the code is not found there."""
    import subprocess
    import sys

    # All at once: each one's time is mostly importing torch, which overlaps well.
    scripts = sorted((ROOT / "bench").glob("*.py"))
    runs = [
        subprocess.Popen(
            [sys.executable, str(script), "--help"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for script in scripts
    ]
    failed = []
    for script, run in zip(scripts, runs, strict=True):
        _, stderr = run.communicate(timeout=120)
        if run.returncode != 0:
            failed.append(f"{script.name}: {stderr.strip().splitlines()[-1:]}")
    assert not failed, failed


def test_tests_share_helpers_only_through_the_support_package():
    """`from support.X import …`, never from another test module or conftest (lazy imports
    inside a test included)."""
    offenders = []
    for path in sources("tests"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            offenders += [
                f"{path.relative_to(ROOT)}: {n}"
                for n in names
                if n.split(".")[0] == "conftest" or n.split(".")[0].startswith("test_")
            ]
    assert not offenders, offenders


def test_the_type_checker_reads_every_package():
    """`make typecheck` runs mypy over the files pyproject.toml names: every package, whole."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert sorted(config["files"]) == sorted(PACKAGES)
    assert "ignore_missing_imports" not in config, (
        "name the untyped third-party packages in a [[tool.mypy.overrides]] entry instead"
    )
    for override in config.get("overrides", []):
        modules = override["module"]
        modules = [modules] if isinstance(modules, str) else modules
        ours = [m for m in modules if m.split(".")[0] in PACKAGES]
        assert not ours, f"mypy overrides may only cover third-party packages, not {ours}"


def test_the_realtime_package_lists_every_module():
    """realtime/__init__.py's docstring names each of its modules and packages, so that it
    stays a true map of the package."""
    realtime = ROOT / "realtime"
    doc = ast.get_docstring(ast.parse((realtime / "__init__.py").read_text())) or ""
    names = [p.stem for p in realtime.glob("*.py") if p.stem != "__init__"]
    names += [f"{p.name}/" for p in realtime.iterdir() if (p / "__init__.py").is_file()]
    missing = [n for n in sorted(names) if f"`{n}`" not in doc]
    assert not missing, f"realtime/__init__.py does not mention {missing}"
