"""How Bandmaster's processes reach SGLang workers: the worker API key and TLS to https workers.

One settings group (`WorkerClientFlags`, composed into a config by `worker_client_group(ENV_PREFIX)`), the
same on the router, the capacity service and the registrar:

    --worker-api-key-file   file with the API key SGLang was started with (`--api-key`): sent as
                            `Authorization: Bearer <key>` on every request to a worker (or env
                            BANDMASTER_WORKER_API_KEY holding the key itself)
    --worker-ca-file        PEM CA bundle that https workers are verified against (default: the system roots)
    --worker-cert-file,     a client certificate (and its key) presented to https workers that ask for one
    --worker-key-file

An https worker URL is always verified (the system roots without `--worker-ca-file`); there is no switch to
turn verification off. The key is read once at start, never logged and never in a repr or an error message;
a file that others may write is refused, like the bearer-token files (services/common/auth/security.py).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any, Mapping

from services.common.auth.security import Tokens, load_secret_file
from services.common.settings.config import group, pop_group, setting
from services.common.settings.errors import ConfigError

WORKER_API_KEY_ENV = "BANDMASTER_WORKER_API_KEY"


@dataclass(frozen=True)
class WorkerClientFlags:
    """The worker-client flags of a service that calls workers (environment `<prefix>_WORKER_API_KEY_FILE`, ...)."""

    worker_api_key_file: str = setting(
        "",
        "file with the workers' API key (SGLang's --api-key), sent as Authorization: Bearer on every "
        f"request to a worker (or env {WORKER_API_KEY_ENV} with the key itself)",
        env="{prefix}_WORKER_API_KEY_FILE",
    )
    worker_ca_file: str = setting(
        "",
        "PEM CA bundle that https:// workers are verified against (default: the system roots)",
        env="{prefix}_WORKER_CA_FILE",
    )
    worker_cert_file: str = setting(
        "",
        "PEM client certificate presented to https:// workers; needs --worker-key-file",
        env="{prefix}_WORKER_CERT_FILE",
    )
    worker_key_file: str = setting("", "PEM private key of --worker-cert-file", env="{prefix}_WORKER_KEY_FILE")


def worker_client_group(prefix: str) -> Any:
    """A service's `worker_client` field: `WorkerClientFlags` listed in its place (environment
    `<prefix>_WORKER_*`), built by `load_worker_client`."""
    return group(WorkerClientConfig(), flags=WorkerClientFlags, prefix=prefix, load=load_worker_client)


@dataclass(frozen=True)
class WorkerClientConfig:
    """The credentials a process presents to workers. The default: no key, system roots for https."""

    api_key: Tokens | None = None
    """The one API key (a `Tokens` of one, so that no repr shows it)."""
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""

    def __post_init__(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            missing = "worker_key_file" if self.cert_file else "worker_cert_file"
            raise ConfigError(missing, "", "--worker-cert-file and --worker-key-file go together")

    @property
    def headers(self) -> dict[str, str]:
        """What every request to a worker carries (empty without a key)."""
        return {"Authorization": f"Bearer {self.api_key.first}"} if self.api_key is not None else {}

    def ssl_context(self) -> ssl.SSLContext | bool:
        """aiohttp's `ssl=` for worker connections: verification with the system roots (True), or a
        context with `--worker-ca-file` and the client certificate. Used for https URLs only."""
        if not self.ca_file and not self.cert_file:
            return True
        context = ssl.create_default_context(cafile=self.ca_file or None)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def describe(self) -> str:
        parts = ["API key" if self.api_key is not None else "no API key"]
        if self.ca_file:
            parts.append("worker CA")
        if self.cert_file:
            parts.append("client certificate")
        return ", ".join(parts)


def check_api_key(field_name: str, shown: str, text: str) -> Tokens:
    key = text.strip()
    if not key:
        raise ConfigError(field_name, shown, "no API key (empty)")
    if "\n" in key or not all(0x21 <= ord(c) <= 0x7E for c in key):
        raise ConfigError(field_name, shown, "the API key must be one line of printable ASCII without spaces")
    return Tokens([key])


def load_worker_client(values: dict[str, Any], env: Mapping[str, str]) -> WorkerClientConfig:
    """Pop the worker-client group out of `values`, read and check its files; ConfigError naming the rule."""
    raw = pop_group(values, WorkerClientFlags)
    from_env = env.get(WORKER_API_KEY_ENV, "").strip()
    if raw["worker_api_key_file"] and from_env:
        raise ConfigError(
            "worker_api_key_file",
            raw["worker_api_key_file"],
            f"give the worker API key by --worker-api-key-file or {WORKER_API_KEY_ENV}, not both",
        )
    api_key = None
    if from_env:
        api_key = check_api_key(WORKER_API_KEY_ENV, "<redacted>", from_env)
    elif raw["worker_api_key_file"]:
        path = raw["worker_api_key_file"]
        api_key = check_api_key("worker_api_key_file", path, load_secret_file("worker_api_key_file", path))
    ca, cert, key = raw["worker_ca_file"], raw["worker_cert_file"], raw["worker_key_file"]
    config = WorkerClientConfig(api_key=api_key, ca_file=ca, cert_file=cert, key_file=key)
    # Read the files now, the way the connections will, so that a wrong one is refused at start, by name.
    if ca:
        try:
            ssl.create_default_context(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError("worker_ca_file", ca, f"not a readable PEM CA bundle ({_why(exc)})") from None
    if cert:
        try:
            ssl.create_default_context().load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                "worker_key_file", key, f"not a PEM certificate and matching private key ({_why(exc)})"
            ) from None
    return config


def _why(exc: OSError | ssl.SSLError) -> str:
    return str(getattr(exc, "reason", None) or exc.strerror or exc)
