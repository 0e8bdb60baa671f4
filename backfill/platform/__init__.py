"""What every feature stands on: settings, the workflows' contracts (`messages`) and references
(`refs`), ids, strict JSON, logs, metrics, traces, the Temporal client and the background loop."""
