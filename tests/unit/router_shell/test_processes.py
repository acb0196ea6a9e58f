"""`--processes N`: the flag's rule, each child's flags, the held ports and the merged metrics."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.common.serve.ports import PortInUse
from services.common.settings.errors import ConfigError
from services.router.config import load_config
from services.router.processes import PROCESS_LABEL, child_args, hold_port, merge_expositions


@pytest.mark.parametrize("value", ["0", "-1", "65"])
def test_processes_out_of_range_is_refused_naming_the_rule(value):
    with pytest.raises(ConfigError) as err:
        load_config(["--processes", value], {})
    assert err.value.field == "processes" and "1 <= processes <= 64" in str(err.value)


def test_processes_default_to_one_and_come_from_the_environment():
    assert load_config([], {}).processes == 1 and not load_config([], {}).reuse_port
    assert load_config([], {"BANDMASTER_ROUTER_PROCESSES": "3"}).processes == 3


def test_a_childs_flags_are_the_parents_with_one_process_the_shared_ports_and_its_own_ready_file():
    parent = ["--processes", "2", "--listen", "0.0.0.0:0", "--http-port", "0", "--metrics-port", "9103", "--seed", "4"]
    parent.append("--insecure")  # the bind rule: 0.0.0.0 needs --secure or --insecure
    config = load_config(
        child_args(parent, "0.0.0.0", 5001, 8001, True, "/tmp/r0.json"), {"BANDMASTER_ROUTER_PROCESSES": "2"}
    )
    assert (config.processes, config.reuse_port, config.listen, config.http_port) == (1, True, "0.0.0.0:5001", 8001)
    assert (config.metrics_port, config.ready_file, config.seed) == (0, "/tmp/r0.json", 4)
    assert config.security.metrics_loopback  # only the parent scrapes a child's metrics
    assert load_config(child_args([], "::1", 5001, 8001, False, "r"), {}).listen == "[::1]:5001"
    assert load_config(child_args([], "127.0.0.1", 5001, 8001, False, "r"), {}).metrics_port == -1


def test_a_held_port_is_chosen_once_and_shared_only_with_reuseport_sockets():
    held = hold_port("127.0.0.1", 0, "router HTTP", "--http-port")
    try:
        port = held.getsockname()[1]
        assert port > 0
        sharer = socket.socket()
        sharer.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sharer.bind(("127.0.0.1", port))  # a child binds the same port
        sharer.listen()
        sharer.close()
        with pytest.raises(OSError):
            socket.socket().bind(("127.0.0.1", port))  # anyone else does not
    finally:
        held.close()


def test_a_taken_port_is_port_in_use_naming_the_flag():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(PortInUse) as err:
            hold_port("127.0.0.1", port, "router HTTP", "--http-port")
    assert "--http-port" in str(err.value) and str(port) in str(err.value)


def _exposition(fail_open: int, lag: float) -> str:
    registry = CollectorRegistry()
    Counter("bandmaster_router_scheduler_fail_open", "h", ["reason"], registry=registry).labels("no_answer").inc(
        fail_open
    )
    Histogram("bandmaster_event_loop_lag_seconds", "h", buckets=(0.1, 1.0), registry=registry).observe(lag)
    return generate_latest(registry).decode()


def test_merged_metrics_label_every_sample_with_its_process_and_say_which_answered():
    text = merge_expositions([_exposition(2, 0.05), None, _exposition(3, 0.5)]).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    up = {labels[0][1]: v for (name, labels), v in samples.items() if name == "bandmaster_router_process_up"}
    assert up == {"0": 1.0, "1": 0.0, "2": 1.0}
    fail_open = {
        dict(labels)[PROCESS_LABEL]: v
        for (name, labels), v in samples.items()
        if name == "bandmaster_router_scheduler_fail_open_total"
    }
    assert fail_open == {"0": 2.0, "2": 3.0}
    assert samples[("bandmaster_event_loop_lag_seconds_bucket", (("le", "0.1"), (PROCESS_LABEL, "2")))] == 0.0
    assert samples[("bandmaster_event_loop_lag_seconds_bucket", (("le", "0.1"), (PROCESS_LABEL, "0")))] == 1.0
    assert text.count("# TYPE bandmaster_event_loop_lag_seconds histogram") == 1
