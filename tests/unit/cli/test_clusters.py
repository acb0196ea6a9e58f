"""Many clusters on one machine: the registry `bandmaster up` enters itself in, and how the client commands
choose the cluster they talk to (services/cli/endpoints.py)."""

import argparse
import json
import os
from pathlib import Path

import pytest

from services.cli import endpoints, main
from services.cli.status import Snapshot, render
from services.cli.up import removable_state
from services.common.settings.errors import ConfigError

GONE_PID = 999_999_999


def _entry(registry: Path, name: str, pid: int = 0, **fields) -> dict:
    """A registry entry as `bandmaster up` writes it (a live pid by default: this test's)."""
    record = {"pid": pid or os.getpid(), "name": name, "state_dir": f"/state/{name}", **fields}
    registry.mkdir(parents=True, exist_ok=True)
    (registry / f"{name}.json").write_text(json.dumps(record))
    return record


def test_the_registry_location_follows_the_environment():
    assert endpoints.clusters_dir({"BANDMASTER_CLUSTERS_DIR": "/x/c", "XDG_RUNTIME_DIR": "/run/u"}) == Path("/x/c")
    assert endpoints.clusters_dir({"XDG_RUNTIME_DIR": "/run/u", "HOME": "/h"}) == Path("/run/u/bandmaster/clusters")
    assert endpoints.clusters_dir({"HOME": "/h"}) == Path("/h/.bandmaster/clusters")


@pytest.mark.parametrize("name", ["a", "lab-2", "alice.exp_1", "A" * 63])
def test_a_cluster_name_is_a_plain_file_name(name):
    assert endpoints.check_name(name) == name


@pytest.mark.parametrize("name", ["", "-x", ".hidden", "../up", "a/b", "a b", "A" * 64])
def test_a_name_that_is_no_plain_file_name_is_refused(name):
    with pytest.raises(ConfigError, match="cluster name"):
        endpoints.check_name(name)


def test_clusters_without_a_name_take_default_then_default_2(tmp_path):
    other = os.getppid()  # a live process that is not this one: another `bandmaster up`
    assert endpoints.register(tmp_path, {"pid": other, "state_dir": "/a"}) == "default"
    assert endpoints.register(tmp_path, {"pid": os.getpid(), "state_dir": "/b"}) == "default-2"
    record = json.loads((tmp_path / "default-2.json").read_text())
    assert record == {"pid": os.getpid(), "state_dir": "/b", "name": "default-2"}
    assert not list(tmp_path.glob(".*.tmp")), "a temporary file was left behind"


def test_a_name_a_live_cluster_holds_is_not_taken_a_stale_one_is(tmp_path):
    _entry(tmp_path, "lab", pid=os.getppid())
    assert endpoints.register(tmp_path, {"pid": os.getpid(), "state_dir": "/s"}, "lab") == ""
    assert json.loads((tmp_path / "lab.json").read_text())["pid"] == os.getppid()
    _entry(tmp_path, "old", pid=GONE_PID)  # its `bandmaster up` was killed: the entry stayed
    assert endpoints.register(tmp_path, {"pid": os.getpid(), "state_dir": "/s"}, "old") == "old"
    assert json.loads((tmp_path / "old.json").read_text())["pid"] == os.getpid()


def test_an_entry_is_removed_only_by_its_own_cluster(tmp_path):
    _entry(tmp_path, "lab", pid=os.getppid())
    endpoints.unregister(tmp_path / "lab.json", os.getpid())
    assert (tmp_path / "lab.json").exists()
    endpoints.unregister(tmp_path / "lab.json", os.getppid())
    assert not (tmp_path / "lab.json").exists()


def test_running_clusters_skips_stale_and_broken_entries(tmp_path):
    _entry(tmp_path, "b")
    _entry(tmp_path, "a")
    _entry(tmp_path, "gone", pid=GONE_PID)
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "list.json").write_text("[1, 2]")
    assert [r["name"] for r in endpoints.running_clusters(tmp_path)] == ["a", "b"]
    assert endpoints.running_clusters(tmp_path / "missing") == []


