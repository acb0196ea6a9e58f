"""The workers in rotation: the fleet view over capacity snapshots, circuit breakers, health probes."""
