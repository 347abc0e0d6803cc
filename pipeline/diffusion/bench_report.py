"""The diffusion stack's benchmark results as a line, a JSON file and a table in its own section
of bench/RESULTS.md (`facecast bench --json ... --markdown ...`)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.diffusion.bench import STAGES

RESULTS_HEADER = "# Facecast benchmark results\n"
SECTION_BEGIN = "<!-- facecast-bench:begin -->"
SECTION_END = "<!-- facecast-bench:end -->"


def summary_line(res: dict) -> str:
    s, t, m = res["steady"], res["ttff"], res["memory"]
    gb = lambda b: f"{b / 1e9:.2f}" if b else "-"  # noqa: E731
    return (
        f"{res['meta']['config']} attn={res['meta']['attention']} "
        f"offload={res['meta']['offload']}: ttff {t['seconds']:.3f}s, {s['fps']:.1f} fps, "
        f"RTF {s['real_time_factor']:.3f}, p99 chunk {s['chunk_wall_p99']:.3f}s "
        f"({s['p99_over_duration']:.2f}x), eff {res['stages']['pipeline_efficiency']:.3f}, "
        f"mem10s {gb(m['peak_after_10s_bytes'])} GB end {gb(m['peak_end_bytes'])} GB, "
        f"{res['flops'].get('chunk_tflops', 0):.0f} TFLOP/s"
    )


def markdown_rows(res: dict, command: str) -> str:
    s, t, m, st = res["steady"], res["ttff"], res["memory"], res["stages"]
    fl, sw, meta = res["flops"], res["switch"], res["meta"]
    gb = lambda b: f"{b / 1e9:.2f}" if b else "–"  # noqa: E731
    lines = [
        f"### {meta['config']} · attention={meta['attention']} · compile="
        f"{meta['options']['compile']} · offload={meta['offload']}",
        "",
        f"{meta['date']} · {meta['gpu']} · torch {meta['torch']} · commit `{meta['commit']}`",
        f"`{command}`",
        "",
        "| metric | value |",
        "| --- | --- |",
        f"| time to first frame | {t['seconds'] * 1e3:.0f} ms ("
        + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in t["by_stage"].items())
        + f" ms GPU); init {res['init_seconds'] * 1e3:.0f} ms; startup "
        f"{res['startup'].get('startup_seconds', 0):.1f} s |",
        f"| steady fps / RTF | {s['fps']:.1f} fps / {s['real_time_factor']:.3f} |",
        f"| chunk wall p50 / p99 (duration {s['chunk_seconds']:.2f} s) | "
        f"{s['chunk_wall_p50']:.3f} / {s['chunk_wall_p99']:.3f} s "
        f"({s['p99_over_duration']:.2f}×) |",
        "| stage s/chunk pipeline · isolated | "
        + ", ".join(
            f"{k} {st['pipeline_seconds_per_chunk'][k]:.3f}·{st['isolated_seconds_per_chunk'][k]:.3f}"
            for k in STAGES
        )
        + " |",
        f"| pipeline efficiency | {st['pipeline_efficiency']:.3f} |",
        f"| peak GPU memory 10 s / end | {gb(m['peak_after_10s_bytes'])} / "
        f"{gb(m['peak_end_bytes'])} GB over {m['video_seconds']:.0f} s of video |",
        f"| max model-switch idle | {sw['model_switch_max_seconds'] * 1e3:.2f} ms |",
    ]
    if "offload" in sw:
        o = sw["offload"]
        lines.append(
            "| offload stalls per run | "
            + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in o["stall_seconds_total"].items())
            + f"; {o['bytes_copied'] / 1e9:.0f} GB copied |"
        )
    if fl.get("per_chunk_total"):
        lines.append(
            "| FLOPs/chunk (TFLOP) | "
            + ", ".join(f"{k} {v / 1e12:.1f}" for k, v in fl["per_chunk_by_stage"].items())
            + f" = {fl['per_chunk_total'] / 1e12:.1f} |"
        )
        lines.append(
            "| achieved TFLOP/s isolated (of 784) | "
            + ", ".join(f"{k} {v:.0f}" for k, v in fl["achieved_tflops_isolated"].items())
            + f"; whole chunk {fl['chunk_tflops']:.0f} ({fl['chunk_fraction_of_peak']:.2f}) |"
        )
        lines.append(
            f"| compute floor | {fl['compute_floor_seconds_per_chunk']:.3f} s/chunk → "
            f"{fl['fps_ceiling_at_peak']:.1f} fps at 784 TFLOP/s |"
        )
    return "\n".join(lines) + "\n"


def write_results(res: dict, json_path: str | Path | None, command: str, md: Path | None) -> None:
    if json_path:
        p = Path(json_path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({"command": command, **res}, indent=2, default=str))
    if md is not None:
        append_markdown(md, markdown_rows(res, command))


def append_markdown(path: Path, block: str) -> None:
    """Add a block to this benchmark's own section of RESULTS.md (other sections untouched)."""
    text = path.read_text() if path.exists() else RESULTS_HEADER
    if SECTION_BEGIN not in text:
        text = text.rstrip("\n") + (
            f"\n\n## Streaming pipeline (`facecast bench`)\n\n{SECTION_BEGIN}\n{SECTION_END}\n"
        )
    head, rest = text.split(SECTION_BEGIN, 1)
    body, tail = rest.split(SECTION_END, 1)
    body = body.rstrip("\n") + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + SECTION_BEGIN + body + "\n" + SECTION_END + tail)
