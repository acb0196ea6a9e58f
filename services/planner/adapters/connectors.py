"""Scaling connectors: where replica targets go and where the inventory comes from.

* `virtual` records every decision and reports the target as the inventory (optionally after
  a start-up delay, so pending capacity can be exercised). For tests and advisory dry runs.
* `local` starts and stops simworker processes on this machine (`python -m services.simworker
  --port 0 --ready-file ...`), newest first on the way down; their URLs are registered with the
  capacity service when one is configured (RegisterWorker / DeregisterWorker).
* `kubernetes` scales a worker Deployment through the scale subresource with the official
  `kubernetes` client: each PATCH carries the scale's `resourceVersion` precondition (a delayed
  write conflicts, 409), and, with the writer fence on, is refused unless the Deployment carries
  this planner's writer annotation (claimed at start with a resourceVersion-checked PATCH).

Errors: `ConnectorRefused` = known not applied; anything else raised by `scale_to` = outcome
unknown. Either stops the tick's effects.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Awaitable, Callable, Protocol, Sequence

from services.common.clock import Clock
from services.common.outbound.retry import RetryPolicy, retrying
from services.common.process import orphan_guard
from services.common.process.child_stop import stop_child_async
from services.common.process.ready import read_ready_file
from services.planner.core.types import Inventory

log = logging.getLogger("services.planner.connector")
FENCE_ANNOTATION = "bandmaster.io/planner-writer"


class ConnectorError(Exception):
    pass


class ConnectorRefused(ConnectorError):
    """The write was refused and not applied (e.g. a resourceVersion conflict, a lost fence)."""


class Connector(Protocol):
    name: str

    async def start(self) -> None: ...

    async def inventory(self) -> Inventory: ...

    async def scale_to(self, replicas: int) -> None: ...

    def worker_urls(self) -> list[str]: ...

    async def stop(self) -> None: ...


class VirtualConnector:
    name = "virtual"

    def __init__(
        self, clock: Clock, *, initial_replicas: int = 0, ready_delay_s: float = 0.0, urls: Sequence[str] = ()
    ) -> None:
        self.clock = clock
        self.ready_delay_s = ready_delay_s
        self.decisions: list[tuple[float, int]] = []
        self._started_at: list[float] = [-1e18] * initial_replicas
        self._urls = list(urls)
        self.fail_next: Exception | None = None

    async def start(self) -> None:
        return None

    async def inventory(self) -> Inventory:
        now = self.clock.monotonic()
        ready = sum(1 for t in self._started_at if now - t >= self.ready_delay_s)
        pending = len(self._started_at) - ready
        return Inventory(now, ready, None if pending else ready, pending > 0, pending)

    async def scale_to(self, replicas: int) -> None:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        if replicas < 0:
            raise ConnectorRefused("replicas must be >= 0")
        now = self.clock.monotonic()
        self.decisions.append((now, replicas))
        while len(self._started_at) < replicas:
            self._started_at.append(now)
        del self._started_at[replicas:]

    def worker_urls(self) -> list[str]:
        return list(self._urls)

    async def stop(self) -> None:
        return None


@dataclass
class _Proc:
    proc: asyncio.subprocess.Process
    ready_file: Path
    port: int = 0
    registered: bool = False
    stopping: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def worker_id(self) -> str:
        return f"local-{self.port}"


class LocalConnector:
    name = "local"

    def __init__(
        self,
        clock: Clock,
        *,
        worker_args: Sequence[str] = (),
        max_workers: int = 16,
        register: Callable[[str, str], Awaitable[None]] | None = None,
        deregister: Callable[[str], Awaitable[None]] | None = None,
        python: str = sys.executable,
        stop_timeout_s: float = 10.0,
        workdir: str | None = None,
    ) -> None:
        self.clock = clock
        self.worker_args = list(worker_args)
        self.max_workers = max_workers
        self.register = register
        self.deregister = deregister
        self.python = python
        self.stop_timeout_s = stop_timeout_s
        self._dir = Path(workdir or tempfile.mkdtemp(prefix="bandmaster-planner-local-"))
        self.procs: list[_Proc] = []

    async def start(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)

    def _refresh(self) -> None:
        alive = []
        for p in self.procs:
            if p.proc.returncode is not None:
                log.warning("local worker %s exited with %s", p.url if p.port else "(starting)", p.proc.returncode)
                continue
            if not p.port:
                ready = read_ready_file(p.ready_file)
                if ready is not None:
                    try:
                        p.port = int(ready["port"])
                    except (ValueError, KeyError, TypeError):
                        pass
            alive.append(p)
        self.procs = alive

    async def inventory(self) -> Inventory:
        self._refresh()
        for p in self.procs:
            if p.port and not p.registered and self.register is not None:
                try:
                    await self.register(p.worker_id, p.url)
                    p.registered = True
                except Exception as exc:  # the next inventory retries
                    log.warning("registering %s with the capacity service failed: %s", p.url, exc)
        ready = sum(1 for p in self.procs if p.port)
        pending = len(self.procs) - ready
        return Inventory(self.clock.monotonic(), ready, None if pending else ready, pending > 0, pending)

    async def scale_to(self, replicas: int) -> None:
        if not 0 <= replicas <= self.max_workers:
            raise ConnectorRefused(f"replicas must be within [0, {self.max_workers}] for the local connector")
        self._refresh()
        while len(self.procs) < replicas:
            ready_file = self._dir / f"worker-{secrets.token_hex(4)}.json"
            # Under the orphan guard: a planner that is killed (even SIGKILL) takes its workers along.
            proc = await asyncio.create_subprocess_exec(
                *orphan_guard.command(
                    self.python,
                    "services.simworker",
                    ["--port", "0", "--ready-file", str(ready_file), *self.worker_args],
                ),
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
            self.procs.append(_Proc(proc, ready_file))
            log.info("local connector: started simworker pid %d", proc.pid)
        victims = self.procs[replicas:]
        self.procs = self.procs[:replicas]
        await asyncio.gather(*(self._stop_one(p) for p in reversed(victims)))

    async def _stop_one(self, p: _Proc) -> None:
        if p.registered and self.deregister is not None:
            try:
                await self.deregister(p.worker_id)
            except Exception as exc:
                log.warning("deregistering %s failed: %s", p.url, exc)
        await stop_child_async(p.proc, self.stop_timeout_s, name=f"simworker {p.url}")
        log.info("local connector: stopped simworker pid %d", p.proc.pid)

    def worker_urls(self) -> list[str]:
        self._refresh()
        return [p.url for p in self.procs if p.port]

    async def stop(self) -> None:
        victims, self.procs = self.procs, []
        await asyncio.gather(*(self._stop_one(p) for p in victims), return_exceptions=True)


@dataclass
class KubernetesTarget:
    deployment: str
    namespace: str = "default"
    api_server: str = ""
    """Empty: in-cluster config, else the kubeconfig. Set: talk to this URL (tests, proxies)."""
    request_timeout_s: float = 5.0
    writer_fence: bool = True
    writer_id: str = field(default_factory=lambda: f"planner-{secrets.token_hex(8)}")


class KubernetesConnector:
    name = "kubernetes"

    def __init__(self, clock: Clock, target: KubernetesTarget, api=None) -> None:
        self.clock = clock
        self.target = target
        self._api = api
        self.fenced = False

    def _client(self):
        if self._api is None:
            from kubernetes import client, config

            if self.target.api_server:
                cfg = client.Configuration()
                cfg.host = self.target.api_server
                api_client = client.ApiClient(cfg)
            else:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    config.load_kube_config()
                api_client = client.ApiClient()
            self._api = client.AppsV1Api(api_client)
        return self._api

    async def _call(self, fn, *args, **kwargs):
        kwargs.setdefault("_request_timeout", self.target.request_timeout_s)
        # The official client is synchronous: off the event loop, with a deadline on each call.
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def start(self) -> None:
        if not self.target.writer_fence:
            return
        from kubernetes.client.exceptions import ApiException

        api = self._client()
        t = self.target

        async def claim() -> None:
            dep = await self._call(api.read_namespaced_deployment, t.deployment, t.namespace)
            body = {
                "metadata": {
                    "resourceVersion": dep.metadata.resource_version,
                    "annotations": {FENCE_ANNOTATION: t.writer_id},
                }
            }
            await self._call(
                api.patch_namespaced_deployment,
                t.deployment,
                t.namespace,
                body,
                _content_type="application/merge-patch+json",
            )

        # A 409 is another writer's change between our read and our patch: read again and retry (3 tries).
        await retrying(
            claim,
            RetryPolicy(
                first_delay_s=0.0,
                max_attempts=3,
                retry_on=(ApiException,),
                retry_if=lambda exc: getattr(exc, "status", None) == 409,
            ),
        )
        dep = await self._call(api.read_namespaced_deployment, t.deployment, t.namespace)
        if (dep.metadata.annotations or {}).get(FENCE_ANNOTATION) != t.writer_id:
            raise ConnectorRefused(f"deployment {t.deployment}: writer fence not held after claiming it")
        self.fenced = True
        log.info(
            "kubernetes connector: writer fence on deployment %s/%s claimed as %s",
            t.namespace,
            t.deployment,
            t.writer_id,
        )

    async def inventory(self) -> Inventory:
        api = self._client()
        dep = await self._call(api.read_namespaced_deployment, self.target.deployment, self.target.namespace)
        desired = dep.spec.replicas or 0
        st = dep.status
        current = st.replicas or 0
        ready = st.available_replicas if st.available_replicas is not None else (st.ready_replicas or 0)
        updated = st.updated_replicas or 0
        settled = (st.observed_generation or 0) >= (dep.metadata.generation or 0)
        now = self.clock.monotonic()
        if settled and desired == current == updated == ready:
            return Inventory(now, ready, desired, False, 0)
        if settled and updated == current and ready <= desired and current <= desired:
            return Inventory(now, ready, None, True, desired - ready)  # verified start-up only
        return Inventory(now, min(ready, desired), None, True, 0)

    async def scale_to(self, replicas: int) -> None:
        from kubernetes.client.exceptions import ApiException

        if replicas < 0:
            raise ConnectorRefused("replicas must be >= 0")
        api = self._client()
        t = self.target
        if t.writer_fence:
            dep = await self._call(api.read_namespaced_deployment, t.deployment, t.namespace)
            owner = (dep.metadata.annotations or {}).get(FENCE_ANNOTATION)
            if owner != t.writer_id:
                raise ConnectorRefused(f"deployment {t.deployment} is owned by another writer ({owner!r})")
        scale = await self._call(api.read_namespaced_deployment_scale, t.deployment, t.namespace)
        body = {"metadata": {"resourceVersion": scale.metadata.resource_version}, "spec": {"replicas": replicas}}
        try:
            await self._call(
                api.patch_namespaced_deployment_scale,
                t.deployment,
                t.namespace,
                body,
                _content_type="application/merge-patch+json",
            )
        except ApiException as exc:
            if exc.status == 409:
                raise ConnectorRefused(f"deployment {t.deployment}: scale conflict (resourceVersion changed)") from exc
            raise

    def worker_urls(self) -> list[str]:
        return []

    async def stop(self) -> None:
        return None
