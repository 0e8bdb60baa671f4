"""A batch line's activity: its attempt, its send, its answer and record, its streamed rebuild."""
