"""Settings: flags and environment mapped onto config dataclasses, the one ConfigError, the shared KvRouter flags."""
