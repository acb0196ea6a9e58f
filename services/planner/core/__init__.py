"""The planner's pure core: observations in, a decision out. No grpc, no asyncio, no I/O, no clock reads."""
