"""A port that is already taken: every `python -m services.X` says so in one line naming the port and
the flag that moves it (exit 1), never with a traceback."""

import pytest

from tests.support.processes import run_module

pytestmark = pytest.mark.integration


CASES = [
    ("capacity", ["--listen", "127.0.0.1:{port}", "--metrics-port", "0"], "capacity gRPC", "--listen"),
    ("capacity", ["--listen", "127.0.0.1:0", "--metrics-port", "{port}"], "capacity /metrics", "--metrics-port"),
    (
        "scheduler",
        [
            "--listen",
            "127.0.0.1:{port}",
            "--metrics-port",
            "0",
            "--capacity-addr",
            "127.0.0.1:9",
            "--state-path",
            "none",
        ],
        "scheduler gRPC",
        "--listen",
    ),
    (
        "router",
        [
            "--listen",
            "127.0.0.1:0",
            "--metrics-port",
            "0",
            "--no-scheduler",
            "--capacity-addr",
            "127.0.0.1:9",
            "--http-port",
            "{port}",
        ],
        "router HTTP",
        "--http-port",
    ),
    (
        "router",
        [
            "--listen",
            "127.0.0.1:{port}",
            "--metrics-port",
            "0",
            "--no-scheduler",
            "--capacity-addr",
            "127.0.0.1:9",
            "--http-port",
            "0",
        ],
        "router gRPC",
        "--listen",
    ),
    (
        "router",
        [
            "--processes",
            "2",
            "--listen",
            "127.0.0.1:0",
            "--metrics-port",
            "0",
            "--no-scheduler",
            "--capacity-addr",
            "127.0.0.1:9",
            "--http-port",
            "{port}",
        ],
        "router HTTP",
        "--http-port",
    ),
    (
        "batch",
        [
            "--listen",
            "127.0.0.1:0",
            "--metrics-port",
            "0",
            "--http-listen",
            "127.0.0.1:{port}",
            "--registry-path",
            "{tmp}/batch.sqlite3",
            "--planner",
            "127.0.0.1:9",
            "--dispatch-url",
            "http://127.0.0.1:9",
        ],
        "batch service Batch API HTTP",
        "--http-listen",
    ),
    ("simworker", ["--host", "127.0.0.1", "--port", "{port}"], "simworker HTTP", "--port"),
]


@pytest.mark.parametrize("service, argv, what, flag", CASES, ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_a_taken_port_is_one_line_naming_it_and_its_flag(taken_port, tmp_path, service, argv, what, flag):
    args = [a.format(port=taken_port, tmp=tmp_path) for a in argv]
    result = run_module(f"services.{service}", *args, cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "Failed to bind" not in result.stderr, result.stderr
    expected = f"{service}: port {taken_port} ({what}) on 127.0.0.1 is already in use; choose another with {flag}"
    assert result.stderr.strip().splitlines()[-1] == expected, result.stderr
