"""Outbound clients of the router (the scheduler, the workers, the Batch API, the workers' KV-event feeds) and
its side of the capacity watch. Protobuf stops here."""
