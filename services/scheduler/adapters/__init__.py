"""Protobuf <-> domain conversion, input validation, and the state stores. Protobuf stops here (the capacity
watch client is services/common/outbound/capacity_watch.py; its snapshots are converted by
`proto.capacity_from_proto`)."""
