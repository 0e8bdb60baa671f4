"""Webhook endpoints and their delivery log, per workspace."""
