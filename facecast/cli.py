"""The `facecast` command: render, serve, and the tools around them.

Every command that runs the engine takes the same engine flags (`add_engine_arguments`)
and starts it the same way (`pipeline.startup.start_engine`: load, kernel picks, compile,
warm-up). User errors (bad flags, bad files, bad config, mismatched checkpoints) print one
line on stderr and exit with status 2; a traceback means a bug.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from pipeline.config import DEFAULT_CONFIG
from pipeline.errors import FacecastError
from pipeline.logs import setup_logging


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (and exit 2), not a usage dump."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def add_engine_arguments(parser: argparse.ArgumentParser, default_config: str) -> None:
    """The engine flags every engine command shares (`pipeline.startup.EngineOptions`)."""
    from pipeline.families import REAL_MODELS, model_flags_help, models_taking

    def models(flag: str) -> str:  # the models that take a flag, for its help
        return ", ".join(models_taking(flag))

    parser.add_argument("--config", default=default_config, help="config name or YAML path")
    parser.add_argument("--model", choices=REAL_MODELS, help=model_flags_help())
    parser.add_argument(
        "--weights",
        help="--model's release folder as downloaded (huggingface-cli download "
        "Soul-AILab/SoulX-FlashHead-1_3B or Wan-AI/Wan2.2-S2V-14B --local-dir DIR)",
    )
    parser.add_argument(
        "--wav2vec",
        help="a wav2vec2 model folder: facebook/wav2vec2-base-960h for FlashHead; for "
        "LiveAvatar the release's own wav2vec2-large-xlsr-53-english/ unless given",
    )
    parser.add_argument(
        "--lora",
        help="LiveAvatar's LoRA, merged into the weights at load: the folder of "
        "huggingface-cli download Quark-Vision/Live-Avatar, or its liveavatar.safetensors",
    )
    parser.add_argument(
        "--prompt",
        help=f"{models('prompt')}: what the video shows, in words (read once a session; "
        "default: a person talking to the camera)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config override, e.g. schedule.seam_latents=0 or video.width=256 (repeatable)",
    )
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument(
        "--attention", choices=["sdpa", "flex", "facecast"], help="override the config's"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile the DiT blocks")
    parser.add_argument(
        "--compile-cache",
        metavar="DIR",
        help="keep what --compile builds in DIR and load it at the next start, so that a "
        "fresh machine need not compile it again (one file per torch build and GPU kind)",
    )
    parser.add_argument(
        "--offload", action="store_true", help="keep DiT blocks in host memory, stream them in"
    )
    parser.add_argument(
        "--prefetch", type=_positive_int, default=2, help="offload: blocks copied ahead"
    )
    parser.add_argument(
        "--memory-cap-gb", type=_positive_float, help="hard GPU memory cap for the process"
    )
    parser.add_argument(
        "--offload-budget-gb", type=_positive_float, help="GPU bytes for offloaded blocks"
    )
    parser.add_argument(
        "--threads", type=_positive_int, help="CPU threads for the engine (default: torch's)"
    )
    parser.add_argument(
        "--precision",
        choices=["default", "fp8", "fp8-fast", "fp8-rowwise"],  # pipeline.startup.PRECISIONS
        default="default",
        help="fp8: the DiTs' linear layers in float8 e4m3, activation scales calibrated at "
        "start-up; fp8-fast: the same with Hopper's fast FP8 accumulation; fp8-rowwise: "
        "scaled per token on every call (FP8 GPUs; bench/RESULTS.md)",
    )


def engine_options(args: argparse.Namespace, warmup: bool = True, device=None, **extra):
    from pipeline.config import parse_overrides
    from pipeline.module import resolve_device
    from pipeline.startup import EngineOptions

    return EngineOptions(
        config=args.config,
        model=args.model,
        weights=args.weights,
        wav2vec=args.wav2vec,
        lora=args.lora,
        prompt=args.prompt,
        device=device or resolve_device(args.device),
        attention=args.attention,
        compile=args.compile,
        compile_cache=args.compile_cache,
        offload=True if args.offload else None,
        prefetch=args.prefetch,
        memory_cap_gb=args.memory_cap_gb,
        offload_budget_gb=args.offload_budget_gb,
        threads=args.threads,
        precision=args.precision,
        warmup=warmup,
        overrides=parse_overrides(args.set),
        **extra,
    )


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {value})")
    return value


# What `serve` says at its default level: the server's events, and the start-up's progress
# (a cold compile takes minutes) with the kernels it chose.
SERVING_LOGGERS = (
    "realtime",
    "pipeline.startup",
    "pipeline.compile_cache",
    "pipeline.warmup",
    "facecast.flashhead",
    "facecast.liveavatar",
)


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (got {text})")
    return value


def cmd_render(args: argparse.Namespace) -> int:
    from pipeline.config import load_config
    from pipeline.media import default_reference, probe_audio
    from pipeline.module import resolve_device
    from pipeline.render import render_file
    from pipeline.startup import start_engine

    cfg = load_config(*engine_options(args, warmup=False).config_and_overrides())
    if args.face_box is not None and args.reference is None:
        raise FacecastError(
            "--face-box frames the photo given with --reference: give --reference PHOTO too "
            "(without it the bundled portrait is used, and it needs no box)"
        )
    args.reference = args.reference or str(default_reference(cfg))
    if args.face_box is not None and not cfg.family.face_box:
        raise FacecastError(
            f"--face-box frames a photo for the photo stack or a real model; config "
            f"{cfg.name!r} is neither"
        )
    # every input a user can get wrong is checked before the engine starts (seconds on a
    # CPU, minutes for a real model), and before anything is written
    check_out_path(args.out)
    probe_audio(args.audio)
    reference = prepare_reference_early(args.reference, cfg, args.face_box)
    device = resolve_device(args.device)
    if args.gpus > 1:
        return render_parallel(cfg, device, args)
    # A batch render pays warm-up only when it compiles (the graphs must exist first);
    # eager rendering gains nothing from running every shape twice.
    engine, _ = start_engine(engine_options(args, warmup=args.compile))
    result = render_file(
        engine,
        reference,
        args.audio,
        args.out,
        seed=args.seed,
        progress=not args.quiet,
        face_box=args.face_box,
    )
    if not args.quiet:
        times = " ".join(f"{k}={v:.2f}s" for k, v in result.stage_seconds.items())
        print(
            f"wrote {result.path}: {result.frames} frames, {result.audio_seconds:.2f} s audio "
            f"({times})"
        )
    return 0


def check_out_path(out: str) -> None:
    """`--out` must name a file that can be written: not a folder, not inside a file."""
    path = Path(out)
    if path.is_dir():
        raise FacecastError(
            f"--out {out} is a folder: give the video's file name, e.g. {path / 'clip.mp4'}"
        )
    parent = next((p for p in path.parents if p.exists()), Path("."))
    if not parent.is_dir():
        raise FacecastError(f"--out {out}: {parent} is a file, not a folder: pick another path")


def prepare_reference_early(path: str, cfg, face_box):
    """The reference as the engine takes it, checked and framed (the photo stack, the real
    models) or just checked (the others: the engine reads it again from the path)."""
    from pipeline.media import load_reference

    if not Path(path).is_file():
        raise FacecastError(f"reference image not found: {path}")
    if cfg.family.photos:  # from the bytes: a synthetic PNG names its face
        from pipeline.photo.reference import load_prepared

        return load_prepared(path, cfg, face_box)
    if cfg.family.face_box:
        return load_reference(path, cfg, face_box)
    load_reference(path, cfg)
    return path


def render_parallel(cfg, device: str, args: argparse.Namespace) -> int:
    """One render over `--gpus` processes (GPUs, or gloo CPU processes without CUDA)."""
    import torch

    from pipeline.media import load_image
    from pipeline.parallel.launch import ParallelOptions, launch, render_worker

    if device == "cuda" and torch.cuda.device_count() < args.gpus:
        raise FacecastError(f"--gpus {args.gpus} but only {torch.cuda.device_count()} GPUs exist")
    load_image(args.reference)  # fail here, before any worker starts, on a bad reference
    opts = ParallelOptions(world=args.gpus, head_groups=args.head_groups)
    launch(render_worker, opts, cfg, device, args.reference, args.audio, args.out, args.seed)
    if not args.quiet:
        print(f"wrote {args.out} with {args.gpus} processes")
    return 0


def _diffusion_only(args: argparse.Namespace, command: str, instead: str) -> None:
    from pipeline.config import load_config

    cfg = load_config(*engine_options(args, warmup=False).config_and_overrides())
    if not cfg.family.dits:
        raise FacecastError(
            f"facecast {command} measures a diffusion model's DiTs; config {cfg.name!r} is "
            f"the photo stack: {instead}"
        )


def cmd_bench(args: argparse.Namespace) -> int:
    from pipeline.config import parse_overrides
    from pipeline.diffusion.bench import BenchOptions, run_bench
    from pipeline.diffusion.bench_report import summary_line, write_results

    _diffusion_only(args, "bench", "use python bench/photo_bench.py")
    if args.paced and (args.model is None or args.sessions > 1):
        raise FacecastError("--paced times one real model's stream (--model, one session)")
    if args.model is not None or args.sessions > 1:
        # a real model's stream, or several sessions at once, timed as a server runs them
        import json

        from pipeline import stream_bench

        stream_opts = engine_options(args, warmup=not args.no_warmup)
        command = args.command_line or bench_command(args)
        if args.sessions > 1:
            res = stream_bench.bench_sessions(stream_opts, args.seconds, args.sessions, command)
            line = stream_bench.sessions_summary(res)
        else:
            res = stream_bench.bench_stream(stream_opts, args.seconds, command, args.paced)
            line = stream_bench.stream_summary(res)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(res, indent=2, default=str))
        print(line)
        return 0

    opts = BenchOptions(
        config=args.config,
        seconds=args.seconds,
        device=args.device,
        attention=args.attention,
        compile=args.compile,
        compile_cache=args.compile_cache,
        offload=args.offload,
        prefetch=args.prefetch,
        memory_cap_gb=args.memory_cap_gb,
        offload_budget_gb=args.offload_budget_gb,
        warmup=not args.no_warmup,
        isolated_reps=args.isolated_reps,
        precision=args.precision,
        overrides=parse_overrides(args.set),
    )
    res = run_bench(opts)
    command = args.command_line or bench_command(args)
    write_results(res, args.json, command, Path(args.markdown) if args.markdown else None)
    print(summary_line(res))
    return 0


# what `bench_command` writes for a real model's files
PLACEHOLDERS = {"weights": "W", "wav2vec": "W2V", "lora": "LORA"}


def bench_command(args: argparse.Namespace) -> str:
    """The command line that reproduces a bench run, for the results table."""
    parts = ["facecast bench"]
    if args.model:  # the files it needs, as placeholders (the user's paths stay theirs)
        from pipeline.families import real_model

        parts.append(f"--model {args.model}")
        parts += [f"--{flag} {PLACEHOLDERS[flag]}" for flag in real_model(args.model).family.needs]
    else:
        parts.append(f"--config {args.config}")
    parts.append(f"--seconds {args.seconds:g}")
    if getattr(args, "sessions", 1) > 1:
        parts.append(f"--sessions {args.sessions}")
    if getattr(args, "paced", False):
        parts.append("--paced")
    for name in ("attention", "memory_cap_gb", "offload_budget_gb", "json"):
        if getattr(args, name) is not None:
            parts.append(f"--{name.replace('_', '-')} {getattr(args, name)}")
    if args.precision != "default":
        parts.append(f"--precision {args.precision}")
    for name in ("compile", "offload", "no_warmup"):
        if getattr(args, name):
            parts.append(f"--{name.replace('_', '-')}")
    if args.offload:
        parts.append(f"--prefetch {args.prefetch}")
    if args.isolated_reps != 3:
        parts.append(f"--isolated-reps {args.isolated_reps}")
    parts += [f"--set {item}" for item in args.set]
    return " ".join(parts)


def cmd_gate(args: argparse.Namespace) -> int:
    from pipeline import gate
    from pipeline.compile import pick_sdpa_backends
    from pipeline.startup import start_engine

    _diffusion_only(args, "gate", "it has no kernels to swap")

    # The baseline is the plain eager engine: started without compile or kernel picks;
    # the change under test is applied on top of it below.
    opts = engine_options(args, warmup=False, sdpa_pick=False)
    opts.compile, opts.precision = False, "default"
    engine, _ = start_engine(opts)
    if args.precision != "default" and not args.record:
        from pipeline.precision import require_fp8

        require_fp8(engine.device)  # before minutes of recording, not after
    if args.record or not gate.has_baseline(args.baseline):
        meta = gate.record_baseline(engine, args.baseline, args.seconds, args.seed)
        print(
            f"baseline recorded in {args.baseline}: {meta['frames']} frames, dual runs identical, "
            f"reassociation band {meta['band_psnr_min']:.2f} dB (lowest frame), "
            f"{meta['band_psnr_pooled']:.2f} dB pooled, its two reorderings "
            f"{meta['band_spread_db']:.2f} dB apart at most"
        )
        if args.record:
            return 0
    if args.precision != "default":
        from pipeline.precision import apply_fp8
        from pipeline.startup import FP8_FAST_ACCUM, FP8_SCALING

        fast = args.precision in FP8_FAST_ACCUM
        apply_fp8(engine, FP8_SCALING[args.precision], fast_accum=fast)
    family = engine.cfg.family
    if args.sdpa_pick and family.picks_sdpa:  # the project's diffusion stack's kernel picks
        pick_sdpa_backends(engine)
    if args.compile:  # each family compiles its own parts (`FamilyEngine.compile`)
        if not family.compiles:
            raise FacecastError(f"--compile does not apply to {family.summary}")
        engine.compile()
    report = gate.check(engine, args.baseline, args.tolerance_db)
    if args.precision != "default":
        report = gate.precision_tier(report, args.fp8_floor_db)
    report.kernels = dict(engine.kernels)
    if args.json:
        Path(args.json).write_text(report.to_json())
    print(("PASS " if report.passed else "FAIL ") + report.message)
    if report.kernels:
        print("  (kernels: " + ", ".join(f"{k} {v}" for k, v in report.kernels.items()) + ")")
    return 0 if report.passed else 1


def cmd_serve(args: argparse.Namespace) -> int:
    from pipeline.config import load_config
    from realtime.server import config_from_args, serve

    # bad flags and a bad config fail here, in one line, before listening; the device is
    # resolved where the engine runs (a fleet's workers decide `auto` on their own nodes)
    opts = engine_options(args, device=args.device)
    opts.validate()
    cfg = load_config(*opts.config_and_overrides())
    family = cfg.family
    family.run_preflight(cfg)  # a broken download fails here, not after listening
    if args.face_box is not None and (args.reference is None or not family.face_box):
        raise FacecastError(
            "--face-box frames the --reference photo of the photo stack or a real model: give "
            "--reference too, with --config photo or --model NAME"
        )
    if args.reference is not None:
        # a missing photo, one without a clear face, or no face runtime fails here, in one
        # line, not in every peer's session (as render checks it before its engine starts)
        prepare_reference_early(args.reference, cfg, args.face_box)
    try:
        config = config_from_args(args)
    except ValueError as exc:
        raise FacecastError(str(exc)) from None
    if args.log_level == "warning":  # serving: say what it is doing (start-up, peers, closes)
        for name in SERVING_LOGGERS:
            logging.getLogger(name).setLevel(logging.INFO)
    if args.cluster == "ray":
        return serve_fleet(args, config)
    return serve(config, engine_options(args))


def serve_fleet(args: argparse.Namespace, config) -> int:
    """`serve --cluster ray`: this process is the front; engines run on worker actors."""
    from realtime.fleet.options import fleet_from_args

    try:
        fleet = fleet_from_args(args)
    except ValueError as exc:
        raise FacecastError(str(exc)) from None
    try:
        from realtime.fleet.front import serve_fleet as serve_front
    except ImportError as exc:
        raise FacecastError(
            f"--cluster ray needs Ray: pip install 'facecast[fleet]' ({exc})"
        ) from None
    # `auto` is decided by each worker on its own node, not by the front's machine
    return serve_front(config, engine_options(args, device=args.device), fleet)


def build_parser(with_serve_options: bool = True) -> argparse.ArgumentParser:
    from pipeline.faces.face_box import FACE_BOX_HELP, face_box_arg

    parser = OneLineParser(prog="facecast", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--log-level", default="warning", choices=["debug", "info", "warning", "error"]
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=OneLineParser)

    render = sub.add_parser("render", help="render an MP4 from a photo and an audio file")
    add_engine_arguments(render, DEFAULT_CONFIG)
    render.add_argument(
        "--reference",
        help="identity photo (PNG, JPEG, WebP; default: the config's bundled identity)",
    )
    render.add_argument("--face-box", type=face_box_arg, help=FACE_BOX_HELP)
    render.add_argument("--audio", required=True, help="speech audio of any length and format")
    render.add_argument("--out", required=True, help="output .mp4 path")
    render.add_argument("--seed", type=int, default=0)
    render.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    render.add_argument(
        "--gpus",
        type=_positive_int,
        default=1,
        help="split one session over N GPUs (N CPU processes without CUDA)",
    )
    render.add_argument(
        "--head-groups",
        type=_positive_int,
        default=2,
        help="Ulysses head groups per all-to-all when --gpus > 1",
    )
    render.set_defaults(func=cmd_render)

    bench = sub.add_parser("bench", help="benchmark the streaming pipeline (GPU numbers)")
    add_engine_arguments(bench, "rt720")
    bench.add_argument("--seconds", type=_positive_float, default=20.0, help="seconds of video")
    bench.add_argument(
        "--sessions",
        type=_positive_int,
        default=1,
        metavar="N",
        help="N sessions at once, each on its own thread as serve runs them (batched where "
        "the engine batches): the engine's aggregate fps and each session's",
    )
    bench.add_argument(
        "--paced",
        action="store_true",
        help="each step when its audio would come from a live microphone, as a served live "
        "call's steps run (default: back to back, as an agent's push)",
    )
    bench.add_argument("--json", help="write the full results here (bench/results/*.json)")
    bench.add_argument("--markdown", help="append a table to this file (bench/RESULTS.md)")
    bench.add_argument("--no-warmup", action="store_true", help="skip start-up warm-up")
    bench.add_argument("--isolated-reps", type=_positive_int, default=3)
    bench.add_argument("--command-line", help=argparse.SUPPRESS)
    bench.set_defaults(func=cmd_bench)

    gate = sub.add_parser("gate", help="check that a speed change kept the pixels")
    add_engine_arguments(gate, "demo")  # the gate guards the diffusion stack's kernels
    gate.add_argument("--baseline", required=True, help="baseline folder (recorded if empty)")
    gate.add_argument("--record", action="store_true", help="(re)record the baseline only")
    gate.add_argument("--seconds", type=_positive_float, default=2.0, help="seconds of audio")
    gate.add_argument("--seed", type=int, default=0)
    gate.add_argument("--sdpa-pick", action="store_true", help="pin the fastest SDPA backends")
    gate.add_argument(
        "--tolerance-db",
        type=float,
        default=0.5,
        help="tier 2: how far under the band (dB) the pooled error may fall, and the lowest "
        "frame at least (more where the band's two reorderings disagree more)",
    )
    gate.add_argument(
        "--fp8-floor-db",
        type=float,
        default=30.0,
        help="--precision fp8: the lowest PSNR allowed, pooled over all frames, and for the "
        "lowest frame unless bf16's own reorderings already fall under it",
    )
    gate.add_argument("--json", help="write the report here")
    gate.set_defaults(func=cmd_gate)

    serve = sub.add_parser("serve", help="serve the avatar over WebRTC")
    add_engine_arguments(serve, DEFAULT_CONFIG)
    if with_serve_options:  # only then import the WebRTC stack (aiortc, silero-vad, …)
        from realtime.fleet.options import add_fleet_arguments
        from realtime.server import add_arguments

        add_arguments(serve)
        add_fleet_arguments(serve)
    serve.set_defaults(func=cmd_serve)
    for name in PASSTHROUGH:  # listed in --help; parsed by their own modules
        sub.add_parser(name, help=f"see `facecast {name} --help`", add_help=False)
    return parser


def _passthrough(name: str):
    """Tools with their own argument parsers, run as `facecast NAME ...`."""
    if name == "call":  # the client side: it starts without torch
        from facecast_client.call import main as call_main

        return call_main
    if name == "eval":
        from pipeline.eval.commands import eval_main

        return eval_main
    from pipeline.synth import commands

    return {
        "make-reference": commands.make_reference_main,
        "make-dataset": commands.make_dataset_main,
        "make-sample-speech": commands.make_sample_speech_main,
    }[name]


PASSTHROUGH = ("call", "eval", "make-reference", "make-dataset", "make-sample-speech")


def join_face_box(argv: list[str]) -> list[str]:
    """`--face-box -10,102,230,230` as `--face-box=-10,…`: argparse takes a value that
    starts with a minus for a flag, and the user would learn only "expected one argument"."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--face-box" and arg.startswith("-") and "," in arg:
            out[-1] = f"--face-box={arg}"
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = join_face_box(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        try:
            return _passthrough(argv[0])(argv[1:])
        except FacecastError as exc:
            print(f"facecast: error: {exc}", file=sys.stderr)
            return 2
    parser = build_parser(with_serve_options="serve" in argv)
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
