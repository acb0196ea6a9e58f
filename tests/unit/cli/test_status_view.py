"""`bandmaster status`: the bar with its band edges, the band edges read from the scheduler's metrics, and
a view that shows what answered and says why the rest did not (pure rendering, no server)."""

import argparse

from bandmaster.capacity.v1 import capacity_pb2 as cpb
from bandmaster.planner.v1 import planner_pb2 as ppb
from bandmaster.scheduler.v1 import scheduler_pb2 as spb
from services.cli import status
from services.cli.status import Bands, Snapshot, bar, parse_bands, program_counts, render

BANDS = Bands(pause=0.95, soft_demote=0.80, resume=0.85, source="test")


def test_the_bar_fills_the_used_share_and_marks_the_band_edges():
    text = bar(0.5, BANDS, cells=20)
    assert text == "[##########......sr.P]"
    assert bar(0.0, BANDS, cells=20).count("#") == 0
    assert bar(1.3, BANDS, cells=20).endswith("]>")  # over budget
    assert bar(0.9, BANDS, cells=20)[1:19].count("#") == 16  # the marks sit on the filled part too


def test_band_edges_come_from_the_scheduler_series():
    text = "\n".join(
        [
            "# HELP bandmaster_scheduler_band_threshold_ratio edges",
            'bandmaster_scheduler_band_threshold_ratio{band="pause"} 1.0',
            'bandmaster_scheduler_band_threshold_ratio{band="soft_demote"} 0.95',
            'bandmaster_scheduler_band_threshold_ratio{band="resume"} 0.97',
            'bandmaster_scheduler_band_threshold_ratio{band="target"} 0.95',
        ]
    )
    assert parse_bands(text, "scheduler") == Bands(1.0, 0.95, 0.97, "scheduler")
    assert parse_bands("bandmaster_other 1\n", "scheduler") is None


def _full_snapshot() -> Snapshot:
    workers = cpb.WorkersSnapshot(
        total_retention_tokens=65536,
        workers=[
            cpb.Worker(
                worker_id="w0",
                url="http://127.0.0.1:30000",
                health=cpb.WORKER_HEALTH_HEALTHY,
                card=cpb.WorkerCard(model_name="m"),
                replicas=[cpb.Replica(worker_id="w0", retention_tokens=65536, gpu_kv_tokens=65536)],
            ),
            cpb.Worker(
                worker_id="w1",
                url="http://127.0.0.1:30001",
                health=cpb.WORKER_HEALTH_UNHEALTHY,
                excluded_reason="unhealthy: polls failing (last: connection)",
            ),
        ],
    )
    programs = spb.ListProgramsResponse(
        programs=[spb.Program(session_id="a", marked=True), spb.Program(session_id="b", soft_demoted=True)],
        replicas=[
            spb.ReplicaUtilization(
                worker_id="w0",
                dp_rank=0,
                retention_tokens=65536,
                used_decayed_tokens=58982,
                utilization=0.9,
                band=spb.BAND_SOFT_DEMOTE,
                active_programs=2,
            )
        ],
    )
    stats = spb.Stats(programs_active=1, programs_paused=1, programs_reasoning=1, pauses_total=3, resumes_total=2)
    plan = ppb.Plan(
        decision_id="d-1",
        action="apply",
        has_scale_to=True,
        scale_to=3,
        leases=[
            ppb.Lease(pool_id="default", max_admission_rps=4.5, decision_id="d-1", writer_epoch=1, writer_sequence=7)
        ],
    )
    return Snapshot(workers=workers, programs=programs, stats=stats, plan=plan, bands=BANDS, taken_at=1.0)


def test_the_view_shows_workers_bands_programs_and_leases():
    text = render(_full_snapshot())
    assert "workers (1 of 2 healthy, retention budget 65,536 tokens)" in text
    assert "(last: connection)" in text
    assert "soft-demote" in text and "90.0%" in text and "58,982/65,536" in text
    assert "r resume < 85%   s soft-demote >= 80%   P pause >= 95%" in text
    assert "marked (pause at the next tool call)      1" in text and "paused  " in text
    assert "4.5" in text and "scaled to 3" in text


def test_a_part_whose_service_does_not_answer_says_why_and_the_rest_is_shown():
    snapshot = _full_snapshot()
    snapshot.plan, snapshot.planner_error = None, "127.0.0.1:50061: UNAVAILABLE: connection refused"
    snapshot.workers, snapshot.workers_error = None, "127.0.0.1:50051: UNAVAILABLE: down"
    text = render(snapshot)
    assert "leases: planner not answering (127.0.0.1:50061: UNAVAILABLE: connection refused)" in text
    assert "workers: capacity service not answering" in text and "utilisation" in text
    assert snapshot.reachable
    assert not Snapshot().reachable


def test_no_healthy_worker_is_said_loudly():
    snapshot = _full_snapshot()
    del snapshot.workers.workers[0]
    assert "NO HEALTHY WORKER" in render(snapshot)


