"""Webhooks as OpenAI sends them: events, ids, signatures, endpoints, and reading a workspace's
endpoints."""
