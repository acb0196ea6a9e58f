"""`--help` of every `bandmaster` command shows each option's default."""

from __future__ import annotations

import argparse

_FLAG_ACTIONS = ("store_true", "store_false", "help", "version", "count")


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's defaults formatter, minus the noise: nothing is added to a positional argument, to an
    on/off flag, or to a help text that already names its default; an empty default reads "none"."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or action.default is argparse.SUPPRESS or "default" in text.lower():
            return text
        if action.nargs == 0:  # a flag: its absence is the default
            return text
        if action.default is None or (isinstance(action.default, (str, list, tuple)) and not action.default):
            return text + " (default: none)"
        return text + " (default: %(default)s)"


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows defaults (subcommand parsers inherit the class); an option given
    without a help text still shows its default."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        if (
            kwargs.get("help") is None
            and args
            and str(args[0]).startswith("-")
            and kwargs.get("action") not in _FLAG_ACTIONS
        ):
            kwargs["help"] = "(default: %(default)s)" if kwargs.get("default") is not None else "(default: none)"
        return super().add_argument(*args, **kwargs)
