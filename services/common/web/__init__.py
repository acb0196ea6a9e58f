"""The HTTP edges: OpenAI-style error bodies, bounded JSON bodies, the session headers."""
