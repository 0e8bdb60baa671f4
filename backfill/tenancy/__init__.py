"""Workspaces and their keys: new API keys, admission of batches per workspace, and each workspace's
share of a process's byte budgets."""
