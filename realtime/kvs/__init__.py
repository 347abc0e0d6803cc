"""Mirror of live avatar sessions to Amazon Kinesis Video Streams (PutMedia).

Wiring (server side):

    from realtime.kvs import KvsMirror, StreamNamer, add_kvs_arguments, options_from_args

    add_kvs_arguments(serve_parser)            # --kvs-stream/--kvs-region/--kvs-create/...
    kvs = options_from_args(args)              # KvsOptions; kvs.enabled is False without --kvs-stream
    namer = StreamNamer(kvs.stream)            # per server: NAME, NAME-2, NAME-3, ...
    mirror = KvsMirror(kvs, namer.next_name(offer.get("kvs_stream")), width, height, fps=25,
                       registry=prometheus_registry)
    await mirror.start()
    mirror.put_video(frame_rgb, n); mirror.put_audio(pcm_int16_48k, sample_index)
    await mirror.close()
"""

from realtime.kvs.errors import KvsConfigError, KvsError
from realtime.kvs.metrics import KvsStats
from realtime.kvs.mirror import KvsMirror
from realtime.kvs.options import KvsOptions, StreamNamer, add_kvs_arguments, options_from_args

__all__ = [
    "KvsConfigError",
    "KvsError",
    "KvsMirror",
    "KvsOptions",
    "KvsStats",
    "StreamNamer",
    "add_kvs_arguments",
    "options_from_args",
]
