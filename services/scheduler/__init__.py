"""Scheduler service: the program table, control bands, admission, pause and resume."""

from services.scheduler.native import select as _select_core

# Before anything imports the core: its compiled modules load only when they match their sources.
_select_core()
