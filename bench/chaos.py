"""Full-size chaos run: a 20,000-line batch while the worker is SIGKILLed three times and the
api and the Temporal dev server are each restarted once. Prints missing / duplicated custom_ids.

    .venv/bin/python -m bench.chaos --lines 20000 --cap 64
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from dataclasses import asdict
from pathlib import Path

from tests.e2e.chaos import run_chaos


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--cap", type=int, default=64)
    parser.add_argument("--latency-ms", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = asyncio.run(
            run_chaos(Path(tmp), args.lines, cap=args.cap, latency_ms=args.latency_ms)
        )
    out = asdict(report)
    out["missing"], out["duplicated"] = len(report.missing), len(report.duplicated)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
