"""Line order for the prefix cache on a real vLLM (issue 41, item 3): the same lines started in
the file's order and in prefix order (`backfill.batches.prefix_order.order`, what validation writes
as the route's line list), `seats` at a time with the next one started as one ends (how a batch
starts its route's list within its allotment), straight to vLLM. vLLM's own counters say what
its prefix cache served: `vllm:prefix_cache_queries_total` (prompt tokens looked up) and
`vllm:prefix_cache_hits_total` (found), so tokens prefilled = queries - hits.

vLLM is the CPU build and random-weight tiny Llama of `make test-vllm` (tests/vllm/README.md),
its KV cache cut to `--kv-blocks` blocks so that the documents do not all fit (with the default
1 GiB cache the tiny model holds every prompt, and the order cannot matter).

    PYTHONPATH=. .venv/bin/python -m bench.prefix_cache_vllm --vllm-venv .venv-vllm
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from backfill.batches.prefix_order import order, prefix_key, prompt_text
from bench.common import dev_server
from bench.prefix_cache import words
from tests.e2e.stack import wait_terminal
from tests.vllm.upstreams import VllmProcess, VllmStack, vllm_model


def bodies(docs: int, doc_tokens: int, questions: int) -> list[dict[str, object]]:
    """Round-robin: every document's first question, then every second, ..."""
    system = words("system", 200)
    texts = [words(f"doc{d}", doc_tokens) for d in range(docs)]
    return [
        {
            "model": "demo",
            "max_tokens": 4,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": texts[d] + " " + words(f"q{d}.{q}", 10)},
            ],
        }
        for q in range(questions)
        for d in range(docs)
    ]


async def counters(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    text = (await http.get(f"{url}/metrics")).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in (
                "vllm:prefix_cache_queries_total",
                "vllm:prefix_cache_hits_total",
                "vllm:prompt_tokens_total",
                "vllm:num_preemptions_total",
            ):
                out[s.name] = out.get(s.name, 0.0) + s.value
    return out


async def measure(
    http: httpx.AsyncClient, url: str, n: int, run: Callable[[], Awaitable[None]]
) -> dict[str, float]:
    """vLLM's counters around `run` (which sends `n` lines), per line."""
    before = await counters(http, url)
    started = time.monotonic()
    await run()
    took = time.monotonic() - started
    after = await counters(http, url)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    queries = d.get("vllm:prefix_cache_queries_total", 0.0)
    hits = d.get("vllm:prefix_cache_hits_total", 0.0)
    return {
        "prompt_tokens_per_line": round(d.get("vllm:prompt_tokens_total", 0.0) / n, 1),
        "prefilled_tokens_per_line": round((queries - hits) / n, 1),
        "cache_hit_share": round(hits / queries, 3) if queries else 0.0,
        "preemptions": d.get("vllm:num_preemptions_total", 0.0),
        "seconds": round(took, 1),
        "lines_per_second": round(n / took, 2),
    }


async def run_order(
    http: httpx.AsyncClient, url: str, lines: list[dict[str, object]], seats: int
) -> dict[str, float]:
    """`lines` straight to vLLM, `seats` at a time, in this order."""
    queue = list(reversed(lines))

    async def seat() -> None:
        while queue:
            body = queue.pop()
            resp = await http.post(f"{url}/v1/chat/completions", json=body)
            resp.raise_for_status()

    async def run() -> None:
        await asyncio.gather(*(seat() for _ in range(seats)))

    return await measure(http, url, len(lines), run)


def flush_lines(args: argparse.Namespace) -> list[dict[str, object]]:
    """Other documents, so that what the last run left is evicted."""
    flush = bodies(args.docs, args.doc_tokens, 1)
    for b in flush:
        b["messages"][1]["content"] = "flush " + str(b["messages"][1]["content"])  # type: ignore[index]
    return flush


class OrderStack(VllmStack):
    """The e2e stack on vLLM, with `limits.order_lines_by_prefix` as given."""

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


async def submit_and_wait(client: openai.AsyncOpenAI, data: bytes, n: int) -> None:
    f = await client.files.create(file=("in.jsonl", data), purpose="batch")
    b = await client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = await wait_terminal(client, b.id, within=900)
    assert done.status == "completed", done
    assert done.request_counts is not None and done.request_counts.completed == n, done


async def through_gateway(
    http: httpx.AsyncClient, url: str, args: argparse.Namespace, tmp: Path
) -> None:
    """The batch through the gateway (its route capped at `seats`), ordered and not."""
    lines = bodies(args.docs, args.doc_tokens, args.questions)
    data = "".join(
        json.dumps(
            {"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": b}
        )
        + "\n"
        for i, b in enumerate(lines)
    ).encode()
    async with dev_server(tmp) as server:
        for rep in range(args.reps):
            for name, ordered in (("file", False), ("prefix", True)):
                sub = tmp / f"{name}-{rep}"
                sub.mkdir()
                stack = OrderStack(
                    sub, server.address, vllm_url=url, cap=args.seats, ordered=ordered
                )
                async with stack.running():
                    await run_order(http, url, flush_lines(args), args.seats)

                    run = functools.partial(submit_and_wait, stack.client(), data, len(lines))
                    out = await measure(http, url, len(lines), run)
                    print(json.dumps({"via": "gateway", "order": name, "rep": rep + 1, **out}))


async def main_async(args: argparse.Namespace) -> None:
    venv = args.vllm_venv
    log = Path(tempfile.gettempdir()) / "bench-prefix-cache-vllm.log"
    vllm = VllmProcess(venv, vllm_model(venv), log, seats=args.seats)
    at = vllm.argv.index("--max-model-len")
    vllm.argv[at + 1] = "8192"  # within the cut cache (vLLM refuses a longer one)
    vllm.argv += ["--num-gpu-blocks-override", str(args.kv_blocks), "--enable-prefix-caching"]
    vllm.start()
    try:
        print(f"vLLM up in {await vllm.wait_ready():.0f} s (log {log})", flush=True)
        lines = bodies(args.docs, args.doc_tokens, args.questions)
        keys = [prefix_key(prompt_text(b, "messages")) for b in lines]
        in_order = [lines[i] for i in order(keys)]
        async with httpx.AsyncClient(timeout=300) as http:
            await run_order(http, vllm.url, lines[:2], args.seats)  # warm up
            if args.gateway:
                with tempfile.TemporaryDirectory(prefix="bench-prefix-") as tmp:
                    await through_gateway(http, vllm.url, args, Path(tmp))
                return
            for rep in range(args.reps):
                for name, seq in (("file", lines), ("prefix", in_order)):
                    # A fresh cache for each: other documents first evict what the last run left.
                    await run_order(http, vllm.url, flush_lines(args), args.seats)
                    out = await run_order(http, vllm.url, seq, args.seats)
                    print(json.dumps({"order": name, "rep": rep + 1, **out}), flush=True)
    finally:
        vllm.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vllm-venv", default=".venv-vllm")
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument("--doc-tokens", type=int, default=500, help="4 characters each")
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--seats", type=int, default=4)
    ap.add_argument(
        "--kv-blocks", type=int, default=256, help="of 128 tokens (the CPU build's block)"
    )
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument(
        "--gateway",
        action="store_true",
        help="submit the batch through backfill (a dev server and the e2e stack, once with "
        "limits.order_lines_by_prefix off, once on) instead of sending the lines in each order",
    )
    args = ap.parse_args()
    args.vllm_venv = Path(args.vllm_venv).resolve()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
