"""The fleet: sessions placed across GPU nodes of a Ray cluster (`facecast serve --cluster ray`).

    caller ──HTTP signalling──▶ front (fleet/front.py) ──Ray actor calls──▶ worker actors
       ▲                          │   places each offer by free slots         (fleet/actor.py)
       └──────── WebRTC media, directly between the caller and the worker's node ◀──┘

Each worker is a Ray actor that owns one engine (started as `facecast serve` starts it) and
runs the server's own session machinery (`realtime.server.Service`): it hosts the peers of
its sessions. The front serves the page and the HTTP API, keeps a view of the workers
(`fleet/pool.py`), and finds a session's worker through the session registry, a named
detached actor (`fleet/registry.py`), so any front sees every session. WHIP and WHEP
signalling (`fleet/relay.py`) and the agent's speech WebSocket (`fleet/speech_relay.py`) are
relayed by the front to the session's worker; the worker's end of that socket is a channel
(`fleet/speech_channels.py`).
"""
