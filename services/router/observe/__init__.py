"""What the router tells about itself: its metrics, its lean tracer, credentials redacted from logs."""
