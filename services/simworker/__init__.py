"""simworker: a simulated SGLang server (HTTP API, KV memory, HiCache, continuous batching, timing)."""
