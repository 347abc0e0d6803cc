"""Facecast live: the avatar as a WebRTC service.

`facecast serve` (see `realtime.server`) answers WebRTC offers; each peer gets a
`realtime.session.PeerSession`, a short chain of parts, each with its own state and close:

    audio in         AudioIn          mic (Opus → 48 kHz mono) and utterances → PlaybackTimeline,
                     (audio_in)       16 kHz → VadThread (events) and → the engine feed
    engine feed      EngineFeed       GenerationWorker (engine thread) → FrameQueue
                     (engine_feed)
    playout          PlayoutControl   the delay's budget, the PlayoutClock, its control loop
                     (playout)
    outgoing tracks  OutgoingTracks   AvatarVideoTrack (frame n at t0 + n·40 ms) and
                     (tracks)         AvatarAudioTrack (packet k at t0 + k·20 ms), sinks
    control channel  ControlChannel   events out (data channel, listeners), playback events,
                     (control)        the agent's utterances
    peer connection  PeerLink         aiortc's connection, freed at once when closed
                     (connection)

The parts share two buffers and a clock (`buffers`), so none imports one that imports it.
An interrupt is one `Interrupt` message through the parts (`PeerSession.interrupt`).

Modules, by job:

- serving: `server` (aiohttp app, routes, CLI), `edge` (JSON answers outside the app),
  `security` (token, same-origin, timeouts), `service` (the engine, sessions, uploads),
  `engine_host` (the engine here or in its own process), `engine_process` (that process),
  `metrics` (Prometheus), `errors`, `photos` (a session's uploaded photo), `reference` (the
  server's identity image), `dtls`, `ice_servers`;
- signalling: `offer` (an offer's checks), `negotiation` (a session from an offer), `whip`
  (WHIP ingest), `whep/` (WHEP viewers: one encode fanned out), `speech_ws` (the utterance
  channel over a WebSocket);
- one session: `session` (PeerSession: its parts in order, the interrupt path, close),
  `session_config` (how a session behaves: margins, timeouts, silence fill),
  `buffers` (what the parts share: the playback timeline, the frame queue, the playout
  clock), `audio_in` (decode, resample, VAD feed), `vad`, `engine_feed` (the session's
  engine part), `generation` (its worker thread: what audio a step gets, a backlog
  skipped), `playout` (the delay from the latency budget, its control loop),
  `engine_timing` (what a call plans on of its engine's steps), `stagger` (where live
  calls' steps fall in the engine's cycle: they take turns),
  `tracks` (paced A/V, sinks, speech-to-lips), `control` (events out, the interrupt
  message), `events` (event messages, playback), `utterance` (an agent's pushed speech),
  `connection` (the peer connection, freed at close), `sinks` (per-session sink
  factories), `kvs/` (mirror to Kinesis Video Streams, attached through `build_app(...,
  sink_factories=[...])`);
- beyond one server: `fleet/` (`serve --cluster ray`).

What calls a server (the Python client, `facecast call`, the Pipecat service) is a package
of its own, `facecast_client`, which no module here imports.

Run: `facecast serve --config tiny` then open http://127.0.0.1:8080/ (or
`facecast call http://127.0.0.1:8080 --wav speech.wav --out avatar.mp4`).
"""
