"""Offline speech with Debian's espeak-ng: varied sentences, voices, speeds and pauses.

espeak-ng writes 22.05 kHz 16-bit WAV; we read it with the stdlib `wave` module and
resample to 16 kHz with a windowed-sinc polyphase filter (320/441), so the result is
deterministic and does not depend on an external resampler's version.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import wave
from dataclasses import dataclass
from functools import lru_cache
from math import gcd
from pathlib import Path

import numpy as np

from pipeline.clock import MODEL_RATE

# Sentences written for this project, several per language, with commas and full
# stops so the synthetic speaker pauses inside utterances too.
CORPUS: dict[str, tuple[str, ...]] = {
    "en": (
        "Hello, and welcome to Facecast. This face is drawn frame by frame.",
        "The weather was calm this morning, so we walked along the river.",
        "Could you bring me the blue notebook from the top shelf, please?",
        "Seven hundred people waited outside, but only twelve were let in.",
        "I think the answer is simple: measure first, then change one thing.",
        "Oh really? I had no idea the museum was open on Sundays.",
        "Put the kettle on, and we will talk about the plan over tea.",
        "Zebras, foxes and owls were painted on the nursery wall.",
        "My favourite sound is rain on a tin roof at night.",
        "We shipped the update on Friday, and nothing broke. Amazing!",
        "Thank you for waiting. Your call is important, honestly.",
        "She sells sea shells, and he sings soft songs in the evening.",
    ),
    "de": (
        "Guten Morgen, heute scheint die Sonne über dem ganzen Land.",
        "Ich habe das Buch gestern Abend in der Bahn zu Ende gelesen.",
        "Können Sie mir bitte sagen, wo der nächste Bahnhof ist?",
        "Wir treffen uns um acht Uhr vor dem alten Rathaus.",
    ),
    "fr": (
        "Bonjour à tous, merci d'être venus si nombreux ce soir.",
        "Le petit chat dort au soleil, près de la fenêtre ouverte.",
        "Nous partirons demain matin, avant le lever du jour.",
        "Pouvez-vous répéter la question, s'il vous plaît?",
    ),
    "es": (
        "Buenos días, hoy vamos a hablar de la música y del mar.",
        "Mi hermana vive en una casa pequeña con un jardín enorme.",
        "¿Dónde está la estación de autobuses, por favor?",
    ),
    "nl": (
        "Goedemiddag, wij gaan vandaag samen een nieuwe stad bekijken.",
        "De fiets staat achter het huis, naast de groene deur.",
        "Het regent al de hele week, maar morgen wordt het beter.",
    ),
    "it": (
        "Buonasera, questa sera parliamo di viaggi e di montagne.",
        "Il treno per Milano parte alle nove e mezza dal binario tre.",
    ),
    "pt": (
        "Bom dia, hoje o céu está limpo e o mar está calmo.",
        "Vamos jantar juntos no sábado, perto da praça antiga.",
    ),
}

# espeak-ng voice variants (male and female timbres).
VARIANTS = ("m1", "m3", "m5", "m7", "f1", "f2", "f3", "f4", "klatt", "klatt3")


class SpeechError(RuntimeError):
    """espeak-ng is missing or failed."""


@dataclass(frozen=True)
class Utterance:
    """One synthesised stretch of speech with the settings that made it."""

    text: str
    lang: str
    voice: str
    speed_wpm: int
    pitch: int
    samples: np.ndarray  # float32 mono 16 kHz


def espeak_path() -> str:
    path = shutil.which("espeak-ng")
    if path is None:
        raise SpeechError(
            "espeak-ng is not installed; on Debian/Ubuntu run `sudo apt-get install espeak-ng` "
            "(or `make sysdeps`)"
        )
    return path


def read_wav(path: str | Path) -> tuple[np.ndarray, int]:
    """Mono float32 in [-1, 1] and the sample rate of a 16-bit PCM WAV file."""
    with wave.open(str(path), "rb") as w:
        if w.getsampwidth() != 2:
            raise SpeechError(f"{path}: expected 16-bit PCM, got {8 * w.getsampwidth()}-bit")
        rate, channels = w.getframerate(), w.getnchannels()
        data = np.frombuffer(w.readframes(w.getnframes()), "<i2").astype(np.float32) / 32768.0
    if channels > 1:
        data = data.reshape(-1, channels).mean(axis=1)
    return data, rate


def write_wav(path: str | Path, samples: np.ndarray, rate: int = MODEL_RATE) -> None:
    """Write mono float32 samples as 16-bit PCM."""
    pcm = np.clip(np.round(np.asarray(samples) * 32767.0), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())


@lru_cache(maxsize=8)
def _polyphase_filter(up: int, down: int, half_taps: int) -> np.ndarray:
    """Windowed-sinc low-pass for rational resampling, split into `up` phases.

    Row p holds the taps for output phase p; cutoff at the lower Nyquist with a
    Kaiser window (beta 8.6, ~-80 dB stopband).
    """
    cutoff = 0.5 / max(up, down) * 0.94  # in cycles per upsampled sample
    n = np.arange(-half_taps * up, half_taps * up + 1)
    h = 2 * cutoff * np.sinc(2 * cutoff * n) * np.kaiser(len(n), 8.6) * up
    # Pad to a multiple of `up` so taps split evenly into phases.
    h = np.pad(h, (0, (-len(h)) % up))
    return h.astype(np.float64)


def resample(x: np.ndarray, rate_in: int, rate_out: int = MODEL_RATE) -> np.ndarray:
    """Rational-ratio polyphase resampling, zero-delay (output 0 aligns with input 0)."""
    x = np.asarray(x, np.float64).reshape(-1)
    if rate_in == rate_out:
        return x.astype(np.float32)
    g = gcd(rate_in, rate_out)
    up, down = rate_out // g, rate_in // g
    half_taps = 16
    h = _polyphase_filter(up, down, half_taps)
    centre = half_taps * up  # index of the filter's centre tap
    n_out = (len(x) * up) // down
    # Output k sits at upsampled position k*down; the taps it touches are
    # x[j] with j*up within the filter around that position.
    pos = np.arange(n_out, dtype=np.int64) * down
    first = -(-(pos - centre) // up)  # first input index in reach
    n_taps = 2 * half_taps + 1
    xp = np.pad(x, (2 * half_taps + 2, 2 * half_taps + 2))
    out = np.zeros(n_out)
    for t in range(n_taps):
        j = first + t
        k = centre + j * up - pos  # tap index into h
        valid = (k >= 0) & (k < len(h))
        out += np.where(valid, xp[j + 2 * half_taps + 2] * h[np.clip(k, 0, len(h) - 1)], 0.0)
    return out.astype(np.float32)


def synthesize(
    text: str, lang: str = "en", variant: str = "m3", speed_wpm: int = 160, pitch: int = 50
) -> np.ndarray:
    """Speak `text` with espeak-ng; float32 mono 16 kHz."""
    voice = f"{lang}+{variant}" if variant else lang
    with tempfile.TemporaryDirectory() as tmp:
        wav = Path(tmp) / "speech.wav"
        cmd = [espeak_path(), "-v", voice, "-s", str(speed_wpm), "-p", str(pitch), "-w", str(wav)]
        proc = subprocess.run(cmd + [text], capture_output=True, timeout=60)
        if proc.returncode != 0 or not wav.exists():
            raise SpeechError(
                f"espeak-ng failed for voice {voice!r}: {proc.stderr.decode()[-300:]}"
            )
        data, rate = read_wav(wav)
    return resample(data, rate, MODEL_RATE)


def random_speech(
    rng: np.random.Generator, min_s: float = 6.0, max_s: float = 14.0
) -> tuple[np.ndarray, list[Utterance]]:
    """A clip of one speaker: a few sentences with random pauses between them.

    One language and voice per clip; leading and trailing silence of 0.2-1 s and
    pauses of 0.3-1.5 s between sentences, so idle (silent) stretches are common.
    """
    lang = str(rng.choice(sorted(CORPUS)))
    variant = str(rng.choice(VARIANTS))
    speed = int(rng.integers(120, 210))
    pitch = int(rng.integers(25, 75))
    gain = rng.uniform(0.5, 1.0)
    target = rng.uniform(min_s, max_s)
    parts = [np.zeros(int(rng.uniform(0.2, 1.0) * MODEL_RATE), np.float32)]
    utterances: list[Utterance] = []
    total = len(parts[0])
    sentences = CORPUS[lang]
    while total < target * MODEL_RATE or not utterances:
        text = sentences[int(rng.integers(len(sentences)))]
        audio = synthesize(text, lang, variant, speed, pitch)
        audio = audio / (np.max(np.abs(audio)) + 1e-6) * 0.8 * gain
        utterances.append(Utterance(text, lang, variant, speed, pitch, audio))
        pause = np.zeros(int(rng.uniform(0.3, 1.5) * MODEL_RATE), np.float32)
        parts += [audio, pause]
        total += len(audio) + len(pause)
    return np.concatenate(parts).astype(np.float32), utterances
