"""bench/config_flags.py: the long benchmarks' one flag per config field (soak, chaos, router_memory)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from bench.config_flags import add_config_flags, config_from_args
from services.common.settings.config import require
from services.common.settings.errors import ConfigError


@dataclass(frozen=True)
class Run:
    duration_s: float = 600.0
    programs: int = 256
    trace: bool = False
    only: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        require(self.programs >= 1, "programs", self.programs, "programs >= 1")


FULL, QUICK = Run(), Run(duration_s=20.0, programs=8)
FLAGS = (("duration_s", float), ("programs", int), ("trace", bool))


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    add_config_flags(parser, FLAGS, FULL, QUICK)
    return parser.parse_args(argv)


def test_unset_flags_keep_the_full_or_quick_values_and_set_ones_override():
    assert config_from_args(_parse(), FLAGS, FULL, QUICK) == FULL
    assert config_from_args(_parse("--quick"), FLAGS, FULL, QUICK) == QUICK
    got = config_from_args(_parse("--quick", "--duration-s", "5", "--trace"), FLAGS, FULL, QUICK, only=("x",))
    assert got == Run(duration_s=5.0, programs=8, trace=True, only=("x",))


def test_a_bad_value_is_the_configs_own_error_and_a_bad_type_is_argparses():
    with pytest.raises(ConfigError, match="programs >= 1"):
        config_from_args(_parse("--programs", "0"), FLAGS, FULL, QUICK)
    with pytest.raises(SystemExit):
        _parse("--programs", "many")


def test_the_help_names_both_defaults(capsys):
    with pytest.raises(SystemExit):
        _parse("--help")
    assert "default 600.0 (--quick: 20.0)" in capsys.readouterr().out


@pytest.mark.parametrize("module", ["bench.soak", "bench.chaos", "bench.router_memory"])
def test_every_long_benchmark_refuses_a_bad_config_with_exit_2(module, tmp_path, capsys):
    import importlib

    main = importlib.import_module(module).main
    assert main(["--quick", "--programs", "0", "--out", str(tmp_path / "r.json")]) == 2
    assert "programs" in capsys.readouterr().err