def test_an_entry_whose_pid_now_names_another_process_is_stale(tmp_path):
    """A killed `bandmaster up` whose pid was given to an unrelated process since: the entry's start time
    tells them apart (a pid alone looked alive)."""
    started = endpoints.process_start(os.getpid())
    assert isinstance(started, int)
    _entry(tmp_path, "mine", pid=os.getpid(), pid_start=started)
    _entry(tmp_path, "reused", pid=os.getpid(), pid_start=started - 1)
    _entry(tmp_path, "older", pid=os.getpid())  # written before the start time was recorded: the pid decides
    assert [r["name"] for r in endpoints.running_clusters(tmp_path)] == ["mine", "older"]
    assert endpoints.register(tmp_path, {"pid": os.getppid(), "state_dir": "/s"}, "reused") == "reused"


def test_the_start_time_reads_proc_and_is_none_without_it(tmp_path):
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    fields = ["S", *[str(n) for n in range(4, 22)], "777", "0"]  # fields 3.. ; field 22 is 777
    (proc / "42" / "stat").write_text("42 (a (b) c) " + " ".join(fields))
    assert endpoints.process_start(42, proc) == 777
    assert endpoints.process_start(43, proc) is None


def test_choose_takes_the_named_cluster_or_the_only_one():
    a = {"name": "a", "state_dir": "/sa", "pid": 1}
    b = {"name": "b", "state_dir": "/sb", "pid": 2, "http_url": "http://127.0.0.1:8001"}
    assert endpoints.choose([], "") is None
    assert endpoints.choose([a], "") is a
    assert endpoints.choose([a, b], "b") is b


def test_choose_refuses_to_guess_between_several_and_lists_them():
    a = {"name": "a", "state_dir": "/sa", "pid": 1}
    b = {"name": "b", "state_dir": "/sb", "pid": 2, "http_url": "http://127.0.0.1:8001"}
    with pytest.raises(endpoints.ClusterNotFound) as refused:
        endpoints.choose([a, b], "")
    assert str(refused.value) == (
        "2 clusters are running; name one with --cluster NAME (or --state-dir DIR):\n"
        "  a  (state dir /sa, pid 1)\n"
        "  b  (state dir /sb, pid 2, http://127.0.0.1:8001)"
    )
    with pytest.raises(endpoints.ClusterNotFound, match=r"no running cluster is named 'c'; running:\n  a "):
        endpoints.choose([a, b], "c")
    with pytest.raises(endpoints.ClusterNotFound, match="no running cluster is named 'c'; running: none"):
        endpoints.choose([], "c")


def _args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"state_dir": None, "cluster": "", **given})


def test_discover_finds_the_only_cluster_unless_an_address_is_given(tmp_path):
    _entry(tmp_path, "lab", capacity="127.0.0.1:41001")
    env = {"BANDMASTER_CLUSTERS_DIR": str(tmp_path)}
    found = _args()
    endpoints.discover(found, "", env=env)
    assert found.state_dir == Path("/state/lab") and found.found.where == "cluster 'lab' (state dir /state/lab)"
    assert endpoints.grpc_address(found, "", "capacity") == "127.0.0.1:41001"
    given = _args()
    endpoints.discover(given, "10.0.0.1:50052", env=env)  # its certificates must not go to another server
    assert given.state_dir is None and given.found is None
    # Named, the cluster is used with an address flag too: the flag wins for its own service only.
    named = _args(cluster="lab")
    endpoints.discover(named, "10.0.0.1:50052", env=env)
    assert named.state_dir == Path("/state/lab")
    assert endpoints.grpc_address(named, "10.0.0.1:50052", "scheduler") == "10.0.0.1:50052"


