"""Pieces every Bandmaster service shares, in folders named by their job: settings/, auth/, observe/, serve/,
process/, outbound/, web/, sglang/ (docs/architecture.md, "Code layout"); clock.py is the cores' injected clock."""
