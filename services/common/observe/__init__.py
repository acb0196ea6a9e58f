"""What a process tells about itself: OpenTelemetry set-up and span export, logging, loop lag, process metrics."""
