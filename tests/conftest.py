"""Shared fixtures: small real inputs made offline (espeak-ng speech, a synthetic photo)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import moto
import numpy as np
import pytest
from support.kvs import AWS_TEST_KEY, AWS_TEST_SECRET

from pipeline.config import load_config
from pipeline.diffusion.engine import Engine
from pipeline.media import write_png
from pipeline.startup import freeze_long_lived_objects
from realtime.kvs.control import clear_client_cache


def synthetic_reference(h: int = 160, w: int = 128) -> np.ndarray:
    """A face-like test card: background gradient, skin oval, eyes, mouth."""
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.zeros((h, w, 3), np.uint8)
    img[..., 2] = (60 + 120 * yy / h).astype(np.uint8)
    face = ((yy - h * 0.5) / (h * 0.35)) ** 2 + ((xx - w * 0.5) / (w * 0.3)) ** 2 < 1
    img[face] = (220, 180, 150)
    for ex in (0.38, 0.62):
        eye = ((yy - h * 0.42) ** 2 + (xx - w * ex) ** 2) < (w * 0.04) ** 2
        img[eye] = (30, 30, 40)
    mouth = (np.abs(yy - h * 0.65) < h * 0.02) & (np.abs(xx - w * 0.5) < w * 0.12)
    img[mouth] = (150, 40, 50)
    return img


@pytest.fixture(scope="session")
def assets(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("assets")
    out = {"reference": write_png(d / "reference.png", synthetic_reference())}
    if shutil.which("espeak-ng") is None:
        pytest.fail("espeak-ng is missing: run `make sysdeps` (apt-get install espeak-ng)")
    speech = d / "speech_22k.wav"
    subprocess.run(
        [
            "espeak-ng",
            "-s",
            "170",
            "-w",
            str(speech),
            "Hello there. This is Facecast, a talking avatar made of pixels.",
        ],
        check=True,
    )
    out["speech"] = speech
    return out


@pytest.fixture(scope="session", autouse=True)
def long_lived_objects_frozen() -> None:
    """The test process holds its imports out of the collector's sight, as a server does
    once its engine is warm (each test server freezes what exists when it starts, too): a
    full collection of this process's ~600,000 objects held the GIL for 0.6-4 s in CI's
    slow run, which a live-timing test reads as missed frames."""
    freeze_long_lived_objects()


@pytest.fixture(scope="session")
def tiny_engine() -> Engine:
    return Engine.load(load_config("tiny"), "cpu")


@pytest.fixture
def aws(monkeypatch):
    """moto's AWS with known fake static credentials in the environment and nothing else
    (no profile, no config files, no instance metadata), so no real account is reachable."""
    mock = moto.mock_aws()
    mock.start()
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AWS_TEST_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", AWS_TEST_SECRET)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    clear_client_cache()
    yield
    clear_client_cache()
    monkeypatch.undo()
    mock.stop()


@pytest.fixture
def fakewan():
    """The throwaway family (`tests/support/fakewan`) registered for one test, and only it."""
    from support.fakewan import FAKEWAN

    from pipeline import families

    families.register(FAKEWAN)
    try:
        yield FAKEWAN
    finally:
        families.unregister(FAKEWAN.stack)
