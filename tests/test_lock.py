"""requirements/lock.txt: `make setup` installed exactly what it pins, and it still fits the
ranges in pyproject.toml.

A venv made from the ranges instead (or an older lock) passes other tests while running
other libraries than CI tested: issue 29's transformers 5.25 was such a case.
"""

from __future__ import annotations

import re
import sysconfig
from importlib.metadata import distribution, distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11 on; the lock is made with 3.11

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "lock.txt"
TORCH = ROOT / "requirements" / "torch.txt"
# installed beside the lock on purpose: the project itself, pip (the Makefile pins it),
# torch and what torch brings (requirements/torch.txt: the CUDA build's own packages)
OUTSIDE_THE_LOCK = {"facecast", "pip", "torch"}


def locked() -> dict[str, str]:
    """{canonical name: version} of the lock's pins (`name==version \\`)."""
    pins = re.findall(r"^([A-Za-z0-9._-]+)(?:\[[^\]]*\])?==([^\s;\\]+)", LOCK.read_text(), re.M)
    return {canonicalize_name(name): v for name, v in pins}


def installed() -> dict[str, str]:
    """What pip installed into the venv (its site-packages only: Ray puts a folder of its
    own vendored packages on sys.path once imported, and they are not installs)."""
    paths = sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})
    return {canonicalize_name(d.metadata["Name"]): d.version for d in distributions(path=paths)}


def brought_by_torch() -> set[str]:
    """The installed packages torch requires, directly or through others."""
    seen: set[str] = set()
    todo = ["torch"]
    while todo:
        for text in distribution(todo.pop()).requires or []:
            req = Requirement(text)
            name = canonicalize_name(req.name)
            if (req.marker is None or req.marker.evaluate()) and name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def test_every_locked_version_is_the_installed_one():
    have = installed()
    wrong = {
        name: f"locked {v}, installed {have.get(name, 'nothing')}"
        for name, v in locked().items()
        if have.get(name) != v
    }
    assert wrong == {}, "run `make setup` (or `make clean setup`): " + repr(wrong)


def test_nothing_is_installed_that_the_lock_does_not_name():
    extra = set(installed()) - set(locked()) - OUTSIDE_THE_LOCK - brought_by_torch()
    assert extra == set(), f"installed but not locked: {sorted(extra)} (`make clean setup`)"


def test_torch_is_the_pinned_release():
    (pin,) = [Requirement(x) for x in TORCH.read_text().splitlines() if x and x[0] != "#"]
    have = Version(distribution("torch").version)  # 2.13.0+cpu on a CPU machine
    assert pin.name == "torch" and have.public in pin.specifier, (have, pin)


def test_the_lock_fits_pyprojects_ranges():
    """Every dependency and test extra of pyproject.toml is locked inside its range: a
    range edited without `make lock` fails here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [Requirement(x) for x in project["dependencies"]]
    wanted += [Requirement(x) for name in ("test", "fleet", "pipecat") for x in extras[name]]
    pins = locked()
    outside = [
        str(req)
        for req in wanted
        if req.name not in OUTSIDE_THE_LOCK
        and not req.specifier.contains(pins.get(canonicalize_name(req.name), "0"))
    ]
    assert outside == [], f"not locked inside the range, run `make lock`: {outside}"


def test_every_pin_carries_a_hash():
    """`pip install --require-hashes` refuses a pin without one; say which here."""
    blocks = re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text())
    bare = [b.split()[0] for b in blocks if "==" in b.split("\n")[0] and "--hash=sha256:" not in b]
    assert bare == []
