"""The client CLI, `backfill batch ...`: a user's side of backfill's Batch API over HTTP only
(the official `openai` SDK, plus plain httpx for backfill's extension endpoints), so it works
against any backfill, and its OpenAI-compatible commands against any OpenAI-compatible server.
docs/cli.md is its manual. Nothing here imports the api, worker, workflows or activities."""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    """Run `backfill batch <argv>`; the exit code (0 completed, 1 failed/expired/cancelled or
    unreachable, 2 usage error or refused request, 130 stopped watching)."""
    from tools.client.commands import run

    return run(list(argv))
