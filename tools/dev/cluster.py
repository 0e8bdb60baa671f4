"""`backfill dev --temporal-address HOST:PORT` (or TEMPORAL_ADDRESS set): a Temporal that is
already running, instead of the embedded dev server.

Before anything starts, the doctor's Temporal checks (`backfill.operations.doctor.temporal`): the
address answers, with TLS or an API key as the TEMPORAL_* settings say, and the namespace exists.
Then backfill's search attributes: each missing one is registered (what the embedded dev server does
with `--search-attribute` at start), and the start log names each; one registered with another
type refuses the start with the doctor's fix (changing it is the cluster owner's call).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
from temporalio.service import RPCError

from backfill.batches import search_attributes as sa
from backfill.operations.doctor import (
    Finding,
    registered_search_attributes,
    search_attribute_findings,
    temporal,
)
from backfill.platform.config import Settings

MANY_LINES = 128
"""Above this many lines at once on a route, a cluster needs `history.maximumBufferedEventsBatch`
raised (docs/operator-guide.md); the embedded dev server raises it itself."""


@dataclass
class Prepared:
    """What `prepare` found and did."""

    registered: list[str] = field(default_factory=list)
    """Search attributes `backfill dev` registered (name and type), for the log."""
    refused: list[Finding] = field(default_factory=list)
    """Why the stack must not start; empty when it may."""
    warnings: list[str] = field(default_factory=list)


def _value_type(type_name: str) -> int:
    """`KeywordList` → `INDEXED_VALUE_TYPE_KEYWORD_LIST`."""
    snake = "".join(f"_{c}" if c.isupper() and i else c for i, c in enumerate(type_name))
    return int(IndexedValueType.Value(f"INDEXED_VALUE_TYPE_{snake.upper()}"))


async def prepare(settings: Settings) -> Prepared:
    """Check the Temporal `settings` names and register backfill's missing search attributes."""
    out = Prepared()
    client, reached = await temporal(settings)
    if client is None:
        embedded = (
            "or, for a dev server of backfill dev's own, drop --temporal-address and unset "
            "TEMPORAL_ADDRESS (and temporal_address in the config)"
        )
        out.refused.append(
            Finding("fail", reached.check, reached.said, f"{reached.fix}\n{embedded}")
        )
        return out
    namespace = settings.temporal_namespace
    try:
        registered = await registered_search_attributes(client, namespace)
    except RPCError as err:
        out.refused.append(
            Finding("fail", "search attributes", f"cannot list them ({err.message})")
        )
        return out
    wrong = [name for name, type_ in sa.ALL.items() if registered.get(name) not in (None, type_)]
    if wrong:
        problems = search_attribute_findings(registered, namespace)
        out.refused += [f for f in problems if f.said.startswith(tuple(wrong))]
        return out
    missing = {name: type_ for name, type_ in sa.ALL.items() if name not in registered}
    if missing:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(
                    namespace=namespace,
                    search_attributes={n: _value_type(t) for n, t in missing.items()},  # type: ignore[misc]
                )
            )
        except RPCError as err:
            out.refused.append(
                Finding(
                    "fail",
                    "search attributes",
                    f"{', '.join(missing)} not registered on {namespace}, and registering them "
                    f"was refused ({err.message})",
                    "\n".join(f.fix for f in search_attribute_findings(registered, namespace)),
                )
            )
            return out
        out.registered = [f"{n} ({t})" for n, t in missing.items()]
    many = [
        f"{route.id} ({route.max_concurrent_lines})"
        for model in settings.models
        for route in model.routes
        if route.max_concurrent_lines > MANY_LINES
    ]
    if many:
        out.warnings.append(
            f"route(s) {', '.join(many)} run more than {MANY_LINES} lines at once: this "
            "Temporal needs history.maximumBufferedEventsBatch raised to about 1000, or busy "
            "batches' workflow tasks are failed and redone (docs/developing.md)"
        )
    return out
