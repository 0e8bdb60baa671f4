"""Dependencies: the clients made once in the lifespan, and the caller's identity."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import httpx
from fastapi import Depends, Request
from temporalio.client import Client

from api.errors import Forbidden, Unauthorized
from backfill.files import Store
from backfill.platform import tracing
from backfill.platform.config import ApiKeyConfig, Role, Settings
from backfill.tenancy.byte_budget import ByteBudget


@dataclass(frozen=True)
class Identity:
    """Who is calling: never the key itself, only what it maps to."""

    workspace: str
    role: Role
    key_name: str
    key_id: str = ""
    allowed_models: frozenset[str] | None = None
    """The models this key may use (None: every model)."""

    def can_see(self, workspace: str | None) -> bool:
        """May read this workspace's batches and file metadata: its own, or any for a platform
        admin or an auditor. Whatever it may not see answers 404, never 403."""
        return self.role in ("platform_admin", "auditor") or workspace == self.workspace

    def can_use(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models

    def require_write(self) -> None:
        if self.role == "auditor":
            raise Forbidden("Auditor keys can read but not change anything.", code="read_only")

    def require_content(self) -> None:
        """File content (inputs, outputs) is never served to an auditor."""
        if self.role == "auditor":
            raise Forbidden(
                "Auditor keys can read metadata but not file content.", code="insufficient_role"
            )


def get_settings(request: Request) -> Settings:
    return request.app.state.settings  # type: ignore[no-any-return]


def get_client(request: Request) -> Client:
    """The Temporal client, or 503 `temporal_unavailable` while the api is not connected."""
    return request.app.state.temporal.client()  # type: ignore[no-any-return]


def get_store(request: Request) -> Store:
    return request.app.state.store  # type: ignore[no-any-return]


def get_http(request: Request) -> httpx.AsyncClient:
    return request.app.state.http  # type: ignore[no-any-return]


def get_buffers(request: Request) -> ByteBudget:
    """The process's buffer budget (request bodies, answers built whole: `api.buffers`)."""
    return request.app.state.buffers  # type: ignore[no-any-return]


def get_identity(
    request: Request, settings: Annotated[Settings, Depends(get_settings)]
) -> Identity:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise Unauthorized(
            "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
            code="invalid_api_key",
        )
    key = settings.key_for(token.strip())
    if key is None:
        raise Unauthorized("Incorrect API key provided.", code="invalid_api_key")
    tracing.annotate(workspace=key.workspace)
    return identity_of(key)


def identity_of(key: ApiKeyConfig) -> Identity:
    """What a configured key maps to (for a Bearer header, or the console's sign-in)."""
    return Identity(
        workspace=key.workspace,
        role=key.role,
        key_name=key.name or key.key_id,
        key_id=key.key_id,
        allowed_models=frozenset(key.models) if key.models is not None else None,
    )


def get_writer(identity: Annotated[Identity, Depends(get_identity)]) -> Identity:
    """The caller, who may change things: a dependency, so it is checked before the body."""
    identity.require_write()
    return identity


SettingsDep = Annotated[Settings, Depends(get_settings)]
ClientDep = Annotated[Client, Depends(get_client)]
StoreDep = Annotated[Store, Depends(get_store)]
BuffersDep = Annotated[ByteBudget, Depends(get_buffers)]
IdentityDep = Annotated[Identity, Depends(get_identity)]
WriterDep = Annotated[Identity, Depends(get_writer)]
