"""Samples each route's running batch lines, limit and live requests in flight every
`SAMPLE_SECONDS` in the background, for the route page's 15-minute chart.

One query of the route's scheduler (through the process's one `api.routes.poller.RoutePoller`)
and one per batch on it (the same reads as the route page's status), bounded like every RPC of
the api; a route that cannot answer now (Temporal down, no
worker) gets no sample, which the chart shows as a gap in time. Each api replica keeps its own.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from api.console.samples import RouteSample, RouteSamples
from api.errors import TemporalUnavailable
from api.routes.poller import RoutePoller
from api.routes.routes_api import route_sample
from api.temporal_link import TemporalLink
from backfill.platform.background import Background

log = logging.getLogger(__name__)

SAMPLE_SECONDS = 5.0


class RouteSampler:
    def __init__(
        self,
        samples: RouteSamples,
        link: TemporalLink,
        routes: Sequence[tuple[str, int]],
        poller: RoutePoller | None = None,
    ) -> None:
        self._samples = samples
        self._link = link
        self._poller = poller or RoutePoller(link)
        self._own_poller = poller is None
        self._routes = list(routes)
        """(route id, its configured batch limit)."""
        self._background = Background()

    def start(self) -> None:
        self._background.start(self._run())

    async def stop(self) -> None:
        await self._background.stop()
        if self._own_poller:
            await self._poller.close()

    async def sample_once(self) -> None:
        """One sample of every route that answers."""
        try:
            client = self._link.client()
        except TemporalUnavailable:
            return

        async def one(route: str, configured: int) -> None:
            try:
                status = await self._poller.status(route, SAMPLE_SECONDS)
                running, limit, live = await route_sample(client, route, configured, status)
            except Exception as err:  # any failure is a missing sample, never a dead sampler
                log.debug("no chart sample for route %s: %s", route, err)
                return
            self._samples.add(route, RouteSample(time.time(), running, limit, live))

        await asyncio.gather(*(one(r, limit) for r, limit in self._routes))

    async def _run(self) -> None:
        while True:
            await self.sample_once()
            await asyncio.sleep(SAMPLE_SECONDS)
