"""The GPU mode's prefix cache, shaped like vLLM's automatic prefix caching.

vLLM keeps the KV cache in blocks of ``block_size`` tokens and names each full block by a hash
of its tokens chained to the block before it, so a block stands for the whole prefix up to its
end. A request's prompt reuses the blocks of its longest cached prefix and prefills only the
rest: at least its last block, since the step that computes its last token makes the first new
token and vLLM keeps the computed part block-aligned (a prompt cached whole recomputes its last
block). The blocks
of a request that ended (finished or aborted: a closed stream) stay cached until evicted, least
recently used first, so a preempted request sent again with its partial answer appended (its
continuation, decision 0036) finds its prompt and every full block of what it had generated.

Model: tokens are the simulator's words (strings); one cache of at most ``capacity_blocks``
blocks, least recently used evicted first. Two simplifications: the blocks running requests hold
are not set apart from the cache's (vLLM evicts only free blocks; with a KV budget far above
what runs, as in the benches, the two agree), and a block is cached as soon as its request is
admitted (prompt) or ends (prompt and generated), not block by block as it is filled.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


def block_hashes(tokens: Sequence[str], block_size: int) -> list[bytes]:
    """The chained hash of each full block of ``tokens`` (a partial last block has none)."""
    out: list[bytes] = []
    parent = b""
    for end in range(block_size, len(tokens) + 1, block_size):
        h = hashlib.blake2b(parent, digest_size=16)
        for token in tokens[end - block_size : end]:
            h.update(token.encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
        parent = h.digest()
        out.append(parent)
    return out


@dataclass
class PrefixCache:
    """Cached blocks by hash, least recently used first; counters as vLLM's
    ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (prompt tokens)."""

    block_size: int
    capacity_blocks: int
    queries: int = 0
    """Prompt tokens looked up (every admitted prompt)."""
    hits: int = 0
    """Of those, tokens found cached (not prefilled)."""
    _blocks: OrderedDict[bytes, None] = field(default_factory=OrderedDict, repr=False)

    def __len__(self) -> int:
        return len(self._blocks)

    def cached_prefix(self, prompt: Sequence[str]) -> int:
        """Tokens of ``prompt`` whose KV is cached (whole leading blocks, never the block of its
        last token); counts the lookup and marks the blocks used, then caches the prompt's own
        full blocks (the request computes them now)."""
        hashes = block_hashes(prompt, self.block_size)
        hit = 0
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            hit += 1
        cached = self._usable(hit, prompt)
        self.queries += len(prompt)
        self.hits += cached
        self._insert(hashes)
        return cached

    def peek(self, prompt: Sequence[str]) -> int:
        """What ``cached_prefix`` would answer now, without counting or caching anything."""
        hit = 0
        for h in block_hashes(prompt, self.block_size):
            if h not in self._blocks:
                break
            hit += 1
        return self._usable(hit, prompt)

    def _usable(self, hit: int, prompt: Sequence[str]) -> int:
        """Tokens of `hit` leading cached blocks a prompt may skip: whole blocks, never its last
        token (vLLM's `max_cache_hit_length`, `num_tokens - 1`, then block-aligned)."""
        return min(hit, max(0, len(prompt) - 1) // self.block_size) * self.block_size

    def keep(self, tokens: Sequence[str]) -> None:
        """A request ended: the full blocks of its prompt and what it generated stay cached."""
        self._insert(block_hashes(tokens, self.block_size))

    def _insert(self, hashes: list[bytes]) -> None:
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
