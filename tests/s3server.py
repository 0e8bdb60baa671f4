"""A real S3 API on loopback for tests: moto's server (from the package registry), in this
process's thread (`ThreadedMotoServer`, unit tests) or as a child process (`MotoProcess`, e2e:
the api and worker processes talk to it over HTTP like to any S3-compatible store).

Credentials are fake and passed by environment (`AWS_ACCESS_KEY_ID`, ...), the way the AWS
chain finds real ones; moto accepts any."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from tools.dev.procs import Child, free_port, wait_for_port

BUCKET = "backfill-test"
REGION = "us-east-1"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing-access-key",
    "AWS_SECRET_ACCESS_KEY": "testing-secret-key",
    "AWS_DEFAULT_REGION": REGION,
}


def client(endpoint_url: str) -> Any:
    return boto3.session.Session(
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        region_name=REGION,
    ).client(
        "s3",
        endpoint_url=endpoint_url,
        config=Config(
            s3={"addressing_style": "path"},
            max_pool_connections=64,
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


@contextmanager
def threaded_moto() -> Iterator[str]:
    """A moto S3 server in a thread of this process, with the test bucket; yields its URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        client(url).create_bucket(Bucket=BUCKET)
        yield url
    finally:
        server.stop()


class MotoProcess:
    """moto's S3 server as a child process (`python -m moto.server`), with the test bucket."""

    def __init__(self, log_path: Path) -> None:
        self.port = free_port()
        self.child = Child("moto")
        self.log_path = log_path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoProcess:
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.child.start(argv, None, self.log_path)
        if not wait_for_port(self.port, timeout=60):
            self.child.stop()
            raise RuntimeError(f"moto did not listen on {self.port}: {self.child.log_tail()}")
        client(self.url).create_bucket(Bucket=BUCKET)
        return self

    def stop(self) -> None:
        self.child.stop()
