"""What the console's batch and job pages share: a list page (the workspace a session may see,
the filters, one page and the links to the next), and a control (pause, resume, cancel) that
checks the form's CSRF token, calls the JSON API's own function and goes back to the object's
page saying what was done.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, Literal

from fastapi import Depends, Query, Request
from fastapi.responses import RedirectResponse, Response

from api.console.sessions import Session
from api.console.web import checked_form, render
from backfill.platform.config import Settings

Action = Literal["pause", "resume", "cancel"]


class ListQuery:
    """A list page's query parameters that every list has (its own status filter aside)."""

    def __init__(
        self,
        model: str = "",
        workspace: str = "",
        after: str | None = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
    ) -> None:
        self.model, self.workspace, self.after, self.limit = model, workspace, after, limit

    def workspace_for(self, session: Session) -> str | None:
        """The workspace filter a session gets: a member sees its own workspace only, whatever
        the query says; an admin or auditor the one asked for (None: every one)."""
        identity = session.identity
        return (self.workspace or None) if identity.can_see(None) else identity.workspace


ListQueryDep = Annotated[ListQuery, Depends()]


def render_list(
    request: Request,
    template: str,
    session: Session,
    settings: Settings,
    query: ListQuery,
    *,
    rows: Sequence[Any],
    has_more: bool,
    last_id: str | None,
    own: dict[str, str],
    **context: Any,
) -> Response:
    """A list page: its rows, the filters as the form and the paging links show them (the list's
    `own` first, then model, workspace, limit: the `paging` macro builds each link's query from
    them, in order), the models to filter by."""
    ws = query.workspace_for(session)
    return render(
        request,
        template,
        session,
        rows=rows,
        has_more=has_more,
        next_after=last_id,
        first_page=query.after is None,
        filters={**own, "model": query.model, "workspace": ws or "", "limit": query.limit},
        models=[m.id for m in settings.models],
        **context,
    )


async def control(
    request: Request,
    session: Session,
    page: str,
    action: Action,
    do: Callable[[], Awaitable[Any]],
) -> RedirectResponse:
    """Apply a control from a page's form: the CSRF check, then `do` (the JSON API's function,
    which checks the role), then back to `page` (its path under /console) saying it was done."""
    await checked_form(request, session)
    await do()
    return RedirectResponse(f"/console/{page}?done={action}", status_code=303)
