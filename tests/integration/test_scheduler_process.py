"""`python -m services.scheduler` and `python -m services.capacity` as real processes against sglang_stub workers.

Programs are driven over gRPC until the retention budget is exceeded; the scheduler's stderr must
carry the seed reference's tick lines, a held Admit must come back once a Release frees room, and
a worker whose stub dies must take its programs' placement with it.
"""

import asyncio
import re
from pathlib import Path

import grpc
import pytest

from bandmaster.scheduler.v1 import scheduler_pb2 as pb
from bandmaster.scheduler.v1 import scheduler_pb2_grpc as pb_grpc
from tests.support.eventually import assert_eventually
from tests.support.processes import Process, base_env, python_module, run_module, start
from tests.support.sglang_stub import SglangStub, sglang_info

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
PAUSE_LINE = re.compile(
    r"scheduler\.tick worker=(\S+) dp_rank=0 paused=(\d+) marked=(\d+) "
    r"util=(\d+\.\d{4}) -> (\d+\.\d{4})"
)
RESUME_LINE = re.compile(r"scheduler\.tick resumed=(\d+) still_paused=(\d+)")


@pytest.mark.parametrize(
    "argv, env, relation",
    [
        (["--pause-threshold", "0.7", "--pause-target", "0.8"], {}, "0 <= pause_target <= pause_threshold"),
        # Above the reference's pause threshold (0.95; the program-aware default is 1.0).
        (
            ["--pause-policy", "threshold"],
            {"DYN_THUNDERAGENT_SOFT_DEMOTE_THRESHOLD": "0.99"},
            "0 <= soft_demote_threshold <= pause_threshold",
        ),
        (
            [],
            {"DYN_THUNDERAGENT_PAUSE_THRESHOLD": "0.9", "DYN_THUNDERAGENT_SOFT_DEMOTE_THRESHOLD": "0.95"},
            "0 <= soft_demote_threshold <= pause_threshold",
        ),
        (["--scheduler-interval-seconds", "0"], {}, "scheduler_interval_seconds > 0"),
        ([], {"BANDMASTER_SCHEDULER_PAUSE_MARGIN_QUANTILE": "2"}, "0 <= pause_margin_quantile <= 1"),
        (
            ["--router-track-output-blocks", "--no-router-track-active-blocks"],
            {},
            "router_track_output_blocks requires router_track_active_blocks",
        ),
    ],
)
def test_invalid_config_exits_2_naming_the_relation(argv, env, relation):
    proc = run_module("services.scheduler", *argv, env=base_env(**env))
    assert proc.returncode == 2
    assert relation in proc.stderr and "invalid configuration" in proc.stderr


async def _spawn(name: str, module: str, args: list[str], tmp: Path) -> Process:
    ready = tmp / f"{name}.json"
    return await start(
        name, python_module(module, *args, "--ready-file", str(ready)), tmp, ready_file=ready
    ).wait_ready_async()


