"""Requests in: the public HTTP port and API (OpenAI, SGLang), the gRPC Router service, field rules."""
