"""Facecast live: the avatar as a WebRTC service.

`facecast serve` (see `realtime.server`) answers WebRTC offers; each peer gets a
`realtime.session.PeerSession`:

    mic audio (Opus) → InputResampler (PyAV: 48 kHz stereo → mono → 16 kHz)
        → PlaybackTimeline (48 kHz, for playback) → AvatarAudioTrack ─┐ one PlayoutClock:
        → VoiceActivityDetector (silero-vad)      → events            │ video n at t0 + n·40 ms,
        → GenerationWorker (engine thread)        → FrameQueue        │ audio k at t0 + k·20 ms
                                                  → AvatarVideoTrack ─┘

Modules: `server` (aiohttp routes, CLI), `session` (one peer), `audio_in`, `vad`,
`worker` (engine thread), `tracks` (paced A/V, sinks), `events` (data channel, playback),
`metrics` (Prometheus), `client` (aiortc client library and CLI), `errors`, `kvs` (mirror
to Kinesis Video Streams, attached through `build_app(..., sink_factories=[...])`).

Run: `facecast serve --config tiny` then open http://127.0.0.1:8080/ (or
`python -m realtime.client http://127.0.0.1:8080 --wav speech.wav --out avatar.mp4`).
"""
