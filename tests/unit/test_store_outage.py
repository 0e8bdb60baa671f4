"""Which store errors are outages (waited out) and which are not (fail at once), on the errors
the real stores raise; how long a batch waits; how a worker counts the batches waiting
(docs/decisions/0047)."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.store_waits import WAITING_FOR_SECONDS, StoreWaits
from activities.validation import ValidationActivities
from backfill.batches.storage_waits import (
    MIN_WAIT_SECONDS,
    STORE_UNAVAILABLE,
    store_failure,
    store_wait_seconds,
)
from backfill.files import FileStore, Store
from backfill.files.outage import store_unavailable
from backfill.files.s3 import S3Store
from backfill.platform.config import Settings
from backfill.platform.messages import ValidateInput
from tests.s3server import BUCKET
from tests.stores import upload
from tools.dev.procs import free_port


def _raised(call: object) -> BaseException:
    with pytest.raises(Exception) as info:
        call()  # type: ignore[operator]
    return info.value


def _down_s3() -> S3Store:
    """An S3 store whose endpoint refuses connections (one try per call)."""
    down = boto3.session.Session(
        aws_access_key_id="k", aws_secret_access_key="s", region_name="us-east-1"
    ).client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        config=Config(retries={"max_attempts": 1, "mode": "standard"}),
    )
    return S3Store(down, BUCKET, "p/")


def test_an_s3_endpoint_that_refuses_connections_is_an_outage() -> None:
    store = _down_s3()
    assert store_unavailable(_raised(lambda: store.get_file("file-abc")))


def _validate(store: Store) -> BaseException:
    activities = ValidationActivities(Settings(data_dir=Path("/nonexistent")), store)
    inp = ValidateInput(
        batch_id="batch_x1", input_file_id="file-abc", endpoint="/v1/chat/completions"
    )
    with pytest.raises(ApplicationError) as info:
        asyncio.run(ActivityEnvironment().run(activities.validate_input, inp))
    return info.value


def test_validation_is_retried_on_an_outage_and_not_on_a_missing_input(tmp_path: Path) -> None:
    outage = _validate(_down_s3())
    assert isinstance(outage, ApplicationError)
    assert outage.type == STORE_UNAVAILABLE and not outage.non_retryable
    missing = _validate(FileStore(tmp_path / "store"))
    assert isinstance(missing, ApplicationError)
    assert missing.type == "FileNotFoundError" and missing.non_retryable


def test_s3_server_errors_are_outages_and_client_errors_are_not(s3: S3Store) -> None:
    def answer(status: int, code: str) -> ClientError:
        response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}
        return ClientError(response, "GetObject")  # type: ignore[arg-type]

    assert store_unavailable(answer(503, "SlowDown"))
    assert store_unavailable(answer(500, "InternalError"))
    assert store_unavailable(answer(400, "RequestTimeout"))
    assert not store_unavailable(answer(403, "AccessDenied"))
    # A real one from moto's server: a bucket that does not exist.
    other = S3Store(s3.client, "no-such-bucket", "p/")
    err = _raised(lambda: other.snapshot_input("batch_x1", upload(s3, b"x")))
    assert isinstance(err, ClientError) and not store_unavailable(err)


def test_a_full_disk_is_an_outage_and_a_missing_input_is_not(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "store")
    missing = _raised(lambda: store.open_input("batch_x1", "file-nothere"))
    assert isinstance(missing, FileNotFoundError) and not store_unavailable(missing)
    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert store_unavailable(full)
    try:  # raised through a caller that wraps it
        try:
            raise full
        except OSError as err:
            raise RuntimeError("finalizing failed") from err
    except RuntimeError as wrapped:
        assert store_unavailable(wrapped)
    assert not store_unavailable(PermissionError(errno.EACCES, "denied"))
    assert not store_unavailable(ValueError("line 3 starts before line 2 ends"))


def test_a_batch_waits_until_its_expiry_and_at_least_a_day() -> None:
    now = 1_000_000
    assert store_wait_seconds(now, now + 7 * 86400) == 7 * 86400
    assert store_wait_seconds(now, now + 60) == MIN_WAIT_SECONDS  # about to expire
    assert store_wait_seconds(now, now - 3600) == MIN_WAIT_SECONDS  # expired: files still due
    assert store_failure("finalizing", waited_out=True, error_type=None).code == "store_unavailable"
    assert store_failure("validation", waited_out=False, error_type=STORE_UNAVAILABLE).code == (
        "store_unavailable"
    )
    permanent = store_failure("validation", waited_out=False, error_type="FileNotFoundError")
    assert permanent.code == "store_error" and "FileNotFoundError" in permanent.message


def test_a_worker_counts_the_batches_it_saw_waiting() -> None:
    now = [0.0]
    waits = StoreWaits(clock=lambda: now[0])
    waits.failed("batch_a")
    waits.failed("batch_b")
    waits.failed("batch_a")
    assert waits.waiting() == 2
    waits.ended("batch_b")  # its next attempt succeeded, or failed for another reason
    assert waits.waiting() == 1
    now[0] = WAITING_FOR_SECONDS + 1  # no failed attempt here since: retried elsewhere
    assert waits.waiting() == 0
