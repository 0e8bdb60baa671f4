"""Custom search attributes: how the api lists batches and how operators find them in the UI.

The dev server's SQLite visibility allows 10 Keyword attributes; we use few. The names and types
here are registered by `backfill dev` (``--search-attribute``) and must be registered on a
production namespace by the operator (docs/operator-guide.md).
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

WORKSPACE = SearchAttributeKey.for_keyword("BackfillWorkspace")
STATUS = SearchAttributeKey.for_keyword("BackfillStatus")
ENDPOINT = SearchAttributeKey.for_keyword("BackfillEndpoint")
MODELS = SearchAttributeKey.for_keyword_list("BackfillModels")
CREATED_AT = SearchAttributeKey.for_int("BackfillCreatedAt")
"""Unix seconds of the batch's creation; with the id, the listing order."""
RETRY_OF = SearchAttributeKey.for_keyword("BackfillRetryOf")
"""The batch a retry batch retries (its metadata `retry_of`, when that names a batch of the
same workspace): how the original finds its retries."""

ALL: dict[str, str] = {
    WORKSPACE.name: "Keyword",
    STATUS.name: "Keyword",
    ENDPOINT.name: "Keyword",
    MODELS.name: "KeywordList",
    CREATED_AT.name: "Int",
    RETRY_OF.name: "Keyword",
}
"""Name → type, as `temporal server start-dev --search-attribute NAME=TYPE` takes them."""


def quote(value: str) -> str:
    """`value` made safe inside a visibility query's single quotes (`... = '<value>'`)."""
    return value.replace("\\", "\\\\").replace("'", "\\'")
