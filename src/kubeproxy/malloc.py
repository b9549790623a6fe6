"""glibc's malloc arenas for the long-running proxy: one, shared by its threads.

glibc gives each thread that allocates its own arena (up to 8 per CPU) and keeps the pages
it touched. The proxy's threads take turns on the GIL, so those arenas buy no
parallelism, only memory: a cold sync of 10,000 Services renders in the sync worker
thread and applies the new table's pieces from two more, and each thread's big
strings (the pieces' scripts) landed in an arena of its own: the proxy's peak was
17 MB higher than with one arena (bench.e2e, 10,000 x 10, API source: 219 MB with
glibc's default, 215 MB with two arenas, 202 MB with one). ``MALLOC_ARENA_MAX`` in the
environment does the same; this is the call, so every deployment gets it. Where the C
library is not glibc, nothing happens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 1


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap the arenas glibc creates from now on; True if it took."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        log.debug("No mallopt in the C library (%s): malloc arenas left as they are", name)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))
