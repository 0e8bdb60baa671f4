"""Single durable jobs: `/gateway/v1/batches`."""
