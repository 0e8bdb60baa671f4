"""A route: its batch-scheduling settings, its gates (`gates/`), why its lines wait, its status,
which route serves a line, and reaching its scheduler from any process."""
