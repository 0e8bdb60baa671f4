"""The server a command talks to: the `openai` SDK for the OpenAI API, httpx for backfill's
extensions (pause, resume, partial results). The key is sent, never printed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"


class CommandError(Exception):
    """A command cannot go on; `exit_code` 2 for what the user asked (a 4xx, a refusal), 1 for
    what went wrong elsewhere (unreachable, a 5xx)."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


@dataclass
class Connection:
    base_url: str
    api_key: str
    _openai: openai.OpenAI | None = field(default=None, repr=False)
    _http: httpx.Client | None = field(default=None, repr=False)

    @property
    def openai(self) -> openai.OpenAI:
        if self._openai is None:
            self._openai = openai.OpenAI(base_url=self.base_url, api_key=self.api_key)
        return self._openai

    @property
    def http(self) -> httpx.Client:
        if self._http is None:
            self._http = httpx.Client(
                base_url=self.base_url.rstrip("/"),
                headers={"Authorization": f"Bearer {self.api_key}"},
                timeout=60.0,
            )
        return self._http

    def extension(self, method: str, path: str, **params: Any) -> dict[str, Any]:
        """A backfill extension endpoint (`path` under the base URL), its JSON answer."""
        return _json(self._extension_response(method, path, params))

    def extension_bytes(self, method: str, path: str, **params: Any) -> bytes:
        """A backfill extension endpoint's answer as the server sent it, not decoded: for what
        must be kept byte for byte (result records)."""
        return self._extension_response(method, path, params).content

    def _extension_response(self, method: str, path: str, params: dict[str, Any]) -> httpx.Response:
        try:
            resp = self.http.request(method, path, params=params or None)
        except httpx.HTTPError as err:
            raise CommandError(f"Cannot reach {self.base_url}: {err}", 1) from None
        hint = no_such_path(str(resp.request.url), resp.status_code, _message(_json(resp), ""))
        if hint is not None:
            raise CommandError(hint, 2)
        if resp.status_code == 404 and "error" not in _json(resp):
            raise CommandError(
                f"{self.base_url} has no {path.split('/')[-1]} endpoint: is it a backfill?", 2
            )
        if resp.status_code >= 400:
            raise CommandError(_message(_json(resp), resp.text), 2 if resp.status_code < 500 else 1)
        return resp

    def close(self) -> None:
        if self._openai is not None:
            self._openai.close()
        if self._http is not None:
            self._http.close()


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _message(body: dict[str, Any], fallback: str) -> str:
    err = body.get("error")
    if isinstance(err, dict) and isinstance(err.get("message"), str):
        return str(err["message"])
    return fallback[:500]


def no_such_path(url: str, status: int, message: str) -> str | None:
    """What to say for a 404 on a path the server does not have (its message a bare "Not
    Found", not a missing object's) when the URL is not under /v1: the base URL lacks it."""
    path = httpx.URL(url).path
    if status != 404 or message.strip() not in ("Not Found", "") or "/v1/" in path + "/":
        return None
    cut = min((i for i in (path.find("/files"), path.find("/batches")) if i >= 0), default=0)
    base = url[: len(url) - len(path)] + path[:cut].rstrip("/")
    return (
        f"{url} answered 404 Not Found: the base URL must be the server's /v1 URL. "
        f"Set OPENAI_BASE_URL (or --base-url) to {base}/v1"
    )


def api_error(err: openai.OpenAIError) -> CommandError:
    """The SDK's error as the message the server sent."""
    if isinstance(err, openai.APIStatusError):
        body = err.body if isinstance(err.body, dict) else {}
        message = _message({"error": body} if "message" in body else body, str(err))
        url = str(err.response.request.url)
        message = no_such_path(url, err.status_code, message) or message
        return CommandError(message, 2 if err.status_code < 500 else 1)
    if isinstance(err, openai.APIConnectionError):
        return CommandError(f"Cannot reach the server: {err}", 1)
    return CommandError(str(err), 1)
