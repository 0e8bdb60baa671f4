"""Fault injection for the model server simulator (:mod:`tools.sim.server`).

A fault matches inference requests (optionally only those carrying a given header or hitting a
given path) and, when it fires, delays the request, answers it with an error status, or drops the
connection without any response. ``count`` limits how often it fires (``None`` = until cleared);
``rate`` makes it fire with that probability (seeded RNG) instead of every time.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SimFault(BaseModel):
    """One fault rule, as accepted by ``POST /sim/faults`` and ``SimConfig.faults``."""

    model_config = ConfigDict(extra="forbid")

    status: int | None = Field(default=None, ge=400, le=599)
    delay_ms: float = Field(default=0.0, ge=0)
    drop: bool = False
    count: int | None = Field(default=None, ge=1)
    rate: float | None = Field(default=None, ge=0, le=1)
    match_custom_header: str | None = None
    match_path: str | None = None
    message: str | None = None
    retry_after: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _has_effect(self) -> SimFault:
        if self.status is None and not self.drop and self.delay_ms <= 0:
            raise ValueError("a fault needs at least one of: status, delay_ms > 0, drop")
        if self.status is not None and self.drop:
            raise ValueError("a fault cannot both answer with a status and drop")
        return self


@dataclass(slots=True)
class FaultAction:
    """What the fired faults tell the simulator to do with one request."""

    delay_s: float = 0.0
    status: int | None = None
    drop: bool = False
    message: str | None = None
    retry_after: float | None = None


@dataclass(slots=True)
class _Active:
    fault: SimFault
    remaining: int | None
    header: bytes | None
    fired: int = 0


class FaultInjector:
    """Ordered list of active faults. Delays of all fired faults add up; the first fired fault
    with a status or ``drop`` decides the outcome and stops the scan."""

    def __init__(self, faults: Iterable[SimFault] = (), seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._active: list[_Active] = []
        self.add(faults)

    def add(self, faults: Iterable[SimFault]) -> None:
        for f in faults:
            header = f.match_custom_header.lower().encode() if f.match_custom_header else None
            self._active.append(_Active(f, f.count, header))

    def clear(self) -> None:
        self._active.clear()

    def __len__(self) -> int:
        return len(self._active)

    def describe(self) -> list[dict[str, object]]:
        return [
            {
                **a.fault.model_dump(exclude_defaults=True),
                "remaining": a.remaining,
                "fired": a.fired,
            }
            for a in self._active
        ]

    def pick(self, path: str, headers: Mapping[bytes, bytes]) -> FaultAction | None:
        """Consume the faults matching this request; ``None`` if none fired."""
        if not self._active:
            return None
        action: FaultAction | None = None
        for a in list(self._active):
            f = a.fault
            if a.header is not None and a.header not in headers:
                continue
            if f.match_path is not None and f.match_path != path:
                continue
            if f.rate is not None and self._rng.random() >= f.rate:
                continue
            a.fired += 1
            if a.remaining is not None:
                a.remaining -= 1
                if a.remaining <= 0:
                    self._active.remove(a)
            action = action or FaultAction()
            action.delay_s += f.delay_ms / 1000.0
            if f.status is not None or f.drop:
                action.status, action.drop = f.status, f.drop
                action.message, action.retry_after = f.message, f.retry_after
                break
        return action
