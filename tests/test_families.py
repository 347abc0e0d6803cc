"""The point of the family rows (issue 32): a new model family is a folder, a row and a
preset. `tests/support/fakewan` is one, registered here and nowhere else: `facecast render`
renders it and a server serves it, with no other file of the project told about it."""

import time

import av
import pytest
from support.fakewan import PRESET, FakeWanConfig
from support.realtime import tone_wav

from facecast.cli import main
from pipeline import families
from pipeline.config import load_config
from pipeline.errors import ConfigError


def test_a_registered_family_renders_through_the_command(fakewan, tmp_path):
    audio, out = tmp_path / "tone.wav", tmp_path / "fake.mp4"
    tone_wav(audio, 1.0, 220.0)
    t = time.perf_counter()
    assert main(["render", "--config", str(PRESET), "--audio", str(audio), "--out", str(out)]) == 0
    seconds = time.perf_counter() - t
    with av.open(str(out)) as container:
        frames = sum(1 for _ in container.decode(video=0))
    assert frames == 25  # one second of audio, the last chunk trimmed to it
    assert seconds < 10  # ~1 s: no model, nothing to load


def test_a_family_reads_only_its_own_sections(fakewan):
    cfg = load_config(PRESET, {"flashhead.steps": 0})  # not its section: never read, never checked
    assert cfg.family is fakewan
    assert list(cfg.sections) == ["video", "schedule", "runtime", "fakewan"]
    assert cfg.section(FakeWanConfig).gain == 4.0
    with pytest.raises(ConfigError, match=r"fakewan.gain: must be in \(0, 100\]"):
        load_config(PRESET, {"fakewan.gain": 0})
    with pytest.raises(ConfigError, match="unknown config key 'fakewan.gian'"):
        load_config(PRESET, {"fakewan.gian": 1})
    assert cfg.vae_temporal_stride == 4 and cfg.lookahead_frames == 0
    with pytest.raises(ConfigError, match="flashhead.steps"):
        load_config("flashhead-pro", {"flashhead.steps": 0})


def test_the_row_decides_what_the_command_accepts(fakewan, tmp_path, capsys):
    audio = tmp_path / "tone.wav"
    tone_wav(audio, 0.5, 220.0)
    photo = str(families.__file__).replace("families.py", "assets/reference.png")
    argv = [
        "render",
        "--config",
        str(PRESET),
        "--audio",
        str(audio),
        "--out",
        str(tmp_path / "o.mp4"),
    ]
    assert main([*argv, "--reference", photo, "--face-box", "1,1,30,30"]) == 2
    err = capsys.readouterr().err
    assert "--face-box frames a photo" in err and len(err.strip().splitlines()) == 1


def test_an_unknown_stack_names_the_known_ones(tmp_path):
    preset = tmp_path / "nobody.yaml"
    preset.write_text("runtime: {stack: fakewan}\n")  # not registered here
    with pytest.raises(ConfigError, match=r"runtime.stack: must be one of .*'liveavatar'"):
        load_config(preset)


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_registered_family_is_served(fakewan, tmp_path):
    import asyncio

    from support.realtime import make_speech_wav, running_server

    from facecast_client import FacecastClient, PcmSource
    from pipeline.startup import EngineOptions, start_engine

    engine, _ = await asyncio.to_thread(
        start_engine, EngineOptions(config=str(PRESET), device="cpu")
    )
    assert engine.step_seconds is not None  # warmed up as every family is
    speech = make_speech_wav(tmp_path / "s.wav", [0.3, "One two three.", 0.3])
    async with running_server(engine) as (url, _):
        client = FacecastClient(url, PcmSource.from_wav(speech.path))
        await client.connect()
        await client.wait_frames(25, timeout=60)
        await client.close()
