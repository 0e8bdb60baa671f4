"""How long validation and finalizing wait out an unavailable file store, and what a batch says
when the wait ends without the store (docs/decisions/0047). Pure: the batch workflow passes the
time in and turns the answers into its activities' options.

A storage outage is not the batch's fault: its validation and finalizing activities try again
(at most `MAX_INTERVAL_SECONDS` apart) until the batch's deadline, and only errors that waiting
cannot mend fail them at once (`backfill.files.outage`). The deadline is the batch's
`expires_at`, but never less than `MIN_WAIT_SECONDS` from the moment the activity is scheduled:
an expired or cancelled batch still gets its partial results out of an outage, and a batch whose
last line finished just before its expiry is not failed by a blip.
"""

from __future__ import annotations

from backfill.batches.batch import BatchError

STORE_UNAVAILABLE = "StoreUnavailable"
"""The type of the `ApplicationError` an activity raises when the store is unavailable (retried);
every other error is raised non-retryable, typed by its exception's class."""

INITIAL_INTERVAL_SECONDS = 1.0
"""The first wait after a failed attempt; each next one doubles, up to `MAX_INTERVAL_SECONDS`."""
MAX_INTERVAL_SECONDS = 30.0
"""The longest wait between two attempts: a store back after an outage is used within this."""
MIN_WAIT_SECONDS = 24 * 3600
"""The shortest time an activity scheduled now waits for the store, whatever the expiry."""


STORE_STEPS = frozenset({"validate_input", "finalize_batch"})
"""The activities that wait out an unavailable store."""


def waits_on_store(pending: list[tuple[str, str]]) -> bool:
    """Whether a batch waits on the store, from its pending activities as (activity type, type
    of the last failure, "" if none)."""
    return any(kind in STORE_STEPS and failure == STORE_UNAVAILABLE for kind, failure in pending)


def store_wait_seconds(now: int, expires_at: int | None) -> int:
    """Seconds from `now` an activity may keep trying: until `expires_at`, at least
    `MIN_WAIT_SECONDS`."""
    return max(MIN_WAIT_SECONDS, (expires_at or 0) - now)


def store_failure(step: str, *, waited_out: bool, error_type: str | None) -> BatchError:
    """The batch's error when `step` ("validation" or "finalizing") failed for good: the store
    stayed unavailable until the deadline (`waited_out`), or an error waiting cannot mend."""
    if waited_out or error_type == STORE_UNAVAILABLE:
        return BatchError(
            code="store_unavailable",
            message=f"The file store stayed unavailable until the batch's deadline: {step} "
            "could not read or write the batch's files.",
        )
    return BatchError(
        code="store_error",
        message=f"The batch's {step} failed on the file store ({error_type or 'unknown error'}); "
        "retrying would not help.",
    )
