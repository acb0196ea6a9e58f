"""Child processes: starting one, stopping it with bounded waits, dying with the parent, the ready file."""
