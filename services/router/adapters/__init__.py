"""Outbound clients of the router: the capacity watch and the workers' KV-event feeds."""
