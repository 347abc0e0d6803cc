"""The GPU's clocks and power while a benchmark runs, from `nvidia-smi`.

A served call's steps, spaced by its audio, have run 1-8 % faster than the same engine's steps
run back to back (the warm-up, `facecast bench`, an agent's push). Sampling the SM clock, power
and the driver's clock-event reasons beside a run tells a clock held down by power or heat
from work that differs.

    python bench/gpu_clocks.py record clocks.csv &   # until killed: one row each 0.5 s
    python bench/gpu_clocks.py summary clocks.csv    # busy samples: clock, power, reasons
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
from collections import Counter

FIELDS = "timestamp,utilization.gpu,clocks.sm,clocks.mem,power.draw,temperature.gpu"
# the driver's names for why clocks are below their maximum, newest first
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
BUSY_PERCENT = 50  # a sample counts as under load from this utilisation on


def fields() -> str:
    """The fields this driver answers: a name it does not know fails the whole query."""
    for reason in REASON_FIELDS:
        query = ["nvidia-smi", f"--query-gpu={FIELDS},{reason}", "--format=csv", "-c", "1"]
        if subprocess.run(query, capture_output=True).returncode == 0:
            return f"{FIELDS},{reason}"
    return FIELDS


def record(path: str, every_ms: int) -> None:
    """Becomes `nvidia-smi` writing to `path` (so killing this process's id stops it)."""
    cmd = ["nvidia-smi", f"--query-gpu={fields()}", "--format=csv,nounits", f"--loop-ms={every_ms}"]
    with open(path, "w") as out:
        os.dup2(out.fileno(), sys.stdout.fileno())
    os.execvp(cmd[0], cmd)


def _number(text: str) -> float | None:
    try:
        return float(text.strip())
    except ValueError:  # "[N/A]"
        return None


def summary(path: str) -> str:
    """The busy samples' clock, power, temperature and clock-event reasons. Columns are read
    by place, in FIELDS' order (nvidia-smi's header renames some: clocks.current.sm)."""
    with open(path) as f:
        rows = [[v.strip() for v in row] for row in list(csv.reader(f))[1:] if row]
    names = FIELDS.split(",")
    at = {name: i for i, name in enumerate(names)}
    busy = [r for r in rows if (_number(r[at["utilization.gpu"]]) or 0) >= BUSY_PERCENT]
    if not busy:
        return f"{path}: {len(rows)} samples, none with the GPU busy"

    def column(name: str) -> list[float]:
        return [x for r in busy if (x := _number(r[at[name]])) is not None]

    clock, power, temp = column("clocks.sm"), column("power.draw"), column("temperature.gpu")
    # the reasons column follows FIELDS where the driver answered it (`fields`)
    reasons = Counter(r[len(names)] for r in busy if len(r) > len(names))
    seen = ", ".join(f"{code} in {n}" for code, n in reasons.most_common())
    return (
        f"{len(busy)} of {len(rows)} samples busy (utilisation >= {BUSY_PERCENT} %): SM clock "
        f"p50 {statistics.median(clock):.0f} MHz (min {min(clock):.0f}, max {max(clock):.0f}), "
        f"power p50 {statistics.median(power):.0f} W (max {max(power):.0f}), temperature max "
        f"{max(temp):.0f} C; clock-event reasons: {seen or 'not reported'}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("action", choices=["record", "summary"])
    p.add_argument("path")
    p.add_argument("--every-ms", type=int, default=500)
    args = p.parse_args()
    if args.action == "record":
        record(args.path, args.every_ms)
    else:
        print(summary(args.path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
