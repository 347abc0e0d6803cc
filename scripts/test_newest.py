"""The canary for new releases (`make test-newest`): the loader tests on the newest versions
pyproject.toml's ranges allow, and what differs from the lock.

    make test-newest                  # the Makefile builds .venv-newest, then runs this in it
    .venv-newest/bin/python scripts/test_newest.py [--no-force] [pytest args]

The Makefile installs the project into a scratch venv with `--upgrade --upgrade-strategy
eager` (torch kept at requirements/torch.txt: a newer torch is a multi-GB CUDA build). This
script, run by that venv's Python:

1. asks the index for each direct dependency's releases: the newest inside its range, and
   any past its upper bound (printed, not tried); where the resolver held one back (transformers 5.25.0 needs a `kernels` the index may not have),
   it says so and installs it anyway with --no-deps, as a machine that has the missing
   requirement would run it (`--no-force` skips this);
2. prints every version that differs from requirements/lock.txt;
3. runs the loader tests (tests/test_pretrained.py's LOADER_TESTS, the `slow` ones left out)
   and prints what failed.

It exits with pytest's status. Not part of CI: the lock is what CI tests; this says what the
next `make lock` would bring, and where the ranges' upper bounds should stop.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from importlib.metadata import distributions
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "lock.txt"
# installed apart from the ranges: the project, and torch at its pin (requirements/torch.txt)
NOT_CHECKED = {"facecast", "torch"}


def direct_requirements() -> list[Requirement]:
    """pyproject's dependencies and the extras `make setup` installs (test, fleet, pipecat)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = list(project["dependencies"])
    for extra in ("test", "fleet", "pipecat"):
        texts += project["optional-dependencies"][extra]
    reqs = [Requirement(t) for t in texts]
    return [r for r in reqs if canonicalize_name(r.name) not in NOT_CHECKED]


def installed() -> dict[str, str]:
    return {canonicalize_name(d.metadata["Name"]): d.version for d in distributions()}


def locked() -> dict[str, str]:
    pins = re.findall(r"^([A-Za-z0-9._-]+)(?:\[[^\]]*\])?==([^\s;\\]+)", LOCK.read_text(), re.M)
    return {canonicalize_name(name): v for name, v in pins}


def releases(req: Requirement) -> list[Version]:
    """The index's final releases of `req` (pip's own answer)."""
    run = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", req.name],
        capture_output=True,
        text=True,
    )
    found = re.search(r"^Available versions: (.*)$", run.stdout, re.M)
    versions = []
    for text in found.group(1).split(", ") if found else []:
        try:
            versions.append(Version(text))
        except InvalidVersion:
            continue
    return [v for v in versions if not v.is_prerelease]


def force_held_back(force: bool) -> tuple[list[str], list[str]]:
    """Step 1: (`name==newest` of each held-back package, lines naming each release past a
    range's upper bound)."""
    have = installed()
    held, past = [], []
    for req in direct_requirements():
        name = canonicalize_name(req.name)
        versions = releases(req)
        allowed = [v for v in versions if v in req.specifier]
        if allowed and name in have and Version(have[name]) < max(allowed):
            print(f"  {name}: the resolver chose {have[name]}, newest allowed {max(allowed)}")
            held.append(f"{name}=={max(allowed)}")
        if versions and allowed and max(versions) > max(allowed):
            past.append(f"  {name}{req.specifier}: {max(versions)} exists, not tried")
    if held and force:
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", *held]
        subprocess.run(pip, check=True)
        print(f"  installed anyway with --no-deps: {' '.join(held)}")
    return held, past


def lock_differences() -> list[str]:
    """Step 2: 'name: lock X -> newest Y' (or only in one of them)."""
    have, pins = installed(), locked()
    lines = []
    for name in sorted(set(have) | set(pins)):
        if name in NOT_CHECKED or name == "pip" or have.get(name) == pins.get(name):
            continue
        lines.append(f"  {name}: lock {pins.get(name, '-')} -> newest {have.get(name, '-')}")
    return lines


def loader_tests() -> list[str]:
    """tests/test_pretrained.py's LOADER_TESTS, read without importing the test module."""
    tree = ast.parse((ROOT / "tests" / "test_pretrained.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "LOADER_TESTS":
            return list(ast.literal_eval(node.value))
    raise SystemExit("tests/test_pretrained.py: no LOADER_TESTS")


def main(argv: list[str]) -> int:
    force = "--no-force" not in argv
    pytest_args = [a for a in argv if a != "--no-force"]
    print("== held back by the resolver", flush=True)
    held, past = force_held_back(force)
    if not held:
        print("  none")
    print("== releases past the ranges' upper bounds (raise a bound once its tests pass)")
    print("\n".join(past) or "  none", flush=True)
    print("== versions that differ from requirements/lock.txt")
    diff = lock_differences()
    print("\n".join(diff) or "  none", flush=True)
    print("== the loader tests on these versions", flush=True)
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider"]
    cmd += ["-m", "not slow", *loader_tests(), *pytest_args]
    tests = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    lines = tests.stdout.splitlines()
    failed = [x for x in lines if x.startswith(("FAILED", "ERROR"))]
    print("\n".join(failed + lines[-1:]))
    print(
        f"== summary: {len(held)} held back, {len(diff)} versions differ from the lock, "
        f"loader tests {'passed' if tests.returncode == 0 else 'FAILED'}"
    )
    if tests.returncode != 0:
        print(tests.stdout[-6000:], tests.stderr[-2000:], sep="\n")
    return tests.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
