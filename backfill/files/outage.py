"""Which store errors mean "the storage is unavailable right now" (wait and try again) rather
than "this will never work" (fail): by type and error code, never by message text.

Validation and finalizing wait out an unavailable store until the batch's deadline
(`activities.store_waits`, docs/decisions/0047); every other error fails them at once. The local
store's outages are a full or failing disk, an NFS server gone; the S3 store's an endpoint that
refuses or drops connections, times out, or answers 5xx / slow down. A missing object, a
permission refused, a malformed record are not outages: waiting would not mend them.
"""

from __future__ import annotations

import errno

from botocore.exceptions import ClientError, HTTPClientError, IncompleteReadError
from botocore.exceptions import ConnectionError as BotoConnectionError

UNAVAILABLE_ERRNOS = frozenset(
    {
        errno.ENOSPC,  # disk full
        errno.EDQUOT,  # quota exhausted
        errno.EIO,  # the device failed an operation
        errno.EROFS,  # remounted read-only after an error
        errno.ENOMEM,
        errno.EAGAIN,
        errno.EBUSY,
        errno.ENFILE,
        errno.EMFILE,
        errno.ETIMEDOUT,
        errno.ESTALE,  # an NFS handle gone stale
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ENOTCONN,
        errno.EHOSTUNREACH,
        errno.ENETUNREACH,
        errno.ENETDOWN,
    }
)
"""OS errors of a local (or network-mounted) store that pass when an operator frees space or
the mount comes back."""

UNAVAILABLE_S3_CODES = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "InternalError",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "Throttling",
        "ThrottlingException",
        "OperationAborted",
    }
)
"""S3 error codes that say "try again later" (besides any 5xx status)."""

_CHAIN_DEPTH = 8
"""How far the `__cause__` / `__context__` chain is followed (a store error re-raised by a
caller, a boto error wrapping a socket error)."""


def store_unavailable(err: BaseException) -> bool:
    """True when `err` (or what it was raised from) says the store is unavailable for now."""
    seen: BaseException | None = err
    for _ in range(_CHAIN_DEPTH):
        if seen is None:
            return False
        if _unavailable(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _unavailable(err: BaseException) -> bool:
    if isinstance(err, ClientError):
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        code = str(err.response.get("Error", {}).get("Code", ""))
        return int(status) >= 500 or code in UNAVAILABLE_S3_CODES
    if isinstance(err, (BotoConnectionError, HTTPClientError, IncompleteReadError)):
        # Refused, reset, timed out, closed mid-answer, a streamed body cut short. Other boto
        # errors (bad parameters, no credentials) are permanent.
        return True
    if isinstance(err, (ConnectionError, TimeoutError)):
        return True
    return isinstance(err, OSError) and err.errno in UNAVAILABLE_ERRNOS
