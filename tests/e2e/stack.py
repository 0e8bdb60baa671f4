"""The real stack for e2e tests: the session's dev server, the simulator, and the worker and api
as separate processes (`python -m backfill worker|api`), each test with its own task queue,
routes, data directory and ports."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import openai

from backfill.config import hash_key
from backfill.dev.procs import Child, backfill_argv, free_port
from backfill.sim import SimConfig, SimServer

API_KEY = "sk-test-alpha"
KEYS = {
    "sk-test-alpha": ("alpha", "member"),
    "sk-test-beta": ("beta", "member"),
    "sk-test-gamma": ("gamma", "member"),
    "sk-test-admin": ("ops", "platform_admin"),
}


class Stack:
    def __init__(
        self,
        tmp: Path,
        temporal_address: str,
        *,
        cap: int = 4,
        sim: SimConfig | None = None,
        extra_routes: int = 0,
        limits: dict[str, Any] | None = None,
        reconcile_seconds: float = 2.0,
        extra_env: dict[str, str] | None = None,
        upstream_key: str | None = None,
    ) -> None:
        """`upstream_key`: the routes' credential (through `api_key_env`), else none."""
        self.tmp = tmp
        self.temporal_address = temporal_address
        self.cap = cap
        self.sim = SimServer(sim or SimConfig(model_names=[], latency_ms=5))
        self.suffix = secrets.token_hex(4)
        self.route_id = f"sim-{self.suffix}"
        self.routes = [self.route_id] + [f"sim{i}-{self.suffix}" for i in range(extra_routes)]
        self.task_queue = f"tq-{self.suffix}"
        self.api_port = free_port()
        self.limits = limits or {}
        self.reconcile_seconds = reconcile_seconds
        self.extra_env = dict(extra_env or {})
        self.upstream_key_env = (
            f"BACKFILL_TEST_UPSTREAM_KEY_{self.suffix}" if upstream_key else None
        )
        if upstream_key and self.upstream_key_env:
            self.extra_env[self.upstream_key_env] = upstream_key
        self.workers: list[Child] = []
        self.api = Child("api")
        self.config_path = tmp / "backfill.toml"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def env(self) -> dict[str, str | None]:
        return {
            "BACKFILL_CONFIG": str(self.config_path),
            "TEMPORAL_ADDRESS": self.temporal_address,
            "BACKFILL_TASK_QUEUE": self.task_queue,
            "BACKFILL_API_PORT": str(self.api_port),
            "BACKFILL_DATA_DIR": str(self.tmp / "data"),
            "BACKFILL_LOG_LEVEL": "WARNING",
            "BACKFILL_SCHEDULER_RECONCILE_SECONDS": str(self.reconcile_seconds),
            # No retention Schedule per test stack on the shared server (test_retention's own).
            "BACKFILL_CLEANUP_INTERVAL_SECONDS": "0",
            **self.extra_env,
        }

    def _write_config(self) -> None:
        lines = ["[limits]"] + [f"{k} = {v!r}" for k, v in self.limits.items()]
        lines += ["[[models]]", 'id = "demo"']
        for route in self.routes:
            lines += [
                "[[models.routes]]",
                f'id = "{route}"',
                f'base_url = "{self.sim.base_url}"',
                f"max_concurrent_lines = {self.cap}",
            ]
            if self.upstream_key_env:
                lines.append(f'api_key_env = "{self.upstream_key_env}"')
        for key, (ws, role) in KEYS.items():
            lines += ["[[api_keys]]", f'sha256 = "{hash_key(key)}"', f'workspace = "{ws}"']
            lines += [f'role = "{role}"', f'name = "{ws}-key"']
        self.config_path.write_text("\n".join(lines) + "\n")

    async def start(self, workers: int = 1) -> Stack:
        await self.sim.start()
        self._write_config()
        for _ in range(workers):
            self.start_worker()
        self.api.start(backfill_argv("api"), self.env(), self.tmp / "api.log")
        await self.wait_healthy()
        return self

    @contextlib.asynccontextmanager
    async def running(self, workers: int = 1) -> AsyncIterator[Stack]:
        """Started for the body of the `with`, stopped after it (also on failure)."""
        try:
            yield await self.start(workers)
        finally:
            await self.stop()

    def start_worker(self) -> Child:
        child = Child(f"worker{len(self.workers)}")
        child.start(backfill_argv("worker"), self.env(), self.tmp / f"{child.name}.log")
        self.workers.append(child)
        return child

    async def wait_healthy(self, within: float = 60, *, temporal: bool = True) -> None:
        """Until /healthz answers, and (unless `temporal` is False) says Temporal is connected."""
        deadline = time.monotonic() + within
        async with httpx.AsyncClient() as http:
            while time.monotonic() < deadline:
                if not self.api.running:
                    raise RuntimeError(f"api exited: {self._log('api')}")
                try:
                    resp = await http.get(f"{self.api_url}/healthz")
                    if resp.status_code == 200 and (not temporal or resp.json()["status"] == "ok"):
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.2)
        raise TimeoutError("api never became healthy")

    def _log(self, name: str) -> str:
        path = self.tmp / f"{name}.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def client(self, key: str = API_KEY) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(api_key=key, base_url=f"{self.api_url}/v1", max_retries=0)

    async def stop(self) -> None:
        for child in [self.api, *self.workers]:
            await asyncio.to_thread(child.stop)
        await self.sim.stop()


async def submit(stack: Stack, n: int, *, key: str = API_KEY, prefix: str = "req") -> str:
    """Upload an n-line chat file and create a 24h batch; returns the batch id."""
    client = stack.client(key)
    f = await client.files.create(file=("in.jsonl", jsonl(n, prefix=prefix)), purpose="batch")
    batch = await client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id


async def output_ids(
    client: openai.AsyncOpenAI, batch: Any
) -> tuple[list[str], list[dict[str, Any]]]:
    """custom_ids of the output file, and the error file's records."""
    import json

    ids: list[str] = []
    errors: list[dict[str, Any]] = []
    if batch.output_file_id:
        text = (await client.files.content(batch.output_file_id)).text
        ids = [json.loads(line)["custom_id"] for line in text.splitlines()]
    if batch.error_file_id:
        text = (await client.files.content(batch.error_file_id)).text
        errors = [json.loads(line) for line in text.splitlines()]
    return ids, errors


def jsonl(n: int, *, prefix: str = "req", model: str = "demo", **body: Any) -> bytes:
    import json

    out = []
    for i in range(n):
        out.append(
            json.dumps(
                {
                    "custom_id": f"{prefix}-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": model,
                        "messages": [{"role": "user", "content": f"hello {i}"}],
                        **body,
                    },
                }
            )
        )
    return ("\n".join(out) + "\n").encode()


async def wait_terminal(client: openai.AsyncOpenAI, batch_id: str, within: float = 300) -> Any:
    deadline = time.monotonic() + within
    while True:
        batch = await client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            return batch
        if time.monotonic() > deadline:
            raise TimeoutError(f"batch {batch_id} still {batch.status}: {batch}")
        await asyncio.sleep(0.25)


def auth(key: str = API_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def assert_error(
    resp: httpx.Response,
    status: int,
    *,
    param: str | None = None,
    code: str | None = None,
    type_: str = "invalid_request_error",
) -> dict[str, Any]:
    """The response is OpenAI's error envelope with exactly these status, param and code."""
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert err["type"] == type_, err
    assert err["param"] == param, err
    assert err["code"] == code, err
    return err  # type: ignore[no-any-return]
