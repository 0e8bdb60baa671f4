"""Line order for the prefix cache on a real vLLM (issue 41, item 3): the same lines started in
the file's order and in prefix order (`backfill.prefix_order.order`, what validation writes as
the route's line list), `seats` at a time with the next one started as one ends (how a batch
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
import json
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from backfill.prefix_order import order, prefix_key, prompt_text
from bench.prefix_cache import words
from tests.vllm.upstreams import VllmProcess, vllm_model


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


async def run_order(
    http: httpx.AsyncClient, url: str, lines: list[dict[str, object]], seats: int
) -> dict[str, float]:
    before = await counters(http, url)
    queue = list(reversed(lines))
    started = time.monotonic()

    async def seat() -> None:
        while queue:
            body = queue.pop()
            resp = await http.post(f"{url}/v1/chat/completions", json=body)
            resp.raise_for_status()

    await asyncio.gather(*(seat() for _ in range(seats)))
    took = time.monotonic() - started
    after = await counters(http, url)
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    queries = d.get("vllm:prefix_cache_queries_total", 0.0)
    hits = d.get("vllm:prefix_cache_hits_total", 0.0)
    return {
        "prompt_tokens_per_line": round(d.get("vllm:prompt_tokens_total", 0.0) / len(lines), 1),
        "prefilled_tokens_per_line": round((queries - hits) / len(lines), 1),
        "cache_hit_share": round(hits / queries, 3) if queries else 0.0,
        "preemptions": d.get("vllm:num_preemptions_total", 0.0),
        "seconds": round(took, 1),
        "lines_per_second": round(len(lines) / took, 2),
    }


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
            for rep in range(args.reps):
                for name, seq in (("file", lines), ("prefix", in_order)):
                    # A fresh cache for each: other documents first evict what the last run left.
                    flush = bodies(args.docs, args.doc_tokens, 1)
                    for b in flush:
                        b["messages"][1]["content"] = "flush " + str(b["messages"][1]["content"])  # type: ignore[index]
                    await run_order(http, vllm.url, flush, args.seats)
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
    args = ap.parse_args()
    args.vllm_venv = Path(args.vllm_venv).resolve()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
