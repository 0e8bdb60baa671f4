"""Fewer malloc arenas for the worker process (glibc).

glibc gives a thread that finds the heap busy an arena of its own, up to eight per core, and
memory freed in one arena is not reused by another. The worker runs many threads that allocate
(32 for the lines' store work, validation and finalizing in others, the SDK's own), so each
arena fragments separately: with 64 lines in flight a 20,000-line batch kept about 30 MB more
resident with the default than with two arenas (docs/performance.md, bench/scale.py).
`MALLOC_ARENA_MAX` set in the environment wins over this.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys

M_ARENA_MAX = -8
"""mallopt's parameter number for the arena limit (glibc's malloc.h)."""
WORKER_ARENAS = 2

log = logging.getLogger(__name__)


def limit_malloc_arenas(arenas: int = WORKER_ARENAS) -> bool:
    """Cap glibc's malloc arenas, before the process starts its threads. True if applied;
    False where the environment already sets it or there is no glibc `mallopt`."""
    if os.environ.get("MALLOC_ARENA_MAX") or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    applied = bool(mallopt(M_ARENA_MAX, arenas))
    if applied:
        log.debug("malloc arenas capped at %d", arenas)
    return applied
