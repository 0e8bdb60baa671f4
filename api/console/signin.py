"""Sign-in with an API key, and sign-out.

The key is read from the form's body once, checked like a Bearer header (`Settings.key_for`,
the same `Identity` as `api.deps.get_identity` builds) and then forgotten: the session keeps the
identity only. Nothing here logs the key.
"""

from __future__ import annotations

import secrets
import time

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from api.console.sessions import SessionsFull
from api.console.web import (
    COOKIE_PATH,
    SESSION_COOKIE,
    SIGNIN_COOKIE,
    SessionDep,
    checked_form,
    current_session,
    render,
    router,
    state,
)
from api.deps import Identity, get_settings, identity_of
from api.errors import Forbidden


def _secure(request: Request) -> bool:
    return request.url.scheme == "https"


@router.get("", response_model=None)
async def console_home(request: Request) -> Response:
    return RedirectResponse("/console/batches", status_code=303)


@router.get("/sign-in", response_model=None)
async def sign_in_form(request: Request) -> Response:
    if current_session(request) is not None:
        return RedirectResponse("/console/batches", status_code=303)
    return _form(request, error=None, status_code=200)


def _form(request: Request, error: str | None, status_code: int) -> Response:
    token = secrets.token_urlsafe(32)
    resp = render(request, "sign_in.html", None, status_code, signin_token=token, error=error)
    resp.set_cookie(
        SIGNIN_COOKIE,
        token,
        max_age=3600,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )
    return resp


@router.post("/sign-in", response_model=None)
async def sign_in(request: Request) -> Response:
    form = await request.form()
    token, cookie = form.get("csrf_token"), request.cookies.get(SIGNIN_COOKIE)
    if not (
        isinstance(token, str)
        and cookie
        and secrets.compare_digest(token.encode(), cookie.encode())
    ):
        raise Forbidden("The sign-in form's CSRF token is missing or wrong: reload the page.")
    key = form.get("api_key")
    found = get_settings(request).key_for(key.strip()) if isinstance(key, str) and key else None
    if found is None:
        return _form(request, error="Incorrect API key.", status_code=401)
    identity: Identity = identity_of(found)
    try:
        session = state(request).sessions.create(identity, time.time())
    except SessionsFull:
        error = "Too many people are signed in right now: try again later."
        return _form(request, error=error, status_code=503)
    resp = RedirectResponse("/console/batches", status_code=303)
    resp.set_cookie(
        SESSION_COOKIE,
        session.id,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=_secure(request),
    )
    resp.delete_cookie(SIGNIN_COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
    return resp


@router.post("/sign-out", response_model=None)
async def sign_out(request: Request, session: SessionDep) -> Response:
    await checked_form(request, session)
    state(request).sessions.drop(session.id)
    resp = RedirectResponse("/console/sign-in", status_code=303)
    resp.delete_cookie(SESSION_COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
    return resp
