"""The audio/video clock: every rate and frame duration, and the conversions between them.

Video frame n spans model-audio samples [n * MODEL_SAMPLES_PER_FRAME, (n + 1) * ...) and
output-audio samples [n * OUTPUT_SAMPLES_PER_FRAME, ...), and carries the RTP timestamp
n * VIDEO_TICKS_PER_FRAME. Nothing else in the project spells these numbers.
"""

FPS = 25  # video frames per second
MODEL_RATE = 16_000  # Hz, the audio the models hear
OUTPUT_RATE = 48_000  # Hz, the audio played out (Opus, AAC, KVS)
VIDEO_CLOCK = 90_000  # Hz, RTP and MKV video timestamps

FRAME_SECONDS = 1 / FPS
MODEL_SAMPLES_PER_FRAME = MODEL_RATE // FPS  # 640
OUTPUT_SAMPLES_PER_FRAME = OUTPUT_RATE // FPS  # 1920
VIDEO_TICKS_PER_FRAME = VIDEO_CLOCK // FPS  # 3600

# WebRTC audio travels in 20 ms packets (what a microphone sends and Opus encodes)
AUDIO_PACKETS_PER_SECOND = 50
OUTPUT_SAMPLES_PER_PACKET = OUTPUT_RATE // AUDIO_PACKETS_PER_SECOND  # 960
OUTPUT_SAMPLES_PER_MODEL_SAMPLE = OUTPUT_RATE // MODEL_RATE  # 3: a model-rate index at 48 kHz


def model_samples(seconds: float) -> int:
    return int(seconds * MODEL_RATE)
