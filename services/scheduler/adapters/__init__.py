"""Protobuf <-> domain conversion, input validation, and the capacity follower. Protobuf stops here."""
