"""What a request body may carry upstream: the fields that would escape the gateway's
scheduling or bill the operator, refused or set off unless the route allows them (decision 0028).

The gateway runs each request under its own accounting: live requests under `max_live_in_flight`
and the live counts, batch lines under the route's allotment, seat-aware admission and
preemption. Some fields take a request out of all that, or reach state the upstream keeps under
the operator's one credential:

- `background` (Responses API): the server answers at once with a queued stub and generates
  afterwards, outside every count; a batch line would "complete" with the stub. Refused.
- `store` (Responses API, on by default upstream): the response is kept under the shared
  credential, where any tenant that learns its id can read or chain onto it. Sent as `false`;
  an explicit `store: true` is refused.
- `previous_response_id`, `conversation` (Responses API): continue state stored under the
  shared credential, possibly another tenant's. Refused.
- `service_tier` (any endpoint, `openai` routes): a priority tier is billed to the operator's
  account. Dropped.

A route lists what it allows in `allow_body_fields` (e.g. a single-tenant route to a server of
its own). Pure: no I/O; `backfill.upstream.request` applies `outgoing_body` to every body sent,
validation and the live proxy answer `refused_field` before anything is sent.
"""

from __future__ import annotations

from typing import Any

from backfill.platform.config import BodyField, RouteConfig

RESPONSES_PATH = "/v1/responses"

REFUSED_WHEN_SET: tuple[BodyField, ...] = (
    "background",
    "store",
    "previous_response_id",
    "conversation",
)
"""Responses API fields refused when set (see the module's docstring for why each)."""

_WHY: dict[str, str] = {
    "background": "a background response would run outside the gateway's scheduling and limits",
    "store": "responses are not stored upstream (the upstream credential is shared)",
    "previous_response_id": "stored responses live under the shared upstream credential",
    "conversation": "stored conversations live under the shared upstream credential",
}


def _set(field: str, value: object) -> bool:
    """Whether `value` asks for the field's effect: for the flags, anything a server could read
    as "yes" (only absent, null, false, 0 and "" are "no"); for the ids, anything not null."""
    if field in ("background", "store"):
        return value not in (None, False, 0, "")
    return value is not None


def refused_field(endpoint: str, body: dict[str, Any], route: RouteConfig) -> str | None:
    """The first field of `body` that `route` does not allow on `endpoint`, or None."""
    if endpoint != RESPONSES_PATH:
        return None
    for field in REFUSED_WHEN_SET:
        if field in body and field not in route.allow_body_fields and _set(field, body[field]):
            return field
    return None


def refusal_message(field: str, route: RouteConfig) -> str:
    """Why `field` is refused, for a 400 or a line's validation error."""
    return (
        f"'{field}' is not accepted on this model's route {route.id!r}: {_WHY[field]}. "
        f"Leave it out (or false)."
    )


def outgoing_body(endpoint: str, body: dict[str, Any], route: RouteConfig) -> dict[str, Any]:
    """`body` as the policy lets it go upstream: `service_tier` dropped on `openai` routes,
    `store: false` on the Responses API (upstream's default is true), unless the route allows
    them. Returns `body` itself when nothing changes."""
    allowed = route.allow_body_fields
    out = body
    if route.provider == "openai" and "service_tier" in body and "service_tier" not in allowed:
        out = {k: v for k, v in body.items() if k != "service_tier"}
    if endpoint == RESPONSES_PATH and "store" not in allowed and body.get("store") is not False:
        out = {**out, "store": False}
    return out
