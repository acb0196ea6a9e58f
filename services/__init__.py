"""Bandmaster services: capacity, scheduler, router, planner and the simulated worker."""
