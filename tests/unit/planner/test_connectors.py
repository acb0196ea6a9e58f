"""Connectors: kubernetes (the official client against a local apps/v1 API double), virtual, and the
local connector's process management (a real simworker)."""

import copy
import textwrap

import pytest
from aiohttp import web

from services.common.clock import FakeClock, SystemClock
from services.planner.adapters.connectors import (
    FENCE_ANNOTATION,
    ConnectorRefused,
    KubernetesConnector,
    KubernetesTarget,
    LocalConnector,
    VirtualConnector,
)
from tests.support.eventually import assert_eventually
from tests.support.processes import assert_child_dies_with_parent


class FakeApiServer:
    """GET/PATCH of apps/v1 deployments/{name} and deployments/{name}/scale, with resourceVersion
    preconditions (409 on mismatch) and a status the test controls."""

    def __init__(self, replicas=2):
        self.rv = 1
        self.replicas = replicas
        self.status = {
            "replicas": replicas,
            "readyReplicas": replicas,
            "availableReplicas": replicas,
            "updatedReplicas": replicas,
            "observedGeneration": 1,
        }
        self.generation = 1
        self.annotations: dict = {}
        self.patches: list[dict] = []
        self.fail_next_patch: int | None = None
        self.port = 0

    def settle(self):
        n = self.replicas
        self.status = {
            "replicas": n,
            "readyReplicas": n,
            "availableReplicas": n,
            "updatedReplicas": n,
            "observedGeneration": self.generation,
        }

    def deployment(self):
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {
                "name": "workers",
                "namespace": "ns",
                "resourceVersion": str(self.rv),
                "generation": self.generation,
                "annotations": dict(self.annotations),
            },
            "spec": {
                "replicas": self.replicas,
                "selector": {"matchLabels": {"app": "w"}},
                "template": {
                    "metadata": {"labels": {"app": "w"}},
                    "spec": {"containers": [{"name": "w", "image": "sim"}]},
                },
            },
            "status": copy.deepcopy(self.status),
        }

    def scale(self):
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {"name": "workers", "namespace": "ns", "resourceVersion": str(self.rv)},
            "spec": {"replicas": self.replicas},
            "status": {"replicas": self.status["replicas"], "selector": "app=w"},
        }

    def _conflict(self):
        return web.json_response(
            {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "Conflict",
                "code": 409,
                "message": "the object has been modified",
            },
            status=409,
        )

    async def _patch(self, request, scale: bool):
        body = await request.json()
        self.patches.append({"scale": scale, "body": body, "content_type": request.content_type})
        if self.fail_next_patch is not None:
            status, self.fail_next_patch = self.fail_next_patch, None
            return web.json_response({"kind": "Status", "code": status, "message": "injected"}, status=status)
        want = body.get("metadata", {}).get("resourceVersion")
        if want is not None and want != str(self.rv):
            return self._conflict()
        if scale:
            self.replicas = body["spec"]["replicas"]
            self.generation += 1
        else:
            self.annotations.update(body.get("metadata", {}).get("annotations", {}))
        self.rv += 1
        return web.json_response(self.scale() if scale else self.deployment())

    async def start(self):
        app = web.Application()
        base = "/apis/apps/v1/namespaces/ns/deployments/workers"

        async def get_deployment(_r):
            return web.json_response(self.deployment())

        async def get_scale(_r):
            return web.json_response(self.scale())

        async def patch_deployment(r):
            return await self._patch(r, False)

        async def patch_scale(r):
            return await self._patch(r, True)

        app.router.add_get(base, get_deployment)
        app.router.add_patch(base, patch_deployment)
        app.router.add_get(base + "/scale", get_scale)
        app.router.add_patch(base + "/scale", patch_scale)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def stop(self):
        await self.runner.cleanup()


@pytest.fixture
async def api():
    server = await FakeApiServer().start()
    yield server
    await server.stop()


def k8s(api, **kw):
    target = KubernetesTarget("workers", "ns", f"http://127.0.0.1:{api.port}", request_timeout_s=5, **kw)
    return KubernetesConnector(FakeClock(), target)


async def test_kubernetes_scale_uses_the_scale_subresource_with_a_resource_version(api):
    c = k8s(api)
    await c.start()
    assert api.annotations[FENCE_ANNOTATION] == c.target.writer_id
    inv = await c.inventory()
    assert (inv.ready, inv.expected, inv.pending) == (2, 2, 0)
    rv_before = api.rv
    await c.scale_to(4)
    patch = api.patches[-1]
    assert patch["scale"] and patch["body"] == {
        "metadata": {"resourceVersion": str(rv_before)},
        "spec": {"replicas": 4},
    }
    assert patch["content_type"] == "application/merge-patch+json"
    # Starting: two verified pending replicas.
    api.status = {
        "replicas": 4,
        "readyReplicas": 2,
        "availableReplicas": 2,
        "updatedReplicas": 4,
        "observedGeneration": api.generation,
    }
    inv = await c.inventory()
    assert (inv.ready, inv.expected, inv.pending, inv.scaling_in_progress) == (2, None, 2, True)
    api.settle()
    assert (await c.inventory()).expected == 4


