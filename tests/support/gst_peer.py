"""A GStreamer `webrtcbin` peer for the interop tests; runs under the system Python.

It is what a GStreamer user would write, with none of Facecast's code: Debian's
`python3-gi` bindings, webrtcbin (gst-plugins-bad), libnice, the stock Opus/VP8/H.264
elements. It is a subprocess of the test because `gi` lives in /usr/bin/python3, not in
the project's venv.

    /usr/bin/python3 tests/support/gst_peer.py offer http://127.0.0.1:8080 --codec vp8 --seconds 8
    /usr/bin/python3 tests/support/gst_peer.py whip http://127.0.0.1:8080/whip --token T --seconds 5

    /usr/bin/python3 tests/support/gst_peer.py whep http://127.0.0.1:8080/whep/SESSION --codec h264

`offer` signals through Facecast's JSON `POST /offer`: it sends an Opus tone and receives
the avatar's video (decoded with vp8dec or avdec_h264) and audio (opusdec). `whip` speaks
RFC 9725: `POST` application/sdp, then `DELETE` the returned Location at the end; with
`--receive` its offer also asks for the avatar's video and audio; with `--trickle` the offer
goes out before ICE gathering and the candidates follow as PATCHes (RFC 8840 fragments),
as webrtcbin produces them. `whep` is a WHEP player (draft-ietf-wish-whep) of an existing
session: a recvonly offer for Opus audio and VP8 or H.264 video, POSTed the same way, the
Location DELETEd at the end. Either way one JSON
report goes to stdout: frames decoded, their fps (by arrival time, after a settling
second), frame size, whether frames show a picture, audio received, the DTLS/ICE states.
"""

from __future__ import annotations

import argparse
import json
import queue
import re
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstSdp", "1.0")
gi.require_version("GstWebRTC", "1.0")
from gi.repository import GLib, Gst, GstSdp, GstWebRTC  # noqa: E402

VIDEO_CAPS = {
    "vp8": "application/x-rtp,media=video,encoding-name=VP8,payload=96,clock-rate=90000",
    "h264": (
        "application/x-rtp,media=video,encoding-name=H264,payload=102,clock-rate=90000,"
        "packetization-mode=(string)1,profile-level-id=(string)42e01f"
    ),
}
DECODE = {
    "VP8": "rtpvp8depay ! vp8dec",
    "H264": "rtph264depay ! h264parse ! avdec_h264",
}
AUDIO_CAPS = "application/x-rtp,media=audio,encoding-name=OPUS,payload=111,clock-rate=48000"
# A live 440 Hz tone, Opus-encoded: a microphone that never stops.
AUDIO_SEND = (
    "audiotestsrc is-live=true wave=sine freq=440 volume=0.3 ! audioconvert ! audioresample"
    f" ! audio/x-raw,rate=48000,channels=1 ! opusenc ! rtpopuspay pt=111 ! {AUDIO_CAPS}"
    " ! webrtc."
)
SETTLE_S = 1.0  # fps is measured after the first second of video (jitter buffer fill)


