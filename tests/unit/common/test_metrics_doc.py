"""docs/metrics.md lists every series the services export, as their registries declare them.

The table is generated (scripts/metrics_table.py); a metric added to any service without
regenerating the page fails here.
"""

from __future__ import annotations

import re

import pytest
from prometheus_client import Gauge

from scripts import metrics_table
from scripts.doc_markers import splice

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def registries():
    return metrics_table.service_registries()


@pytest.fixture(scope="module")
def catalog(registries):
    return metrics_table.catalog(registries)


def test_docs_metrics_md_is_current(catalog):
    page = metrics_table.DOC.read_text()
    wanted = splice(page, metrics_table.SECTION, metrics_table.render(catalog))
    assert page == wanted, "docs/metrics.md is stale: run `python scripts/metrics_table.py --write`"


def test_a_metric_added_to_a_service_makes_the_page_stale(registries):
    page = metrics_table.DOC.read_text()
    Gauge("bandmaster_router_example_new_series", "A series nobody documented", registry=registries["router"])
    try:
        table = metrics_table.render(metrics_table.catalog(registries))
        assert "`bandmaster_router_example_new_series`" in table
        assert splice(page, metrics_table.SECTION, table) != page
    finally:
        for collector in list(metrics_table._collectors(registries["router"])):
            if getattr(collector, "_name", "") == "bandmaster_router_example_new_series":
                registries["router"].unregister(collector)


def test_every_service_is_covered(catalog):
    services = {service for doc in catalog for service in doc.services}
    assert services == set(metrics_table.SERVICES)


# Each service's series carry its own prefix; the gRPC host's shared series carry bandmaster_ alone.
_PREFIXES = {
    "capacity": ("bandmaster_capacity_",),
    "scheduler": ("bandmaster_scheduler_",),
    "router": ("bandmaster_router_",),
    "planner": ("bandmaster_planner_",),
    "batch": ("bandmaster_batch_",),
    "simworker": ("sglang:", "simworker:"),
}


def test_names_follow_the_conventions(catalog):
    for doc in catalog:
        assert doc.help, f"{doc.name} has no help text"
        assert re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", doc.name), doc.name
        assert not doc.name.endswith("_total"), f"{doc.name}: the family name of a counter carries no _total"
        if len(doc.services) == 1:
            assert doc.name.startswith(_PREFIXES[doc.services[0]]), (doc.services, doc.name)
        elif doc.name == "bandmaster_build_info" or doc.name.startswith("process_"):
            # Every process's own series (services/common/observe/process_metrics.py), the simulated worker's too.
            assert set(doc.services) == set(_PREFIXES), doc
        else:
            assert doc.name.startswith("bandmaster_") and set(doc.services) <= {
                "capacity",
                "scheduler",
                "router",
                "planner",
                "batch",
            }, doc
        if doc.type == "histogram":
            assert doc.name.endswith("_seconds"), f"{doc.name}: a histogram here measures seconds"
        assert "le" not in doc.labels


def test_series_names_follow_prometheus_client(catalog):
    by_name = {doc.name: doc for doc in catalog}
    assert by_name["bandmaster_router_requests"].shown == ("bandmaster_router_requests_total",)
    assert by_name["bandmaster_router_ttft_seconds"].shown == (
        "bandmaster_router_ttft_seconds_bucket",
        "bandmaster_router_ttft_seconds_sum",
        "bandmaster_router_ttft_seconds_count",
    )
    assert by_name["bandmaster_scheduler_programs"].shown == ("bandmaster_scheduler_programs",)
    assert by_name["sglang:prompt_tokens"].shown == ("sglang:prompt_tokens_total",)


def test_catalog_matches_what_a_scrape_shows(registries):
    """Every sample a registry writes is a series the catalog knows (the labelled families with
    no child yet write none, so this direction is the one that can be checked)."""
    from prometheus_client import generate_latest

    exported = metrics_table.exported_series(metrics_table.catalog(registries))
    for service, registry in registries.items():
        for line in generate_latest(registry).decode().splitlines():
            if line and not line.startswith("#"):
                name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
                assert name in exported, (service, name)
                assert service in exported[name], (service, name)


def test_labels_of_a_labelled_family_with_no_child_yet_are_listed(catalog):
    by_name = {doc.name: doc for doc in catalog}
    assert by_name["bandmaster_router_upstream_errors"].labels == ("kind", "phase")
    assert by_name["bandmaster_scheduler_replica_band"].labels == ("worker_id", "dp_rank", "band")
    # Enumerations a service creates up front are shown; deployment identities are not.
    values = dict(by_name["bandmaster_scheduler_replica_band"].label_values)
    assert values == {"band": ("normal", "pause", "soft_demote")}
