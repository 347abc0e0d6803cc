"""STUN/TURN servers the operator configures, and how WHIP advertises them.

`--ice-server` takes a URI as GStreamer's webrtcbin writes it: `stun:host:port`, or
`turn:USER:PASSWORD@host:port?transport=udp` (also `turns:`), repeatable. WHIP (RFC 9725
§4.6) hands them to the client in `Link` headers of the `201 Created` response:

    Link: <stun:stun.example.net:3478>; rel="ice-server"
    Link: <turn:turn.example.net:3478?transport=udp>; rel="ice-server"; username="u";
          credential="p"; credential-type="password"
"""

from __future__ import annotations

import argparse

from aiortc import RTCIceServer

SCHEMES = ("stun", "stuns", "turn", "turns")


def parse_ice_server(text: str) -> RTCIceServer:
    """`stun:host[:port]` or `turn[s]:[USER:PASSWORD@]host[:port][?transport=udp|tcp]`."""
    scheme, sep, rest = text.partition(":")
    rest = rest.removeprefix("//")  # webrtcbin and whip-client also accept turn://…
    if not sep or scheme not in SCHEMES or not rest:
        raise ValueError(
            f"bad ICE server {text!r}: use stun:HOST:PORT or turn:USER:PASSWORD@HOST:PORT"
        )
    username = credential = None
    if "@" in rest:
        userinfo, rest = rest.rsplit("@", 1)
        username, sep, credential = userinfo.partition(":")
        if not sep or not username:
            raise ValueError(f"bad ICE server {text!r}: credentials are USER:PASSWORD@")
        if scheme.startswith("stun"):
            raise ValueError(f"bad ICE server {text!r}: STUN servers take no credentials")
    return RTCIceServer(urls=f"{scheme}:{rest}", username=username, credential=credential)


def link_header(server: RTCIceServer) -> list[str]:
    """The `Link` header values (one per URL) that advertise `server` (RFC 9725 §4.6)."""
    urls = [server.urls] if isinstance(server.urls, str) else list(server.urls)
    values = []
    for url in urls:
        value = f'<{url}>; rel="ice-server"'
        if server.username is not None:
            value += (
                f'; username="{_quoted(server.username)}"'
                f'; credential="{_quoted(server.credential or "")}"'
                f'; credential-type="{server.credentialType}"'
            )
        values.append(value)
    return values


def _quoted(text: str) -> str:
    # RFC 8288 parameter values are quoted strings: escape the quote and the backslash.
    return text.replace("\\", "\\\\").replace('"', '\\"')


def add_ice_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--ice-server",
        action="append",
        default=[],
        metavar="URI",
        help="STUN/TURN server advertised to WHIP clients (Link headers); repeatable: "
        "stun:HOST:PORT or turn:USER:PASSWORD@HOST:PORT?transport=udp",
    )


def ice_servers_from_args(args: argparse.Namespace) -> list[RTCIceServer]:
    """The `--ice-server` flags; ValueError names a bad one."""
    return [parse_ice_server(text) for text in args.ice_server]
