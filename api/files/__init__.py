"""The OpenAI Files API: streamed uploads, listings, content, deletion."""
