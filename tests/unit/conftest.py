"""Fixtures of the store tests: moto's S3 server in a thread of this process (one for the
session, started by the first test that asks for it) and an S3 store on a fresh prefix of its
bucket (helpers in tests/stores.py). boto3 and moto are imported only when a test asks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from backfill.files.s3 import S3Store


@pytest.fixture(scope="session")
def moto_url() -> Iterator[str]:
    from tests.s3server import threaded_moto

    with threaded_moto() as url:
        yield url


@pytest.fixture
def s3(moto_url: str) -> S3Store:
    """A store of its own: a fresh prefix in the shared bucket."""
    from tests.stores import s3_store

    return s3_store(moto_url)
