"""The router: OpenAI/SGLang HTTP and gRPC in, KV-aware worker selection, tokens out.

`core/` holds the pure selection logic (block hashing, the soft prefix index, active-load
tracking, the cost model and the pick); the async shell is built on `core.kv_router.KvRouterCore`:
`ingress/` (the HTTP and gRPC edges), `turn/` (one turn, admit to complete), `workers/` (the workers in
rotation), `observe/` (metrics, tracer, log redaction), `adapters/` (outbound clients), and `server.py`, the
composition root.
"""
