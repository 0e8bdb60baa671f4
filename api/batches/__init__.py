"""The OpenAI Batches API and its extensions: creating and reading batches, partial results,
retries, the ETA and the estimate at submit."""
