"""Property (issue 53): whatever a client sends as a listing's `after` cursor (NUL, control
characters, the neighbours of the surrogates, characters outside the Basic Multilingual Plane,
quotes, very long values, ids of another kind), every listing answers 200 or a 400 naming
`param: after`, never a 5xx: a cursor is checked against the ids the api issues before it
reaches a visibility query or the store, and a Temporal refusal is never read as an outage
(a client that retries 503s would retry a request that can never succeed)."""

from __future__ import annotations

import asyncio

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.e2e.stack import Stack, jsonl, submit

EXAMPLES = 120
"""Requests sent, over every listing: a few seconds on the shared stack."""

LISTINGS = [
    ("/v1/files", "sk-test-alpha"),
    ("/v1/files", "sk-test-admin"),  # an admin lists every workspace's files
    ("/v1/batches", "sk-test-alpha"),
    ("/gateway/v1/batches", "sk-test-alpha"),
    ("/api/v1/admin/batches", "sk-test-admin"),
    ("/api/v1/admin/files", "sk-test-admin"),
    ("/gateway/ui-api/batches", "sk-test-admin"),
    ("/v1/batches/{batch}/results", "sk-test-alpha"),
]
ODD = [
    "\x00", "\x1f", "\x7f", "\x9a", "\u00b2", "\ud7ff", "\ue000", "\ufffd", "\uffff",
    "\U00010000", "\U0004e002", "\U0010ffff", "'", "\\", "%", " ", "\n", "/", "..", ".",
]  # fmt: skip
"""Characters a cursor may not hold, and their neighbours (no lone surrogate: no URL can
carry one)."""
no_surrogates = st.characters(exclude_categories=["Cs"])


def cursors(ids: list[str]) -> st.SearchStrategy[str]:
    """Arbitrary text; the odd characters mixed into ids and prefixes; very long values; and
    valid ids of every kind (a file id as a batch cursor, a results cursor as an id...)."""
    odd = st.sampled_from(ODD)
    return st.one_of(
        st.text(no_surrogates, max_size=30),
        st.lists(odd | st.sampled_from(ids) | st.sampled_from(["batch_", "file-", "0.0"]),
                 min_size=1, max_size=6).map("".join),
        st.text(no_surrogates, min_size=300, max_size=600),
        st.integers(1, 4000).map(lambda n: "batch_" + "a" * n),
        st.sampled_from(ids),
    )  # fmt: skip


async def test_every_listing_answers_any_cursor_with_200_or_a_400_naming_after(
    shared_stack: Stack,
) -> None:
    stack = shared_stack
    batch_id = await submit(stack, 2)
    theirs = await submit(stack, 1, key="sk-test-beta")
    file_id = (await stack.client().files.create(file=("in.jsonl", jsonl(1)), purpose="batch")).id
    ids = [batch_id, theirs, file_id, "1.0", "0.0", stack.route_id, "file-" + "0" * 24]

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(listing=st.sampled_from(LISTINGS), after=cursors(ids))
    def probe(listing: tuple[str, str], after: str) -> None:
        path, key = listing
        with httpx.Client(base_url=stack.api_url, timeout=30) as http:
            resp = http.get(
                path.format(batch=batch_id), params={"after": after}, headers=stack.auth(key)
            )
        where = f"GET {path}?after={after[:60]!r} → {resp.status_code}: {resp.text[:300]}"
        assert resp.status_code in (200, 400), where
        if resp.status_code == 400:
            err = resp.json()["error"]
            assert err["param"] == "after" and err["type"] == "invalid_request_error", where

    await asyncio.to_thread(probe)


FILTERED = ["/api/v1/admin/batches", "/gateway/ui-api/batches"]
"""The listings whose `workspace` and `model` go into a visibility query."""


async def test_an_admin_listings_filters_answer_200_or_a_400_naming_the_filter(
    shared_stack: Stack,
) -> None:
    stack = shared_stack
    await submit(stack, 1)
    values = st.text(no_surrogates, max_size=30) | st.lists(
        st.sampled_from(ODD) | st.sampled_from([stack.workspaces["alpha"], "demo"]), min_size=1
    ).map("".join)

    @settings(max_examples=EXAMPLES // 3, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        path=st.sampled_from(FILTERED), name=st.sampled_from(["workspace", "model"]), value=values
    )
    def probe(path: str, name: str, value: str) -> None:
        with httpx.Client(base_url=stack.api_url, timeout=30) as http:
            resp = http.get(path, params={name: value}, headers=stack.auth("sk-test-admin"))
        where = f"GET {path}?{name}={value[:60]!r} → {resp.status_code}: {resp.text[:300]}"
        assert resp.status_code in (200, 400), where
        if resp.status_code == 400:
            assert resp.json()["error"]["param"] == name, where

    await asyncio.to_thread(probe)
