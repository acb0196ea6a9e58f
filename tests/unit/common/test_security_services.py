"""Every gRPC service takes the same security flags and refuses a broken combination at start, naming it."""

import subprocess
import sys

import pytest

from services.capacity.config import load_config as capacity_config
from services.common.auth.certs import ensure_local_pki
from services.common.settings.errors import ConfigError
from services.planner.config import load_config as planner_config
from services.router.config import load_config as router_config
from services.scheduler.config import load_config as scheduler_config

LOADERS = {
    "capacity": capacity_config,
    "scheduler": scheduler_config,
    "router": router_config,
    "planner": planner_config,
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return ensure_local_pki(tmp_path_factory.mktemp("pki"), ["svc"])


@pytest.mark.parametrize("service", sorted(LOADERS))
def test_the_same_flags_on_every_service(service, pki):
    extra = ["--state-path", "none"] if service == "scheduler" else []
    config = LOADERS[service]([*pki.service_args("svc"), "--grpc-reflection", *extra], {})
    security = config.security
    assert security.mutual_tls and security.grpc_reflection
    assert security.control_tokens is not None and security.data_tokens is not None
    assert LOADERS[service](extra, {}).security.describe() == "plaintext"


@pytest.mark.parametrize("service", sorted(LOADERS))
def test_environment_names_follow_the_service_prefix(service, pki):
    prefix = f"BANDMASTER_{service.upper()}"
    env = {
        f"{prefix}_TLS_CERT": str(pki.cert("svc")),
        f"{prefix}_TLS_KEY": str(pki.key("svc")),
        f"{prefix}_TLS_CA": str(pki.ca),
        "BANDMASTER_CONTROL_TOKEN": "c" * 32,
    }
    security = LOADERS[service](["--state-path", "none"] if service == "scheduler" else [], env).security
    assert security.mutual_tls and security.control_tokens.first == "c" * 32


@pytest.mark.parametrize("service", sorted(LOADERS))
def test_a_certificate_without_its_key_is_refused(service, pki):
    with pytest.raises(ConfigError) as info:
        LOADERS[service](["--tls-cert", str(pki.cert("svc"))], {})
    assert info.value.field == "tls_key"


def test_the_process_exits_2_naming_the_rule(pki):
    done = subprocess.run(
        [sys.executable, "-m", "services.capacity", "--tls-ca", str(pki.ca)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "tls_ca" in done.stderr and "needs --tls-cert" in done.stderr