async def test_scheduler_process_pauses_holds_resumes_and_follows_workers(tmp_path):
    stubs = [SglangStub(sglang_info(max_total_num_tokens=2000, page_size=1, max_running_requests=64)) for _ in range(2)]
    for stub in stubs:
        await stub.start()
    sched_log = tmp_path / "scheduler.log"
    capacity = await _spawn(
        "capacity",
        "services.capacity",
        [
            *[a for s in stubs for a in ("--worker-url", s.url)],
            "--listen",
            "127.0.0.1:0",
            "--metrics-port",
            "-1",
            "--poll-interval-seconds",
            "0.2",
            "--poll-timeout-seconds",
            "0.2",
            "--unhealthy-after-failures",
            "2",
            "--remove-unhealthy-after-seconds",
            "30",
            "--watch-heartbeat-seconds",
            "0.5",
            "--shutdown-grace-seconds",
            "1",
        ],
        tmp_path,
    )
    scheduler = None
    try:
        cap_addr = capacity.ready["grpc"]
        scheduler = await _spawn(
            "scheduler",
            "services.scheduler",
            [
                "--capacity-addr",
                cap_addr,
                "--listen",
                "127.0.0.1:0",
                "--metrics-port",
                "0",
                "--scheduler-interval-seconds",
                "0.2",
                # Decay slowly: the resume side then sees what the pause side sees (no churn in the test).
                "--acting-decay-tau-seconds",
                "1000",
                "--shutdown-grace-seconds",
                "1",
                # The reference policy: the test's small contexts are cheap to recompute, so the default
                # cost_aware policy would (rightly) not pause them.
                "--pause-policy",
                "threshold",
                "--state-path",
                str(tmp_path / "scheduler.sqlite"),
            ],
            tmp_path,
        )
        info = scheduler.ready
        async with grpc.aio.insecure_channel(info["grpc"]) as channel:
            client = pb_grpc.SchedulerStub(channel)

            async def replicas():
                stats = await client.GetStats(pb.GetStatsRequest(), timeout=5)
                assert len(stats.replicas) == 2
                return stats

            await assert_eventually(replicas, timeout_s=30)

            # 1. six programs of 600 tokens each on 2 x 2000 tokens: more than the budget can hold.
            for i in range(6):
                resp = await client.Admit(
                    pb.AdmitRequest(session_id=f"p{i}", request_id=f"p{i}-1", estimated_prompt_tokens=100), timeout=30
                )
                await client.Complete(
                    pb.CompleteRequest(
                        session_id=f"p{i}",
                        request_id=f"p{i}-1",
                        worker_id=resp.worker_id,
                        dp_rank=resp.dp_rank,
                        prompt_tokens=550,
                        completion_tokens=50,
                    ),
                    timeout=5,
                )

            async def paused_program():
                listing = await client.ListPrograms(pb.ListProgramsRequest(), timeout=5)
                paused = [p for p in listing.programs if p.lifecycle == pb.LIFECYCLE_PAUSED]
                assert paused and all(r.utilization < 0.95 for r in listing.replicas)
                return paused[0]

            victim = await assert_eventually(paused_program, timeout_s=15)
            match = await assert_eventually(lambda: PAUSE_LINE.search(sched_log.read_text()), timeout_s=10)
            assert int(match.group(2)) >= 1 and float(match.group(4)) >= 0.95 > float(match.group(5))

            # 2. the paused program's next turn is held (estimate 0 keeps its 600 tokens: no room yet)
            held = asyncio.ensure_future(
                client.Admit(pb.AdmitRequest(session_id=victim.session_id, request_id="victim-2"), timeout=60)
            )

            async def waiting():
                stats = await client.GetStats(pb.GetStatsRequest(), timeout=5)
                assert stats.waiting_admissions == 1
                return True

            await assert_eventually(waiting, timeout_s=10)
            assert not held.done()

            # 3. final requests free room: the held call returns, resumed, with the boost
            listing = await client.ListPrograms(pb.ListProgramsRequest(), timeout=5)
            for program in listing.programs:
                if program.lifecycle == pb.LIFECYCLE_ACTIVE:
                    await client.Release(pb.ReleaseRequest(session_id=program.session_id), timeout=5)
                    break
            resp = await asyncio.wait_for(held, 30)
            assert resp.was_paused and resp.pinned and resp.priority == 1 and not resp.forced_resume
            await assert_eventually(lambda: RESUME_LINE.search(sched_log.read_text()), timeout_s=10)
            await client.Complete(
                pb.CompleteRequest(
                    session_id=victim.session_id, request_id="victim-2", worker_id=resp.worker_id, prompt_tokens=600
                ),
                timeout=5,
            )

            # 4. a worker dies: its replica leaves the snapshot and its programs lose their placement
            listing = await client.ListPrograms(pb.ListProgramsRequest(), timeout=5)
            dead = resp.worker_id
            on_dead = [p.session_id for p in listing.programs if p.worker_id == dead]
            assert on_dead
            await next(s for s in stubs if f"127.0.0.1:{s.port}" == dead).stop()

            async def unplaced():
                listing = await client.ListPrograms(pb.ListProgramsRequest(), timeout=5)
                assert [r.worker_id for r in listing.replicas] != [] and dead not in [
                    r.worker_id for r in listing.replicas
                ]
                by_id = {p.session_id: p for p in listing.programs}
                assert all(by_id[sid].worker_id == "" for sid in on_dead if sid in by_id)
                return True

            await assert_eventually(unplaced, timeout_s=20)
        assert await scheduler.stop_async(grace_s=20) == 0
        text = sched_log.read_text()
        assert f"scheduler.capacity replica_removed worker={dead} dp_rank=0 unplaced=" in text
        assert "scheduler started (interval=0.2s, pause=0.95, soft=0.80, target=0.80, margin quantile=0.00" in text
        assert "Traceback" not in text
    finally:
        if scheduler is not None:
            await scheduler.stop_async(grace_s=20)
        await capacity.stop_async(grace_s=20)
        for stub in stubs:
            await stub.stop()
