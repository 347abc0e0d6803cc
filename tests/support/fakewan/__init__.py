"""A throwaway model family, to show what adding one takes: this folder (its engine), a
row (`FAKEWAN` and its config section, registered by the test that uses it) and a preset (`fakewan.yaml`), and
nothing else. Its "model" paints each 8-frame chunk grey-to-white with the loudness of the
chunk's audio window, over the reference: enough for render and serve to run it for real.
"""

from dataclasses import dataclass
from pathlib import Path

from pipeline.families import Family
from pipeline.sections import check


@dataclass
class FakeWanConfig:
    """Its own config section (`fakewan:` in its preset)."""

    gain: float = 4.0  # chunk loudness → brightness

    def validate(self) -> None:
        check(0 < self.gain <= 100, "fakewan.gain", "must be in (0, 100]")


PRESET = Path(__file__).resolve().parent / "fakewan.yaml"

FAKEWAN = Family(
    "fakewan",
    "a throwaway fake Wan-based family (tests/support/fakewan)",
    "support.fakewan.engine:FakeWanEngine",
    sections=(),
    temporal_stride=lambda cfg: 4,
    lookahead_frames=lambda cfg: 0,
    section=FakeWanConfig,
)
