"""`--compile-cache DIR`: a fresh machine loads what an earlier start compiled
(`pipeline.compile_cache`)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline.compile_cache import CompileCache, artifacts_file

ROOT = Path(__file__).resolve().parents[1]

# one start of the tiny engine, compiled, with the compile cache in argv[1]; prints the
# start-up report's `compile_cache`
START = """
import json, sys
from pipeline.startup import EngineOptions, start_engine
_, report = start_engine(EngineOptions(config="tiny", device="cpu", compile=True,
                                       compile_cache=sys.argv[1]))
print(json.dumps(report.prepare["compile_cache"]))
"""


def start_on_a_fresh_machine(cache: Path, machine: Path) -> dict:
    """A process whose torch has never compiled anything (its own empty Inductor folder)."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(machine), PYTHONPATH=str(ROOT))
    run = subprocess.run(
        [sys.executable, "-c", START, str(cache)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_file_names_the_torch_build_and_the_device_kind(tmp_path):
    path = artifacts_file(tmp_path, torch.device("cpu"))
    assert path.parent == tmp_path
    version = torch.__version__.replace("+", "-")  # "2.13.0+cpu": a plain name copies anywhere
    assert path.name == f"torch-{version}_cpu.bin"
    assert re.fullmatch(r"[A-Za-z0-9._-]+", path.name)


def test_an_empty_folder_loads_nothing_and_says_where_it_will_save(tmp_path, caplog):
    caplog.set_level("INFO", logger="pipeline.compile_cache")
    cache = CompileCache.open(tmp_path / "cc", torch.device("cpu"))
    assert cache.loaded_graphs == 0 and cache.error is None
    assert "nothing yet" in caplog.text and str(cache.path) in caplog.text
    assert cache.report()["graphs_loaded"] == 0


def test_an_unreadable_file_is_reported_and_the_start_goes_on(tmp_path, caplog):
    path = artifacts_file(tmp_path, torch.device("cpu"))
    path.write_bytes(b"not torch's artifacts")
    cache = CompileCache.open(tmp_path, torch.device("cpu"))  # does not raise
    assert cache.error is not None
    assert "could not be read" in caplog.text
    assert cache.report()["error"] == cache.error


def test_a_folder_that_cannot_be_written_is_reported_not_raised(tmp_path, caplog, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder should be")
    cache = CompileCache.open(blocker / "cc", torch.device("cpu"))
    # what a compile would have left to save (compiling takes seconds on a CPU)
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"artifacts", None))
    cache.save()
    assert cache.saved_bytes is None
    assert "could not save" in caplog.text


@pytest.mark.slow  # three starts of the compiled tiny engine (~1 min on 2 cores)
def test_a_fresh_machine_with_the_folder_compiles_nothing(tmp_path):
    """The first start compiles every graph and saves them; a second on another "machine"
    (no Inductor cache of its own) loads them and compiles none; a damaged file costs a
    compile, not the start, and is written anew."""
    cache = tmp_path / "compile-cache"
    first = start_on_a_fresh_machine(cache, tmp_path / "machine-1")
    assert first["graphs_loaded"] == 0
    assert first["graphs_compiled"] > 0
    assert first["saved_bytes"] > 0
    (path,) = cache.glob("*.bin")
    saved = path.read_bytes()

    second = start_on_a_fresh_machine(cache, tmp_path / "machine-2")
    assert second["graphs_loaded"] == first["graphs_compiled"]
    assert second["graphs_compiled"] == 0
    assert second["graphs_found"] == first["graphs_compiled"]
    assert "saved_bytes" not in second  # nothing new: the file is left as it was
    assert path.read_bytes() == saved

    path.write_bytes(saved[: len(saved) // 3])  # cut short, as by a full disk
    third = start_on_a_fresh_machine(cache, tmp_path / "machine-3")
    assert "error" in third
    assert third["graphs_compiled"] == first["graphs_compiled"]
    assert third["saved_bytes"] > 0
    assert len(path.read_bytes()) > len(saved) // 3
