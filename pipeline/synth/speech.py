"""Offline speech with Debian's espeak-ng: varied sentences, voices, speeds and pauses.

espeak-ng writes 22.05 kHz 16-bit WAV; `pipeline.media.read_audio` decodes it and resamples
it to the model rate (libswresample, zero delay).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.clock import MODEL_RATE
from pipeline.media import read_audio

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
        return read_audio(wav, MODEL_RATE)


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
    pitch = int(rng.integers(25, 75))  # not the clock: espeak's pitch, 0-99
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