async def test_kubernetes_unverified_rollout_is_not_startup(api):
    c = k8s(api, writer_fence=False)
    api.status = {
        "replicas": 3,
        "readyReplicas": 2,
        "availableReplicas": 2,
        "updatedReplicas": 1,
        "observedGeneration": 1,
    }
    inv = await c.inventory()
    assert inv.expected is None and inv.pending == 0 and inv.scaling_in_progress


async def test_kubernetes_conflict_is_a_refusal(api):
    c = k8s(api, writer_fence=False)
    api.fail_next_patch = 409
    with pytest.raises(ConnectorRefused, match="conflict"):
        await c.scale_to(3)
    assert api.replicas == 2


async def test_kubernetes_server_error_is_an_unknown_outcome(api):
    c = k8s(api, writer_fence=False)
    api.fail_next_patch = 500
    with pytest.raises(Exception) as info:
        await c.scale_to(3)
    assert not isinstance(info.value, ConnectorRefused)


async def test_kubernetes_lost_writer_fence_refuses_to_scale(api):
    old = k8s(api)
    await old.start()
    new = k8s(api)
    await new.start()  # another planner took the fence
    with pytest.raises(ConnectorRefused, match="another writer"):
        await old.scale_to(5)
    assert not any(p["scale"] for p in api.patches)
    await new.scale_to(5)
    assert api.replicas == 5


async def test_kubernetes_fence_claim_retries_a_conflict(api):
    api.fail_next_patch = 409
    c = k8s(api)
    await c.start()
    assert api.annotations[FENCE_ANNOTATION] == c.target.writer_id and len(api.patches) == 2


async def test_virtual_connector_records_decisions_and_startup_delay():
    clock = FakeClock()
    v = VirtualConnector(clock, initial_replicas=1, ready_delay_s=10)
    await v.scale_to(3)
    inv = await v.inventory()
    assert (inv.ready, inv.pending, inv.expected) == (1, 2, None)
    clock.advance(10)
    assert (await v.inventory()).expected == 3
    await v.scale_to(0)
    assert [n for _, n in v.decisions] == [3, 0] and (await v.inventory()).ready == 0


@pytest.mark.integration
async def test_local_connector_starts_and_stops_simworkers(tmp_path):
    registered, deregistered = [], []

    async def register(worker_id, url):
        registered.append((worker_id, url))

    async def deregister(worker_id):
        deregistered.append(worker_id)

    c = LocalConnector(
        SystemClock(), worker_args=["--speedup", "100"], register=register, deregister=deregister, workdir=str(tmp_path)
    )
    await c.start()
    try:
        await c.scale_to(2)
        inv = await c.inventory()
        assert inv.ready + inv.pending == 2

        async def ready():
            i = await c.inventory()
            return i.ready == 2 and i.expected == 2

        await assert_eventually(ready, timeout_s=60, interval_s=0.2)
        assert len(c.worker_urls()) == 2 and len(registered) == 2
        import aiohttp

        async with aiohttp.ClientSession() as s:
            for url in c.worker_urls():
                async with s.get(url + "/health") as r:
                    assert r.status == 200
        await c.scale_to(1)
        assert len(deregistered) == 1 and (await c.inventory()).ready == 1
    finally:
        await c.stop()
    assert c.procs == []


@pytest.mark.integration
def test_local_connector_workers_die_with_a_killed_planner(tmp_path):
    """The simworkers the local connector starts live in their own session; a planner killed with
    SIGKILL used to leave them running. They now run under the orphan guard (PR_SET_PDEATHSIG)."""
    pid_file = tmp_path / "worker.pid"
    script = textwrap.dedent(f"""
        import asyncio, time
        from pathlib import Path
        from services.common.clock import SystemClock
        from services.planner.adapters.connectors import LocalConnector

        async def main():
            c = LocalConnector(SystemClock(), worker_args=["--speedup", "100"], workdir={str(tmp_path)!r})
            await c.start()
            await c.scale_to(1)
            Path({str(pid_file)!r}).write_text(str(c.procs[0].proc.pid))
            await asyncio.sleep(600)

        asyncio.run(main())
    """)
    assert_child_dies_with_parent("planner", script, pid_file, tmp_path)


def test_the_kubernetes_connector_without_its_extra_names_the_extra(monkeypatch):
    """kubernetes is an optional dependency: a planner told to use it without it installed refuses to start
    (a ConfigError, exit 2) and says which extra installs it."""
    import sys

    from services.common.clock import FakeClock
    from services.common.settings.errors import ConfigError
    from services.planner.config import load_config
    from services.planner.server import _connector

    config = load_config(["--connector", "kubernetes", "--k8s-deployment", "workers"], {})
    for name in [m for m in sys.modules if m == "kubernetes" or m.startswith("kubernetes.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # `import kubernetes` raises ModuleNotFoundError
    with pytest.raises(ConfigError, match=r"bandmaster\[kubernetes\]"):
        _connector(config, FakeClock(), None)
    monkeypatch.undo()
    assert _connector(config, FakeClock(), None).name == "kubernetes"
