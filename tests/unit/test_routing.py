"""Unit tests for backfill.routes.routing (pure functions, no server)."""

from __future__ import annotations

import hashlib
from collections import Counter
from unittest import mock

from backfill.platform.config import ModelConfig, RouteConfig
from backfill.routes import routing
from backfill.routes.routing import choose_route


def model(*weights: int) -> ModelConfig:
    return ModelConfig(
        id="demo",
        routes=[
            RouteConfig(id=f"r{i}", base_url=f"http://127.0.0.1:{8100 + i}/v1", weight=w)
            for i, w in enumerate(weights, start=1)
        ],
    )


def test_deterministic_per_line() -> None:
    m = model(1, 1, 1)
    first = [choose_route(m, "batch_abc", f"req-{i}").id for i in range(500)]
    again = [choose_route(m, "batch_abc", f"req-{i}").id for i in range(500)]
    assert first == again
    # Rebuilding the config (another process) gives the same answers.
    assert [choose_route(model(1, 1, 1), "batch_abc", f"req-{i}").id for i in range(500)] == first
    # All routes are used, and another batch id gives another (still deterministic) split.
    assert set(first) == {"r1", "r2", "r3"}
    other = [choose_route(m, "batch_xyz", f"req-{i}").id for i in range(500)]
    assert other != first


def test_known_value_is_stable_across_runs() -> None:
    # SHA-256 based, so this holds on any machine and with any PYTHONHASHSEED.
    point = routing.route_point("batch_1", "a", 1 << 30)
    assert point == routing.route_point("batch_1", "a", 1 << 30)
    expected = int.from_bytes(hashlib.sha256(b"batch_1\0a").digest()[:8], "big") % (1 << 30)
    assert point == expected


def test_weights_respected() -> None:
    m = model(3, 1)
    counts = Counter(choose_route(m, "batch_w", f"line-{i}").id for i in range(10_000))
    assert abs(counts["r1"] / 10_000 - 0.75) <= 0.03
    assert counts["r1"] + counts["r2"] == 10_000


def test_weights_three_routes() -> None:
    m = model(1, 2, 7)
    counts = Counter(choose_route(m, "batch_w3", str(i)).id for i in range(10_000))
    for rid, share in (("r1", 0.1), ("r2", 0.2), ("r3", 0.7)):
        assert abs(counts[rid] / 10_000 - share) <= 0.03


def test_single_route_shortcut_does_not_hash() -> None:
    m = model(5)
    with mock.patch.object(routing.hashlib, "sha256", side_effect=AssertionError("hashed")):
        assert choose_route(m, "batch_s", "x") is m.routes[0]


def test_surrogate_custom_id_does_not_raise() -> None:
    m = model(1, 1)
    assert choose_route(m, "batch_s", "\ud800").id in {"r1", "r2"}
