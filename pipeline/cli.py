"""The `facecast` command: render, serve, and the tools around them.

User errors (bad files, bad config, mismatched checkpoints) print one line on stderr and
exit with status 2; a traceback means a bug.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pipeline.errors import FacecastError

DEFAULT_CONFIG = "tiny"
ASSETS = Path(__file__).resolve().parent / "assets"


def setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )


def cmd_render(args: argparse.Namespace) -> int:
    from pipeline.config import load_config
    from pipeline.engine import Engine
    from pipeline.render import render_file

    cfg = load_config(args.config)
    for path, what in ((args.reference, "reference image"), (args.audio, "audio file")):
        if not Path(path).is_file():
            raise FacecastError(f"{what} not found: {path}")
    device = resolve_device(args.device)
    engine = Engine.load(cfg, device)
    result = render_file(
        engine, args.reference, args.audio, args.out, seed=args.seed, progress=not args.quiet
    )
    if not args.quiet:
        times = " ".join(f"{k}={v:.2f}s" for k, v in result.stage_seconds.items())
        print(
            f"wrote {result.path}: {result.frames} frames, {result.audio_seconds:.2f} s audio "
            f"({times})"
        )
    return 0


def resolve_device(name: str) -> str:
    import torch

    if name == "cuda" and not torch.cuda.is_available():
        raise FacecastError("--device cuda was requested but no CUDA GPU is available")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def cmd_serve(args: argparse.Namespace) -> int:
    from realtime.server import main as serve_main

    return serve_main(args) or 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="facecast", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--log-level", default="warning", choices=["debug", "info", "warning", "error"]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    render = sub.add_parser("render", help="render an MP4 from a photo and an audio file")
    render.add_argument(
        "--reference", default=str(ASSETS / "reference.png"), help="identity photo (PNG, JPEG, …)"
    )
    render.add_argument("--audio", required=True, help="speech audio of any length and format")
    render.add_argument("--out", required=True, help="output .mp4 path")
    render.add_argument("--config", default=DEFAULT_CONFIG, help="config name or YAML path")
    render.add_argument("--seed", type=int, default=0)
    render.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    render.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    render.set_defaults(func=cmd_render)

    serve = sub.add_parser("serve", help="serve the avatar over WebRTC")
    try:
        from realtime.server import add_arguments
    except ImportError:  # the realtime package is optional for rendering
        add_arguments = None
    if add_arguments is not None:
        add_arguments(serve)
    serve.set_defaults(func=cmd_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_level)
    try:
        return args.func(args)
    except FacecastError as exc:
        print(f"facecast: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("facecast: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
