"""Line order for the prefix cache through backfill, on the simulator's GPU mode and its prefix
cache (`tools/sim/prefix_cache.py`, shaped like vLLM's) (issue 41, item 3): the same batch
submitted with the openai SDK to a stack whose `limits.order_lines_by_prefix` is off, then on;
the simulator's own counters (`/sim/stats` `gpu.prefix_cache`: prompt tokens looked up and found)
give the tokens prefilled per line, and the batch's time from upload to `completed` its
throughput.

The batch (`bench/prefix_cache_vllm.py`'s): a 100-word system prompt, `docs` documents of
250 words each asked `questions` questions, round-robin in the file; the simulator's tokens are
words. The simulator runs `seats` sequences (the route's cap too) with a KV cache of
`kv_tokens` tokens, so that the documents do not all fit, and `prefill_ms` per prompt token
prefilled in a step.

    PYTHONPATH=. .venv/bin/python -m bench.prefix_cache_sim
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.common import dev_server
from bench.prefix_cache_vllm import bodies
from tests.e2e.stack import Stack, wait_terminal
from tools.sim import GpuConfig, SimConfig


class OrderStack(Stack):
    """The e2e stack with `limits.order_lines_by_prefix` as given."""

    def __init__(self, *args: Any, ordered: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ordered = ordered

    def write_config(self) -> None:
        super().write_config()
        text = self.config_path.read_text()
        flag = "true" if self.ordered else "false"
        self.config_path.write_text(
            text.replace("[limits]\n", f"[limits]\norder_lines_by_prefix = {flag}\n", 1)
        )


async def prefix_counts(http: httpx.AsyncClient, stack: Stack) -> tuple[int, int]:
    stats = (await http.get(f"{stack.sim.url}/sim/stats")).json()
    cache = stats["gpu"]["prefix_cache"]
    return int(cache["queries"]), int(cache["hits"])


async def one(args: argparse.Namespace, server: Any, tmp: Path, ordered: bool) -> dict[str, Any]:
    sim = SimConfig(
        model_names=[],
        max_num_seqs=args.seats,
        gpu=GpuConfig(kv_cache_tokens=args.kv_tokens, prefill_per_token_ms=args.prefill_ms),
    )
    lines = bodies(args.docs, args.doc_tokens, args.questions)
    data = "".join(
        json.dumps(
            {"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": b}
        )
        + "\n"
        for i, b in enumerate(lines)
    ).encode()
    stack = OrderStack(tmp, server.address, cap=args.seats, sim=sim, ordered=ordered)
    async with stack.running(), httpx.AsyncClient(timeout=30) as http:
        client = stack.client()
        q0, h0 = await prefix_counts(http, stack)
        started = time.monotonic()
        f = await client.files.create(file=("in.jsonl", data), purpose="batch")
        b = await client.batches.create(
            input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        done = await wait_terminal(client, b.id, within=900)
        took = time.monotonic() - started
        assert done.status == "completed", done
        assert done.request_counts is not None and done.request_counts.completed == len(lines)
        q1, h1 = await prefix_counts(http, stack)
    queries, hits = q1 - q0, h1 - h0
    return {
        "order": "prefix" if ordered else "file",
        "prompt_tokens_per_line": round(queries / len(lines), 1),
        "prefilled_tokens_per_line": round((queries - hits) / len(lines), 1),
        "cache_hit_share": round(hits / queries, 3) if queries else 0.0,
        "seconds": round(took, 1),
        "lines_per_second": round(len(lines) / took, 2),
    }


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-prefix-sim-") as tmp:
        async with dev_server(Path(tmp)) as server:
            for rep in range(args.reps):
                for ordered in (False, True):
                    sub = Path(tmp) / f"{rep}-{ordered}"
                    sub.mkdir()
                    out = await one(args, server, sub, ordered)
                    print(json.dumps({"rep": rep + 1, **out}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument(
        "--doc-tokens", type=int, default=500, help="as bench.prefix_cache_vllm's (words: half)"
    )
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--seats", type=int, default=8)
    ap.add_argument("--kv-tokens", type=int, default=4096)
    ap.add_argument("--prefill-ms", type=float, default=0.2)
    ap.add_argument("--reps", type=int, default=2)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