class Peer:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.loop = GLib.MainLoop()
        self.report: dict = {"mode": args.mode, "codec": args.codec, "errors": []}
        self.video_arrivals: list[float] = []
        self.video_flat = 0  # decoded frames with no picture (all one value)
        self.audio_samples = 0
        self.location: str | None = None
        self.trickle: queue.Queue[str | None] = queue.Queue()  # candidate lines; None: done
        self.start = time.monotonic()
        recvonly = GstWebRTC.WebRTCRTPTransceiverDirection.RECVONLY
        if args.mode == "whep":  # a player: nothing to send, both kinds received
            self.pipe = Gst.Pipeline.new("whep")
            self.webrtc = Gst.parse_launch("webrtcbin name=webrtc bundle-policy=max-bundle")
            self.pipe.add(self.webrtc)
            self.webrtc.emit("add-transceiver", recvonly, Gst.Caps.from_string(AUDIO_CAPS))
        else:
            self.pipe = Gst.parse_launch(
                f"webrtcbin name=webrtc bundle-policy=max-bundle {AUDIO_SEND}"
            )
            self.webrtc = self.pipe.get_by_name("webrtc")
            audio = self.webrtc.emit("get-transceiver", 0)  # made by linking AUDIO_SEND
            # With its codec set up front, the offer does not depend on the first buffer's
            # caps (webrtcbin 1.22 can otherwise answer create-offer with no offer).
            audio.set_property("codec-preferences", Gst.Caps.from_string(AUDIO_CAPS))
        if args.mode == "whip" and not args.receive:
            # RFC 9725 ingest: the microphone only, sendonly.
            audio.set_property("direction", GstWebRTC.WebRTCRTPTransceiverDirection.SENDONLY)
        if args.mode != "whip" or args.receive:
            caps = Gst.Caps.from_string(VIDEO_CAPS[args.codec])
            self.webrtc.emit("add-transceiver", recvonly, caps)
        self.webrtc.connect("on-negotiation-needed", self._on_negotiation_needed)
        self.webrtc.connect("notify::ice-gathering-state", self._on_gathering)
        self.webrtc.connect("on-ice-candidate", self._on_candidate)
        self.webrtc.connect("pad-added", self._on_pad)
        bus = self.pipe.get_bus()
        bus.add_signal_watch()
        bus.connect("message::error", self._on_error)

    def run(self) -> dict:
        self.pipe.set_state(Gst.State.PLAYING)
        GLib.timeout_add(int(self.args.timeout * 1000), self._give_up)
        self.loop.run()
        self.pipe.set_state(Gst.State.NULL)
        if self.location:
            self.report["delete_status"] = self._delete()
        return self._summary()

    # ---- signalling ------------------------------------------------------------------

    def _on_negotiation_needed(self, webrtc: Gst.Element) -> None:
        promise = Gst.Promise.new_with_change_func(self._on_offer, None)
        webrtc.emit("create-offer", None, promise)

    def _on_offer(self, promise: Gst.Promise, _data: object) -> None:
        reply = promise.get_reply()
        offer = reply.get_value("offer") if reply is not None else None
        if offer is None:
            self.report["errors"].append(f"create-offer failed: {reply and reply.to_string()}")
            self.loop.quit()
            return
        self.webrtc.emit("set-local-description", offer, Gst.Promise.new())
        if self.args.trickle:  # the offer goes now; candidates follow by PATCH
            self._send_offer(offer.sdp.as_text())

    def _on_gathering(self, webrtc: Gst.Element, _pspec: object) -> None:
        if webrtc.get_property("ice-gathering-state") != GstWebRTC.WebRTCICEGatheringState.COMPLETE:
            return
        if self.args.trickle:
            self.trickle.put(None)  # a=end-of-candidates
        else:  # the offer goes out once every candidate is in it
            self._send_offer(webrtc.get_property("local-description").sdp.as_text())

    def _on_candidate(self, _webrtc: Gst.Element, _mline: int, candidate: str) -> None:
        if self.args.trickle and candidate:
            self.trickle.put(candidate)

    def _send_offer(self, sdp: str) -> None:
        if "offer_sent" in self.report:
            return
        self.report["offer_sent"] = round(time.monotonic() - self.start, 3)
        self.report["offer_candidates"] = sdp.count("a=candidate:")
        threading.Thread(target=self._signal, args=(sdp,), daemon=True).start()

    def _signal(self, sdp: str) -> None:
        try:
            post = self._post_offer if self.args.mode == "offer" else self._post_whip
            answer = post(sdp)  # WHIP and WHEP: the offer as application/sdp
        except Exception as exc:  # report it; the test reads the JSON
            self.report["errors"].append(f"signalling: {exc}")
            GLib.idle_add(self.loop.quit)
            return
        GLib.idle_add(self._set_answer, answer)
        if self.args.trickle:
            self._patch_candidates(sdp)

    def _patch_candidates(self, offer: str) -> None:
        """RFC 9725 §4.3.1: one PATCH per candidate, then one with end-of-candidates."""
        ice = "".join(
            re.search(rf"^a={key}:.*$", offer, re.M)[0] + "\r\n" for key in ("ice-ufrag", "ice-pwd")
        )
        media = re.search(r"^m=audio .*$", offer, re.M)[0] + "\r\n"
        mid = re.search(r"^a=mid:.*$", offer, re.M)[0] + "\r\n"
        statuses = self.report.setdefault("patch_statuses", [])
        while True:
            candidate = self.trickle.get()
            line = "a=end-of-candidates" if candidate is None else f"a={candidate}"
            body = (ice + media + mid + line + "\r\n").encode()
            headers = self._headers("application/trickle-ice-sdpfrag")
            req = urllib.request.Request(self.location, body, headers, method="PATCH")
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    statuses.append(resp.status)
            except urllib.error.HTTPError as exc:
                statuses.append(exc.code)
            if candidate is None:
                return

    def _headers(self, content_type: str) -> dict:
        headers = {"Content-Type": content_type}
        if self.args.token:
            headers["Authorization"] = f"Bearer {self.args.token}"
        return headers

    def _post_offer(self, sdp: str) -> str:
        body = json.dumps({"sdp": sdp, "type": "offer"}).encode()
        url = self.args.url.rstrip("/") + "/offer"
        req = urllib.request.Request(url, body, self._headers("application/json"))
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())["sdp"]

    def _post_whip(self, sdp: str) -> str:
        req = urllib.request.Request(self.args.url, sdp.encode(), self._headers("application/sdp"))
        with urllib.request.urlopen(req, timeout=30) as resp:
            self.report["post_status"] = resp.status
            self.report["content_type"] = resp.headers.get("Content-Type")
            self.location = urllib.parse.urljoin(self.args.url, resp.headers["Location"])
            self.report["location"] = self.location
            return resp.read().decode()

    def _delete(self) -> int:
        req = urllib.request.Request(self.location, method="DELETE", headers=self._headers(""))
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    def _set_answer(self, sdp: str) -> bool:
        _, msg = GstSdp.SDPMessage.new_from_text(sdp)
        answer = GstWebRTC.WebRTCSessionDescription.new(GstWebRTC.WebRTCSDPType.ANSWER, msg)
        self.webrtc.emit("set-remote-description", answer, Gst.Promise.new())
        self.report["answer_set"] = round(time.monotonic() - self.start, 3)
        if self.args.mode == "whip" and not self.args.receive:
            GLib.timeout_add(int(self.args.seconds * 1000), self._finish)
        return False

    # ---- incoming media --------------------------------------------------------------

    def _on_pad(self, webrtc: Gst.Element, pad: Gst.Pad) -> None:
        if pad.get_direction() != Gst.PadDirection.SRC:
            return
        caps = pad.get_current_caps().get_structure(0)
        media, encoding = caps.get_string("media"), caps.get_string("encoding-name")
        if media == "video":
            self.report["video_encoding"] = encoding
            chain = f"{DECODE[encoding]} ! videoconvert ! video/x-raw,format=RGB"
            on_sample = self._on_video
        else:
            chain = "rtpopusdepay ! opusdec ! audioconvert ! audio/x-raw,format=S16LE"
            on_sample = self._on_audio
        sink_bin = Gst.parse_bin_from_description(
            f"queue ! {chain} ! appsink name=sink emit-signals=true sync=false", True
        )
        sink_bin.get_by_name("sink").connect("new-sample", on_sample)
        self.pipe.add(sink_bin)
        sink_bin.sync_state_with_parent()
        pad.link(sink_bin.get_static_pad("sink"))

    def _on_video(self, sink: Gst.Element) -> Gst.FlowReturn:
        sample = sink.emit("pull-sample")
        now = time.monotonic()
        if not self.video_arrivals:
            self.report["first_frame_s"] = round(now - self.start, 3)
            structure = sample.get_caps().get_structure(0)
            self.report["size"] = [structure.get_int("width")[1], structure.get_int("height")[1]]
            window = SETTLE_S + self.args.seconds
            GLib.timeout_add(int(window * 1000), self._finish)
        self.video_arrivals.append(now)
        buf = sample.get_buffer()
        ok, info = buf.map(Gst.MapFlags.READ)
        if ok:
            pixels = info.data[::101]  # a sparse sample is enough to tell a picture from none
            if max(pixels) - min(pixels) < 16:
                self.video_flat += 1
            buf.unmap(info)
        return Gst.FlowReturn.OK

    def _on_audio(self, sink: Gst.Element) -> Gst.FlowReturn:
        sample = sink.emit("pull-sample")
        structure = sample.get_caps().get_structure(0)
        channels = structure.get_int("channels")[1]
        self.audio_samples += sample.get_buffer().get_size() // (2 * channels)
        self.report["audio_rate"] = structure.get_int("rate")[1]
        return Gst.FlowReturn.OK

    # ---- end -------------------------------------------------------------------------

    def _finish(self) -> bool:
        self.loop.quit()
        return False

    def _give_up(self) -> bool:
        self.report["errors"].append(f"timed out after {self.args.timeout} s")
        self.loop.quit()
        return False

    def _on_error(self, _bus: Gst.Bus, msg: Gst.Message) -> None:
        err, debug = msg.parse_error()
        self.report["errors"].append(f"{err.message} ({debug})")

    def _summary(self) -> dict:
        r = self.report
        r["connection_state"] = self.webrtc.get_property("connection-state").value_nick
        r["ice_state"] = self.webrtc.get_property("ice-connection-state").value_nick
        arrivals = self.video_arrivals
        r["video_frames"] = len(arrivals)
        r["video_flat_frames"] = self.video_flat
        window = [t for t in arrivals if t >= arrivals[0] + SETTLE_S] if arrivals else []
        if len(window) > 1:
            r["video_fps"] = round((len(window) - 1) / (window[-1] - window[0]), 2)
            r["fps_window_s"] = round(window[-1] - window[0], 2)
        r["audio_seconds"] = round(self.audio_samples / max(1, r.get("audio_rate", 48000)), 2)
        return r


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["offer", "whip", "whep"])
    parser.add_argument(
        "url", help="server base URL (offer), or the WHIP or WHEP endpoint URL (whip, whep)"
    )
    parser.add_argument("--codec", choices=sorted(VIDEO_CAPS), default="vp8")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long to measure")
    parser.add_argument("--timeout", type=float, default=90.0)
    parser.add_argument("--token", default=None)
    parser.add_argument("--receive", action="store_true", help="whip: also receive the avatar")
    parser.add_argument("--trickle", action="store_true", help="whip: trickle ICE by PATCH")
    args = parser.parse_args()
    Gst.init(None)
    print(json.dumps(Peer(args).run()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
