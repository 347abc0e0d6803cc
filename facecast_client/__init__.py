"""Facecast's client side: what calls a Facecast server, never imported by it.

    client     FacecastClient: one WebRTC call (aiortc), speech in, the avatar out;
               wait_until_ready (a server's engine is warm)
    media      PcmSource (a microphone's audio, at any speed), Received, CallRecorder (MP4)
    speech     UtteranceSender (an agent's utterances, on any transport), SpeechSocket (the
               WebSocket `/sessions/{id}/speech`)
    call       `facecast call`: one call from the command line; call_stats (what a client
               measured: first frame, fps, A/V offset, round trip)
    links      where an agent framework's avatar runs: a served session, or one in-process
    pipecat    FacecastVideoService, Facecast as a Pipecat avatar (`facecast[pipecat]`)

It stands apart from the server (`realtime`): agents, tests and benchmarks import it, and
no module of `realtime` or `pipeline` does (tests/test_house.py).
"""

from facecast_client.client import FacecastClient, wait_until_ready
from facecast_client.media import CallRecorder, PcmSource, Received, read_pcm
from facecast_client.speech import SpeechSocket, UtteranceSender

__all__ = [
    "CallRecorder",
    "FacecastClient",
    "PcmSource",
    "Received",
    "SpeechSocket",
    "UtteranceSender",
    "read_pcm",
    "wait_until_ready",
]
