"""Which route serves a batch line: the model's weighted, deterministic routing policy.

The choice depends only on the batch id, the line's `custom_id` and the model's configured routes
(their order and weights), so it is the same on every machine and every run. It is made once, at
validation, and persisted in the batch's line index; later configuration changes do not move lines
of an existing batch.
"""

from __future__ import annotations

import hashlib

from backfill.platform.config import ModelConfig, RouteConfig


def route_point(batch_id: str, custom_id: str, total_weight: int) -> int:
    """A stable integer in `[0, total_weight)` for one line (SHA-256 based, not `hash()`)."""
    key = f"{batch_id}\0{custom_id}".encode("utf-8", "surrogatepass")
    digest = hashlib.sha256(key).digest()
    return int.from_bytes(digest[:8], "big") % total_weight


def choose_route(model: ModelConfig, batch_id: str, custom_id: str) -> RouteConfig:
    """The route that serves line `custom_id` of `batch_id`, weighted by `RouteConfig.weight`.

    Deterministic per (batch_id, custom_id). A model with a single route returns it without
    hashing.
    """
    routes = model.routes
    if len(routes) == 1:
        return routes[0]
    if not routes:
        raise ValueError(f"model {model.id!r} has no routes")
    point = route_point(batch_id, custom_id, sum(r.weight for r in routes))
    for route in routes:
        if point < route.weight:
            return route
        point -= route.weight
    raise AssertionError("unreachable: point is below the total weight")
