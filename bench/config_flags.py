"""The long benchmarks' command lines: one flag per field of their frozen config (`--steady-s` sets
`steady_s`), over the FULL run's values or, with `--quick`, the test suite's QUICK ones."""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any, Sequence, TypeVar

Config = TypeVar("Config")

Flags = Sequence[tuple[str, type]]
"""(field name, type) of each config field with a flag; `bool` fields are switches (on when given)."""


def add_config_flags(parser: argparse.ArgumentParser, flags: Flags, full: Any, quick: Any) -> None:
    """A flag per field, its help naming the FULL and QUICK values; unset, a flag keeps them."""
    for name, kind in flags:
        option = "--" + name.replace("_", "-")
        if kind is bool:
            parser.add_argument(option, action="store_const", const=True, default=None)
        else:
            help_text = f"default {getattr(full, name)} (--quick: {getattr(quick, name)})"
            parser.add_argument(option, type=kind, default=None, help=help_text)


def config_from_args(args: argparse.Namespace, flags: Flags, full: Config, quick: Config, **extra: Any) -> Config:
    """FULL's config (QUICK's with `--quick`) with every flag that was given, and `extra`; the config's
    own validation (a ConfigError naming the field) applies."""
    overrides = {name: getattr(args, name) for name, _ in flags if getattr(args, name) is not None}
    return replace(quick if args.quick else full, **overrides, **extra)  # type: ignore[type-var]
