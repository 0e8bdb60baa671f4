"""The tools: the `backfill` command (`cli`), the dev runner (`dev`), the client CLI (`client`)
and the vLLM-like simulator (`sim`).

The top layer (docs/architecture.md, `.importlinter`): a tool may import the api, the worker and
everything below them; nothing below imports a tool. The command's entry point names this
package's module (`backfill = "tools.cli:main"` in pyproject.toml).
"""
