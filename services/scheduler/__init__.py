"""Scheduler service: the program table, control bands, admission, pause and resume."""
