"""Facecast live: the avatar as a WebRTC service.

`facecast serve` (see `realtime.server`) answers WebRTC offers; each peer gets a
`realtime.session.PeerSession`:

    mic audio (Opus) → InputResampler (PyAV: 48 kHz stereo → mono → 16 kHz)
        → PlaybackTimeline (48 kHz, for playback) → AvatarAudioTrack ─┐ one PlayoutClock:
        → VoiceActivityDetector (silero-vad)      → events            │ video n at t0 + n·40 ms,
        → GenerationWorker (engine thread)        → FrameQueue        │ audio k at t0 + k·20 ms
                                                  → AvatarVideoTrack ─┘

Modules, by job:

- serving: `server` (aiohttp app, routes, CLI), `edge` (JSON answers outside the app),
  `security` (token, same-origin, timeouts), `service` (the engine, sessions, uploads),
  `engine_host` (the engine here or in its own process), `engine_process` (that process),
  `metrics` (Prometheus), `errors`, `photos` (a session's uploaded photo), `reference` (the
  server's identity image), `dtls`, `ice_servers`;
- signalling: `offer` (an offer's checks), `negotiation` (a session from an offer), `whip`
  (WHIP ingest), `whep/` (WHEP viewers: one encode fanned out), `speech_ws` (the utterance
  channel over a WebSocket);
- one session: `session` (PeerSession), `audio_in` (decode, resample, timeline), `vad`,
  `generation` (the engine thread), `playout` (the delay from the latency budget), `tracks`
  (paced A/V), `events` (data channel, playback), `utterance` (an agent's pushed speech),
  `teardown` (freeing a closed call), `sinks` (per-session sinks), `kvs/` (mirror to Kinesis
  Video Streams, attached through `build_app(..., sink_factories=[...])`);
- clients and beyond one server: `client` (aiortc client library), `call` (a call from the
  command line, and its A/V analysis), `fleet/` (`serve --cluster ray`), `integrations/`
  (Pipecat).

Run: `facecast serve --config tiny` then open http://127.0.0.1:8080/ (or
`python -m realtime.call http://127.0.0.1:8080 --wav speech.wav --out avatar.mp4`).
"""
