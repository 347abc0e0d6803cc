"""pipeline.models.encoders.pretrained: every transformers load keeps the library on
Facecast's own code path (hub kernels off), and a refusal by the library is one line naming
it and its version, exit 2.

transformers 5.25 turned hub kernels on by default in `from_pretrained`, and refuses to load
without the `kernels` package (issue 29). The slow tests here install 5.25.0 beside the
locked version (`pip install --target`, in front on PYTHONPATH) and run the loader tests
against it; `make test-newest` does the same for whatever is newest.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from pipeline.flashhead.random_release import write_random_release

ROOT = Path(__file__).resolve().parent.parent
SPEECH = ROOT / "pipeline" / "assets" / "sample_speech.wav"

# the tests that read real-model folders through transformers and diffusers (wav2vec2-base
# through FlashHead's engine, wav2vec2-large and umT5 against the authors' fixtures, the
# Wan and LTX VAEs, this file's refusal): `make test-newest` runs them too
LOADER_TESTS = (
    "tests/test_pretrained.py",
    "tests/test_flashhead.py",
    "tests/test_liveavatar_release.py::test_the_prompt_encoder_reproduces_wans_t5_encoder",
    "tests/test_liveavatar_release.py::test_the_speech_features_reproduce_wan_s2vs_audio_encoder",
    "tests/test_liveavatar_release.py::test_a_random_release_reads_back_through_every_loader",
    "tests/test_wan_vae.py",
    "tests/test_ltx_vae.py",
)

# the command line, after one edit of the options every model load takes: `facecast` as a
# user runs it, but with the library's own default put back (or a switch turned on)
CLI_WITH_OPTIONS = (
    "import sys\n"
    "from pipeline.models.encoders import pretrained\n"
    "{edit}\n"
    "from facecast.cli import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@pytest.fixture(scope="module")
def release(tmp_path_factory) -> tuple[Path, Path]:
    """A FlashHead release of random weights at test sizes, and its wav2vec2-base folder."""
    return write_random_release(tmp_path_factory.mktemp("flashhead"), "test", seed=5)


def render_with(
    edit: str, release: tuple[Path, Path], out: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    weights, wav2vec = release
    args = ["render", "--model", "flashhead-pro", "--weights", str(weights)]
    args += ["--wav2vec", str(wav2vec), "--audio", str(SPEECH), "--out", str(out)]
    args += ["--device", "cpu"]
    script = CLI_WITH_OPTIONS.format(edit=edit)
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def assert_one_line_refusal(run: subprocess.CompletedProcess, transformers: str, folder: Path):
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    (line,) = [x for x in run.stderr.splitlines() if x.startswith("facecast:")]
    expected = f"facecast: error: transformers {transformers} refused to load {folder} as a wav2vec2 model: "
    assert line.startswith(expected), line
    assert "Kernels are not available" in line, line
    assert "not loadable" not in run.stderr


def test_every_transformers_load_goes_through_pretrained():
    """A new `from_pretrained` call elsewhere in the pipeline would miss the switches."""
    calls = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sorted((ROOT / "pipeline").rglob("*.py"))
        if path.name != "pretrained.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\.from_pretrained\(", line)
    ]
    assert calls == [], "load through pipeline.models.encoders.pretrained: " + ", ".join(calls)


@pytest.mark.slow  # runs the command line in a process of its own
def test_a_library_refusal_is_one_line_naming_the_library_and_its_version(release, tmp_path):
    # the installed transformers refuses for real: kernels asked for, the package absent
    assert importlib.util.find_spec("kernels") is None, "the lock holds no `kernels` package"
    out = tmp_path / "out.mp4"
    run = render_with('pretrained.MODEL_OPTIONS["use_kernels"] = True', release, out)
    assert_one_line_refusal(run, version("transformers"), release[1])
    assert not out.exists()


@pytest.fixture(scope="module")
def transformers_5_25(tmp_path_factory) -> dict[str, str]:
    """transformers 5.25.0 alone in a scratch folder (its `kernels` requirement left out, as
    on a machine that has none), put in front of the venv's own by PYTHONPATH."""
    target = tmp_path_factory.mktemp("transformers-5.25.0")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
    subprocess.run([*pip, "transformers==5.25.0"], check=True, timeout=300)
    env = {"PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
    seen = subprocess.run(
        [sys.executable, "-c", "import transformers; print(transformers.__version__)"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    assert seen.stdout.strip() == "5.25.0"
    return env


@pytest.mark.slow  # installs a wheel and runs the loader tests in a process of their own
def test_the_loaders_pass_on_transformers_5_25(transformers_5_25):
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow"]
        + list(LOADER_TESTS),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
        env={**os.environ, **transformers_5_25},
    )
    assert run.returncode == 0, run.stdout[-4000:]
    assert " passed" in run.stdout.splitlines()[-1]


@pytest.mark.slow  # installs a wheel and runs the command line in a process of its own
def test_transformers_5_25s_own_default_is_the_refusal_users_saw(
    transformers_5_25, release, tmp_path
):
    # what the switch is for: without use_kernels=False, 5.25 will not load wav2vec2
    run = render_with(
        'pretrained.MODEL_OPTIONS.pop("use_kernels")',
        release,
        tmp_path / "o.mp4",
        transformers_5_25,
    )
    assert_one_line_refusal(run, "5.25.0", release[1])
