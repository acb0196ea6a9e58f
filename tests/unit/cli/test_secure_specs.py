"""`bandmaster up --secure`: every control-plane child gets its certificate, the CA and both token files;
the supervisor's health probes get the client certificate."""

import argparse

from services.cli.up import add_parser, cluster_config
from services.common.auth.security import SecurityFlags, load_security
from services.common.settings.config import parse_settings, settings_of
from services.launcher.cluster import ClusterConfig, _secured, batch_spec, capacity_spec, router_spec, secure_cluster
from services.launcher.supervisor import Supervisor


def test_secure_flag_reaches_the_cluster_config():
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    assert cluster_config(parser.parse_args(["up", "--secure"])).secure is True
    assert cluster_config(parser.parse_args(["up"])).secure is False


def test_each_child_gets_flags_its_own_settings_accept(tmp_path):
    supervisor = Supervisor(tmp_path)
    pki = secure_cluster(supervisor)
    assert supervisor.grpc_credentials is not None
    config = ClusterConfig(secure=True)
    for spec in (
        _secured(capacity_spec(config, ["http://127.0.0.1:1"]), pki),
        _secured(router_spec(config, "127.0.0.1:1", "127.0.0.1:2"), pki),
        _secured(batch_spec(config, "127.0.0.1:1", "https://127.0.0.1:2", 0, tmp_path), pki),
    ):
        args = list(spec.args)
        assert args[args.index("--tls-cert") + 1] == str(pki.cert(spec.name))
        security_args = args[: args.index("--data-token-file") + 2]
        values = parse_settings(settings_of(SecurityFlags, prefix="X"), security_args, {}, prog="x")
        security = load_security(values, {})
        assert security.mutual_tls and security.control_tokens and security.data_tokens
    assert _secured(capacity_spec(config, []), None).args == capacity_spec(config, []).args
