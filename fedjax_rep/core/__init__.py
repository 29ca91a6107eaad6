"""The round engine: cohorts, per-client pytrees, the chunked scan loop."""