def test_with_several_clusters_discover_refuses_and_cluster_picks_one(tmp_path):
    _entry(tmp_path, "a", scheduler="127.0.0.1:41002")
    _entry(tmp_path, "b", scheduler="127.0.0.1:42002")
    env = {"BANDMASTER_CLUSTERS_DIR": str(tmp_path)}
    with pytest.raises(endpoints.ClusterNotFound, match="2 clusters are running"):
        endpoints.discover(_args(), "", env=env)
    chosen = _args(cluster="b")
    endpoints.discover(chosen, "", env=env)
    assert endpoints.grpc_address(chosen, "", "scheduler") == "127.0.0.1:42002"


def test_a_service_the_cluster_does_not_run_is_absent_never_a_default_port(tmp_path):
    _entry(tmp_path, "lab", capacity="127.0.0.1:41001", scheduler="127.0.0.1:41002")
    args = _args()
    endpoints.discover(args, "", env={"BANDMASTER_CLUSTERS_DIR": str(tmp_path)})
    with pytest.raises(endpoints.ServiceAbsent) as absent:
        endpoints.grpc_address(args, "", "planner")
    assert str(absent.value) == "cluster 'lab' (state dir /state/lab) runs no planner (started with --no-planner)"
    assert endpoints.grpc_address(args, "", "batch", required=False) == ""
    with pytest.raises(endpoints.ServiceAbsent, match="runs no batch service"):
        raise args.found.absent("batch")


def test_no_cluster_running_means_the_documented_default_ports(tmp_path):
    args = _args()
    env = {"BANDMASTER_CLUSTERS_DIR": str(tmp_path / "none")}
    assert endpoints.discover(args, "", env=env) is None
    assert endpoints.grpc_address(args, "", "planner") == "127.0.0.1:50061"
    assert endpoints.where(args, env) == f"default ports (no cluster of yours runs: none in {tmp_path / 'none'})"


def test_a_state_dir_gives_its_ready_files_and_nothing_else(tmp_path):
    """A state dir whose `bandmaster up` is gone (or an older one): its ready files; a service with none is
    absent."""
    (tmp_path / "scheduler.ready.json").write_text('{"grpc": "127.0.0.1:41000"}')
    args = _args(state_dir=tmp_path)
    endpoints.discover(args, "", env={"BANDMASTER_CLUSTERS_DIR": str(tmp_path / "none")})
    assert endpoints.grpc_address(args, "10.0.0.1:1", "scheduler") == "10.0.0.1:1"
    assert endpoints.grpc_address(args, "", "scheduler") == "127.0.0.1:41000"
    with pytest.raises(endpoints.ServiceAbsent, match="holds no planner.ready.json"):
        endpoints.grpc_address(args, "", "planner")


def test_a_live_record_in_the_state_dir_wins_over_stale_ready_files(tmp_path):
    """A state dir used again with --no-planner keeps an earlier run's planner.ready.json: the live record
    says there is no planner."""
    (tmp_path / "planner.ready.json").write_text('{"grpc": "127.0.0.1:41061"}')
    (tmp_path / "cluster.json").write_text(json.dumps({"pid": os.getpid(), "name": "lab", "capacity": "c:1"}))
    args = _args(state_dir=tmp_path)
    endpoints.discover(args, "")
    with pytest.raises(endpoints.ServiceAbsent, match="cluster 'lab'"):
        endpoints.grpc_address(args, "", "planner")


