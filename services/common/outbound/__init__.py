"""Calling other Bandmaster services: the capacity watch, following the scheduler's leader, the retry policy, why a TLS
call failed."""
