""" "Batch lines at once": the route's cap, the one range every place that takes it validates."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

MIN_LINES_AT_ONCE = 1
MAX_LINES_AT_ONCE = 256
DEFAULT_LINES_AT_ONCE = 2

LinesAtOnce = Annotated[int, Field(ge=MIN_LINES_AT_ONCE, le=MAX_LINES_AT_ONCE)]
"""Batch lines running on the route at once, across every batch and process (1–256)."""