def _main(argv: list[str], registry: Path, monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.setenv("BANDMASTER_CLUSTERS_DIR", str(registry))
    code = main(argv)
    return code, capsys.readouterr().err


def test_the_commands_refuse_to_guess_between_two_clusters(tmp_path, monkeypatch, capsys):
    _entry(tmp_path, "a")
    _entry(tmp_path, "b")
    for argv in (["programs"], ["plan"], ["status", "--once"], ["batch", "list"]):
        code, err = _main(argv, tmp_path, monkeypatch, capsys)
        assert code == 2, argv
        assert err.startswith(f"bandmaster {argv[0]}: 2 clusters are running; name one with --cluster NAME")
        assert "\n  a  (state dir /state/a" in err and "\n  b  (state dir /state/b" in err
    code, err = _main(["programs", "--cluster", "c"], tmp_path, monkeypatch, capsys)
    assert code == 2 and "no running cluster is named 'c'" in err


def test_the_commands_say_a_service_is_absent(tmp_path, monkeypatch, capsys):
    _entry(tmp_path, "lab", capacity="127.0.0.1:1", scheduler="127.0.0.1:2")
    code, err = _main(["plan", "--cluster", "lab"], tmp_path, monkeypatch, capsys)
    assert (code, err) == (
        1,
        "bandmaster plan: cluster 'lab' (state dir /state/lab) runs no planner (started with --no-planner)\n",
    )
    code, err = _main(["batch", "list"], tmp_path, monkeypatch, capsys)
    assert code == 1 and "runs no batch service" in err


def test_status_shows_an_absent_service_as_absent():
    text = render(Snapshot(absent={"planner": "none in this cluster (started with --no-planner)"}))
    assert "leases: none in this cluster (started with --no-planner)" in text
    text = render(Snapshot(absent={"scheduler": "none in this cluster (started with --no-scheduler)"}))
    assert "programs: none in this cluster (started with --no-scheduler)" in text
    assert "scheduler not answering" not in text


@pytest.mark.parametrize(
    ("state_dir", "keep", "traces", "removed"),
    [
        (None, False, None, True),  # a temporary state dir goes at a clean stop
        (None, True, None, False),  # --keep-state
        ("/mine", False, None, False),  # a --state-dir the user named is theirs
        (None, False, "inside", False),  # --trace-dir without DIR wrote into it
        (None, False, "/elsewhere", True),  # --trace-dir DIR: the traces are elsewhere
    ],
)
def test_which_state_dir_up_removes_at_a_clean_stop(tmp_path, state_dir, keep, traces, removed):
    trace_dir = tmp_path / "traces" if traces == "inside" else (Path(traces) if traces else None)
    args = argparse.Namespace(state_dir=state_dir, keep_state=keep)
    assert removable_state(args, tmp_path, trace_dir) is removed


def test_bandmaster_clusters_lists_the_running_ones(tmp_path, monkeypatch, capsys):
    _entry(tmp_path, "exp", http_url="http://127.0.0.1:41000", capacity="c:1", scheduler="s:1", router="r:1")
    _entry(tmp_path, "lab", capacity="c:2", scheduler="s:2", **{"scheduler-1": "s:3"}, planner="p:2", secure=True)
    _entry(tmp_path, "gone", pid=GONE_PID)
    monkeypatch.setenv("BANDMASTER_CLUSTERS_DIR", str(tmp_path))
    assert main(["clusters"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"clusters (2 running, registry {tmp_path})"
    assert lines[1].split() == ["name", "pid", "router", "HTTP", "services", "secure", "state", "dir"]
    assert lines[3].split() == [
        "exp",
        str(os.getpid()),
        "http://127.0.0.1:41000",
        "capacity",
        "scheduler",
        "router",
        "/state/exp",
    ]
    assert lines[4].split() == [
        "lab",
        str(os.getpid()),
        "-",
        "capacity",
        "scheduler",
        "x2",
        "planner",
        "yes",
        "/state/lab",
    ]
    assert len(lines) == 5  # the stale entry is not listed
    assert main(["clusters", "--json"]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["exp", "lab"]


def test_bandmaster_clusters_says_when_none_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BANDMASTER_CLUSTERS_DIR", str(tmp_path))
    assert main(["clusters"]) == 0
    assert capsys.readouterr().out == (f"no cluster is running (registry {tmp_path}); start one with `bandmaster up`\n")
