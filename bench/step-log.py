#!/usr/bin/env python3
"""Summarises the batcher's step log: what the requests' policies proposed and what the steps verified.

The log is the stderr of a server or `spechost bench --clients` run with
RUST_LOG=spechost::engine::batcher=debug, one `verify batch` line per step (`proposed` and
`rows`: each sequence's 1 + draft length before and after the step's draft cut; `ms`: the
decode; `since_last_ms`: the time since the previous step ended, outside any decode).

Usage: bench/step-log.py LOG [LOG...]   (one row per log, as a Markdown table)
"""

import re
import statistics
import sys

STEP = re.compile(
    r"verify batch proposed=\[(?P<proposed>.*?)\].*?rows=\[(?P<rows>.*?)\] "
    r"ms=(?P<ms>[\d.]+) since_last_ms=(?P<since>[-\d.e]+)"
)
ROW = re.compile(r"\(\d+, (\d+)\)")


def summarise(path):
    """The step figures of one log."""
    steps = []
    with open(path, encoding="utf-8", errors="replace") as log:
        for line in log:
            match = STEP.search(line)
            if match:
                proposed = [int(n) for n in ROW.findall(match["proposed"])]
                rows = [int(n) for n in ROW.findall(match["rows"])]
                steps.append((proposed, rows, float(match["ms"]), float(match["since"])))
    if not steps:
        sys.exit(f"{path}: no `verify batch` lines; run with RUST_LOG=spechost::engine::batcher=debug")
    widest = max(len(proposed) for proposed, _, _, _ in steps)
    full = [step for step in steps if len(step[0]) == widest]
    return {
        "steps": len(steps),
        "drafts proposed": sum(n > 1 for proposed, _, _, _ in steps for n in proposed),
        "draft tokens proposed": sum(n - 1 for proposed, _, _, _ in steps for n in proposed),
        "draft tokens verified": sum(n - 1 for _, rows, _, _ in steps for n in rows),
        f"steps of {widest} sequences": len(full),
        "their median ms": round(statistics.median(ms for _, _, ms, _ in full), 2),
        "their median gap ms": round(statistics.median(since for _, _, _, since in full), 3),
    }


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    rows = [(path, summarise(path)) for path in sys.argv[1:]]
    keys = list(rows[0][1])
    print("| log | " + " | ".join(keys) + " |")
    print("|---|" + "--:|" * len(keys))
    for path, figures in rows:
        print(f"| {path} | " + " | ".join(str(figures[key]) for key in keys) + " |")


if __name__ == "__main__":
    main()
