"""Line order for the prefix cache, on a model of a model server's prefix cache (issue 41,
item 3): tokens prefilled per line and batch throughput, lines started in prefix order
(`backfill.batches.prefix_order`, the order validation writes) against the file's order.

The workload: `docs` documents of `doc_tokens` tokens behind one system prompt of
`system_tokens`, each document asked `questions` questions (`question_tokens` each), answers of
`output_tokens`. The file lists the first question of every document, then the second, ...
(`--file-order round-robin`, as a script that loops over questions writes it) or in random order
(`shuffled`).

The server: `slots` lines at once (the route's cap); the gateway starts the next line of its
list when one ends. A prefix cache of `cache_tokens` tokens in blocks of 16, keyed by the hash of
the prompt up to the block's end (as vLLM's automatic prefix caching): a line prefills only what
follows its longest cached prefix; its blocks are pinned while it runs, then kept, least
recently used evicted first. A line takes `prefill_ms` per prefilled token plus `decode_ms` per
output token, each slot on its own (no interference between slots): throughput is bounded by
what a slot spends prefilling. 4 characters make a token.

    PYTHONPATH=. .venv/bin/python -m bench.prefix_cache
"""

from __future__ import annotations

import argparse
import hashlib
import heapq
import json
import random
from collections import OrderedDict
from dataclasses import dataclass

from backfill.batches.prefix_order import order, prefix_key, prompt_text

BLOCK_TOKENS = 16
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class Workload:
    docs: int = 200
    doc_tokens: int = 2000
    system_tokens: int = 250
    questions: int = 4
    question_tokens: int = 20
    output_tokens: int = 100


@dataclass(frozen=True)
class Server:
    slots: int = 16
    cache_tokens: int = 65_536
    prefill_ms: float = 0.25
    decode_ms: float = 20.0


def words(seed: str, tokens: int) -> str:
    """`tokens` tokens of text unique to `seed`."""
    n = tokens * CHARS_PER_TOKEN
    out = [hashlib.sha256(f"{seed}:{i}".encode()).hexdigest()[:7] + " " for i in range(n // 8 + 1)]
    return "".join(out)[:n]


def prompts(w: Workload, file_order: str, seed: int) -> list[dict[str, list[dict[str, str]]]]:
    system = words("system", w.system_tokens)
    docs = [words(f"doc{d}", w.doc_tokens) for d in range(w.docs)]
    bodies = [
        {
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": docs[d] + words(f"q{d}.{q}", w.question_tokens)},
            ]
        }
        for q in range(w.questions)
        for d in range(w.docs)
    ]
    if file_order == "shuffled":
        random.Random(seed).shuffle(bodies)
    return bodies


def blocks(text: str) -> list[bytes]:
    """The cache keys of a prompt's full blocks: the hash of the text up to each block's end."""
    size = BLOCK_TOKENS * CHARS_PER_TOKEN
    h = hashlib.blake2b(digest_size=8)
    out = []
    for start in range(0, len(text) - size + 1, size):
        h.update(text[start : start + size].encode())
        out.append(h.digest())
    return out


def serve(texts: list[str], start_order: list[int], w: Workload, s: Server) -> dict[str, float]:
    capacity = s.cache_tokens // BLOCK_TOKENS
    pinned: dict[bytes, int] = {}  # blocks of running lines → how many use them
    free: OrderedDict[bytes, None] = OrderedDict()  # cached, unused: least recently used first
    prefilled = cached_total = 0
    running: list[tuple[float, int, list[bytes]]] = []
    now = 0.0
    queue = list(reversed(start_order))
    while queue or running:
        while queue and len(running) < s.slots:
            i = queue.pop()
            bs = blocks(texts[i])
            hit = 0
            while hit < len(bs) and (bs[hit] in pinned or bs[hit] in free):
                hit += 1
            tokens = len(texts[i]) // CHARS_PER_TOKEN
            fill = tokens - hit * BLOCK_TOKENS
            prefilled += fill
            cached_total += hit * BLOCK_TOKENS
            for k in bs:  # pinned while it runs
                if k in pinned:
                    pinned[k] += 1
                    continue
                free.pop(k, None)
                pinned[k] = 1
                while free and len(free) + len(pinned) > capacity:
                    free.popitem(last=False)
            end = now + (fill * s.prefill_ms + w.output_tokens * s.decode_ms) / 1000
            heapq.heappush(running, (end, i, bs))
        now, _, bs = heapq.heappop(running)
        for k in bs:
            pinned[k] -= 1
            if pinned[k] == 0:
                del pinned[k]
                free[k] = None  # most recently used
    n = len(texts)
    return {
        "prefilled_tokens_per_line": round(prefilled / n, 1),
        "cached_share": round(cached_total / (prefilled + cached_total), 3),
        "lines_per_second": round(n / now, 2),
    }


def run(file_order: str, w: Workload, s: Server, seed: int) -> dict[str, object]:
    bodies = prompts(w, file_order, seed)
    # What the server reads: every message whole (the ordering key reads only their start).
    texts = ["".join(m["content"] for m in b["messages"]) for b in bodies]
    keys = [prefix_key(prompt_text(dict(b), "messages")) for b in bodies]
    as_file = serve(texts, list(range(len(texts))), w, s)
    ordered = serve(texts, order(keys), w, s)
    return {
        "file_order": file_order,
        "cache_tokens": s.cache_tokens,
        "file": as_file,
        "prefix_order": ordered,
        "throughput_gain": round(ordered["lines_per_second"] / as_file["lines_per_second"], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--file-order", choices=["round-robin", "shuffled"], default=None)
    ap.add_argument("--cache-tokens", type=int, nargs="*", default=[16_384, 262_144, 1 << 20])
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--output-tokens", type=int, default=Workload.output_tokens)
    args = ap.parse_args()
    w = Workload(output_tokens=args.output_tokens)
    for file_order in [args.file_order] if args.file_order else ["round-robin", "shuffled"]:
        for cache in args.cache_tokens:
            print(json.dumps(run(file_order, w, Server(slots=args.slots, cache_tokens=cache), 1)))


if __name__ == "__main__":
    main()
