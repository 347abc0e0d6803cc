"""Sinks: what receives a session's output besides its peer (a KVS mirror), attached by
factories the server is built with (`build_app(..., sink_factories=[...])`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pipeline.clock import FPS
from realtime.kvs import KvsMirror, KvsOptions, StreamNamer
from realtime.session import PeerSession
from realtime.tracks import MediaSink

# Called for each new session; returns a started sink (or None) that receives the output
# frames and audio, e.g. `realtime.kvs.KvsMirror`. The session closes it when it ends.
SinkFactory = Callable[[PeerSession], Awaitable[MediaSink | None]]


def kvs_sink_factory(options: KvsOptions) -> SinkFactory:
    """Each session mirrored to its own KVS stream: the offer's `kvs_stream`, else the
    server's --kvs-stream name, then NAME-2, NAME-3, …"""
    assert options.stream is not None
    options.validate(FPS)  # fail at start-up, not at the first call
    namer = StreamNamer(options.stream)

    async def attach(session: PeerSession) -> MediaSink:
        name = namer.next_name(session.offer_options.get("kvs_stream"))
        width, height = session.video_size
        mirror = KvsMirror(options, name, width, height, fps=FPS, registry=session.metrics.registry)
        await mirror.start()
        return mirror

    return attach