def test_a_degraded_worker_is_named_loudly_with_what_is_off_and_the_flag_to_add():
    snapshot = _full_snapshot()
    assert "DEGRADED" not in render(snapshot)
    snapshot.workers.workers[0].card.degraded.extend(
        [cpb.DEGRADATION_CACHE_REPORT_OFF, cpb.DEGRADATION_PRIORITY_SCHEDULING_OFF]
    )
    text = render(snapshot)
    assert "DEGRADED: 1 of 2 workers" in text
    assert "http://127.0.0.1:30000: cache reports off; restart it with --enable-cache-report" in text
    assert "http://127.0.0.1:30000: priority scheduling off; restart it with --enable-priority-scheduling" in text
    assert "cache reports off, priority scheduling off" in text  # the worker's row says so too
    assert status.degraded_banner(cpb.WorkersSnapshot()) == ""


def test_every_degradation_the_capacity_proto_declares_has_advice():
    declared = set(cpb.Degradation.values()) - {cpb.DEGRADATION_UNSPECIFIED}
    assert declared == set(status.DEGRADATION_ADVICE)
    for name, flag, loss in status.DEGRADATION_ADVICE.values():
        assert flag.startswith("--enable-") and name and loss


def test_the_live_view_refreshes_until_interrupted(monkeypatch):
    snapshots = iter([_full_snapshot(), _full_snapshot()])
    monkeypatch.setattr(status, "take_snapshot", lambda *a: next(snapshots))
    shown = []

    def sleep(_s):
        if len(shown) == 2:
            raise KeyboardInterrupt

    args = argparse.Namespace(
        once=False,
        interval_seconds=0.5,
        timeout_seconds=1.0,
        capacity_addr="",
        scheduler_addr="",
        planner_addr="",
        batch_addr="",
        scheduler_metrics_url="",
        state_dir=None,
        tls_ca="",
        tls_cert="",
        tls_key="",
        control_token_file="",
        data_token_file="",
    )
    monkeypatch.setenv("BANDMASTER_CLUSTERS_DIR", "/nonexistent/clusters")
    try:
        status.run(args, out=shown.append, sleep=sleep)
    except KeyboardInterrupt:
        pass
    assert len(shown) == 2 and all("refreshing every 0.5 s" in s for s in shown)


def test_program_counts_nest_under_active_and_paused():
    """Two paused programs whose next turn waits for the resume are REASONING too: GetStats counts them in
    programs_reasoning but not in programs_active, so the old view showed reasoning 3 under active 1."""
    reasoning, acting = spb.PROGRAM_STATUS_REASONING, spb.PROGRAM_STATUS_ACTING
    active, paused = spb.LIFECYCLE_ACTIVE, spb.LIFECYCLE_PAUSED
    programs = [
        spb.Program(session_id="a", lifecycle=active, status=reasoning),
        spb.Program(session_id="b", lifecycle=paused, status=reasoning),
        spb.Program(session_id="c", lifecycle=paused, status=reasoning),
        spb.Program(session_id="d", lifecycle=paused, status=acting, marked=True),
        spb.Program(session_id="e", lifecycle=active, status=acting, soft_demoted=True),
    ]
    counts = dict((label, n) for label, n in program_counts(programs))
    assert counts == {
        "active": 2,
        "  reasoning (in a turn)": 1,
        "  acting (at a tool call)": 1,
        "paused": 3,
        "  held (a turn waits for the resume)": 2,
        "  idle (at a tool call)": 1,
        "marked (pause at the next tool call)": 1,
        "soft-demoted": 1,
    }
    snapshot = _full_snapshot()
    snapshot.programs = spb.ListProgramsResponse(programs=programs)
    snapshot.stats = spb.Stats(programs_active=2, programs_paused=3, programs_reasoning=3, programs_acting=2)
    text = render(snapshot)
    (row,) = [line for line in text.splitlines() if line.startswith("  reasoning (in a turn)")]
    assert row.split()[-1] == "1", text


def test_the_batch_services_health_is_one_line_read_over_grpc_health():
    import argparse
    from concurrent import futures

    import grpc
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    from services.cli.status import batch_health

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    args = argparse.Namespace(tls_ca="", tls_cert="", tls_key="", control_token_file="", timeout_seconds=3.0)
    try:
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert batch_health(args, f"127.0.0.1:{port}") == f"SERVING at 127.0.0.1:{port}"
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert batch_health(args, f"127.0.0.1:{port}").startswith("NOT_SERVING")
    finally:
        server.stop(0)
    down = batch_health(args, f"127.0.0.1:{port}")
    assert down.startswith(f"not answering at 127.0.0.1:{port}: UNAVAILABLE") and "connection refused" in down
    snapshot = _full_snapshot()
    snapshot.batch_health = "SERVING at 127.0.0.1:50063"
    assert "batch service: SERVING at 127.0.0.1:50063" in render(snapshot)
    assert "batch service" not in render(_full_snapshot())
