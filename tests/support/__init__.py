"""Helpers the tests share, imported one way: `from support.<module> import name`.

`realtime`: servers, peers, speech WAVs and scripted engines; `kvs`: the fake KVS PutMedia
endpoint and mirror options; `gstreamer`: the GStreamer webrtcbin peer (`gst_peer.py`,
run under the system Python); `photos`: portraits and bad images; `whep`: a plain WHEP
player; `fleet`: a Ray cluster on loopback and fronts on it.
"""
