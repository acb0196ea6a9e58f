"""Pure KV-aware selection core of the router: no grpc, no asyncio, no I/O, no clock reads.

Entry point for the shell: `kv_router.KvRouterCore` (see docs/router-selection.md).
"""
