"""The pure parts of the Files and Batches lists and of file expiry: OpenAI's pagination parameters and
page object, `expires_after`, and the registry's list, delete and cleanup over a fake clock."""

import pytest

from services.batch.adapters.registry import FileInUse, NotFound, Registry
from services.batch.cleanup import Cleanup
from services.batch.core.batch_api import BatchInputError, parse_batch_input
from services.batch.core.expiry import DEFAULT_RETENTION_S, expires_at, is_expired, parse_expires_after
from services.batch.core.listing import PageQuery, page, parse_page_query
from services.common.clock import FakeClock
from tests.unit.batch.fakes import batch_jsonl

# -- pagination --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "query, expected",
    [
        ({}, PageQuery(limit=20)),
        ({"limit": "5"}, PageQuery(limit=5)),
        ({"limit": "100", "after": "batch_abc"}, PageQuery(limit=100, after="batch_abc")),
        ({"after": ""}, PageQuery(limit=20)),
    ],
)
def test_batch_list_queries(query, expected):
    assert parse_page_query(query, default_limit=20, max_limit=100) == expected


@pytest.mark.parametrize(
    "query, param",
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "-3"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "1.5"}, "limit"),
        ({"order": "asc"}, "order"),  # batches are newest first only
        ({"after": "bad id\x00"}, "after"),
        ({"after": "x" * 65}, "after"),
    ],
)
def test_bad_batch_list_queries_are_400_naming_the_parameter(query, param):
    with pytest.raises(BatchInputError) as err:
        parse_page_query(query, default_limit=20, max_limit=100)
    assert err.value.status == 400 and err.value.param == param


def test_file_list_query_takes_order_and_purpose():
    q = parse_page_query(
        {"order": "asc", "purpose": "batch_output", "limit": "3"},
        default_limit=10_000,
        max_limit=10_000,
        orders=("desc", "asc"),
        with_purpose=True,
    )
    assert q == PageQuery(limit=3, order="asc", purpose="batch_output")
    with pytest.raises(BatchInputError, match="order"):
        parse_page_query({"order": "up"}, default_limit=1, max_limit=1, orders=("desc", "asc"))


@pytest.mark.parametrize(
    "n, limit, has_more, first, last",
    [(0, 3, False, None, None), (2, 3, False, "a0", "a1"), (3, 3, False, "a0", "a2"), (4, 3, True, "a0", "a2")],
)
def test_page_is_openais_list_object(n, limit, has_more, first, last):
    items = [{"id": f"a{i}"} for i in range(n)]
    p = page(items, limit)
    assert p["object"] == "list" and len(p["data"]) == min(n, limit)
    assert (p["has_more"], p["first_id"], p["last_id"]) == (has_more, first, last)


# -- expiry ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, seconds",
    [
        (None, None),
        ({"anchor": "created_at", "seconds": 3600}, 3600),
        ({"anchor": "created_at", "seconds": "86400"}, 86400),  # a multipart form field is text
        ({"anchor": "created_at", "seconds": 2_592_000}, 2_592_000),
    ],
)
def test_expires_after_accepted(value, seconds):
    assert parse_expires_after(value) == seconds


@pytest.mark.parametrize(
    "value, param",
    [
        ({"anchor": "created_at", "seconds": 3599}, "expires_after.seconds"),
        ({"anchor": "created_at", "seconds": 2_592_001}, "expires_after.seconds"),
        ({"anchor": "created_at", "seconds": True}, "expires_after.seconds"),
        ({"anchor": "created_at", "seconds": "soon"}, "expires_after.seconds"),
        ({"anchor": "created_at"}, "expires_after.seconds"),
        ({"anchor": "last_active_at", "seconds": 3600}, "expires_after.anchor"),
        ("3600", "expires_after"),
    ],
)
def test_expires_after_refused(value, param):
    with pytest.raises(BatchInputError) as err:
        parse_expires_after(value)
    assert err.value.status == 400 and err.value.param == param


def test_expires_at_and_is_expired():
    assert expires_at(100, None, DEFAULT_RETENTION_S) == 100 + 30 * 86400
    assert expires_at(100, 3600, DEFAULT_RETENTION_S) == 3700
    assert not is_expired(3700, 3699) and is_expired(3700, 3700) and not is_expired(None, 10**12)


# -- the registry: list, delete, cleanup -------------------------------------------------------------


def _upload(reg: Registry, now: int, n: int = 2, expires_after_s: int | None = None) -> dict:
    data = batch_jsonl(n)
    return reg.add_input_file("in.jsonl", data, parse_batch_input(data), now, expires_after_s)


def _finished_batch(reg: Registry, now: int, output_expires_s: int | None = None) -> dict:
    f = _upload(reg, now)
    b = reg.create_batch(f["id"], "/v1/chat/completions", "1h", 3600, None, now, output_expires_s=output_expires_s)
    reg.advance(now)
    for c in reg.claim(10):
        kind = "output" if c.idx == 0 else "error"
        reg.record_result(c.batch_id, c.idx, kind, {"custom_id": c.custom_id})
    reg.advance(now)
    return reg.get_batch(b["id"])


def test_files_list_orders_filters_and_pages(tmp_path):
    reg = Registry(str(tmp_path / "r.sqlite3"))
    ids = [_upload(reg, 1000 + (i // 2))["id"] for i in range(5)]  # ties on created_at keep upload order
    desc = [f["id"] for f in reg.list_files(PageQuery(limit=10))]
    assert desc == ids[::-1]
    asc = reg.list_files(PageQuery(limit=2, order="asc"))
    assert [f["id"] for f in asc] == ids[:3]  # limit + 1: one more says has_more
    after = reg.list_files(PageQuery(limit=10, order="asc", after=ids[1]))
    assert [f["id"] for f in after] == ids[2:]
    after = reg.list_files(PageQuery(limit=10, after=ids[3]))
    assert [f["id"] for f in after] == ids[:3][::-1]
    assert reg.list_files(PageQuery(limit=10, purpose="batch_output")) == []
    with pytest.raises(NotFound):
        reg.list_files(PageQuery(limit=10, after="file_nope"))


def test_an_input_file_in_use_is_refused_until_its_batch_ends(tmp_path):
    reg = Registry(str(tmp_path / "r.sqlite3"))
    f = _upload(reg, 1000)
    b = reg.create_batch(f["id"], "/v1/chat/completions", "1h", 3600, None, 1000)
    with pytest.raises(FileInUse, match=b["id"]):
        reg.delete_file(f["id"])
    reg.cancel(b["id"], 1001)
    reg.advance(1001)
    assert reg.get_batch(b["id"])["status"] == "cancelled"
    assert reg.delete_file(f["id"])["deleted"] is True
    with pytest.raises(NotFound):
        reg.get_file(f["id"])
    with pytest.raises(NotFound):
        reg.delete_file(f["id"])
    assert reg.db.execute("SELECT COUNT(*) FROM input_lines").fetchone()[0] == 0


def test_deleting_an_output_file_removes_its_lines_only(tmp_path):
    reg = Registry(str(tmp_path / "r.sqlite3"))
    b = _finished_batch(reg, 1000)
    assert b["status"] == "completed" and b["output_file_id"] and b["error_file_id"]
    reg.delete_file(b["output_file_id"])
    with pytest.raises(NotFound):
        reg.file_content(b["output_file_id"])
    assert reg.file_content(b["error_file_id"]).count(b"\n") == 1
    assert reg.get_batch(b["id"])["request_counts"] == {"total": 2, "completed": 1, "failed": 1}


def test_files_expire_by_default_retention_or_their_own_expiry(tmp_path):
    reg = Registry(str(tmp_path / "r.sqlite3"), file_retention_s=7200)
    own = _upload(reg, 1000, expires_after_s=3600)
    default = _upload(reg, 1000)
    assert own["expires_at"] == 4600 and default["expires_at"] == 8200
    b = _finished_batch(reg, 1000, output_expires_s=5000)
    assert reg.get_file(b["output_file_id"])["expires_at"] == 6000
    assert reg.expired_files(4599, 10) == []
    assert reg.expired_files(4600, 10) == [own["id"]]
    assert set(reg.expired_files(8200, 10)) == {own["id"], default["id"], b["input_file_id"]} | {
        b["output_file_id"],
        b["error_file_id"],
    }
    assert len(reg.expired_files(8200, 2)) == 2  # bounded


def test_cleanup_deletes_expired_files_in_bounded_passes_and_spares_inputs_of_running_batches(tmp_path):
    clock = FakeClock(start=0.0, wall_offset=1000.0)
    reg = Registry(str(tmp_path / "r.sqlite3"), file_retention_s=3600)

    class Recorder:
        def __init__(self):
            self.seen = []

        def record_deleted(self, deleted, reason):
            self.seen.append((deleted["kind"], reason, deleted["bytes"]))

    metrics = Recorder()
    cleanup = Cleanup(reg, clock, interval_s=60, max_files=2, metrics=metrics)
    running_input = _upload(reg, 1000)
    running = reg.create_batch(running_input["id"], "/v1/chat/completions", "24h", 86400, None, 1000)
    for _ in range(3):
        _upload(reg, 1000)
    assert cleanup.run_once() == []  # nothing has expired yet
    clock.advance(3600)
    assert len(cleanup.run_once()) == 2 and len(cleanup.run_once()) == 1  # at most 2 a pass
    assert cleanup.run_once() == []  # the running batch's input stays
    assert [f["id"] for f in reg.list_files(PageQuery(limit=10))] == [running_input["id"]]
    assert [m[:2] for m in metrics.seen] == [("input", "expired")] * 3 and all(m[2] > 0 for m in metrics.seen)
    reg.cancel(running["id"], 4600)
    reg.advance(4600)
    removed = cleanup.run_once()  # its input, and the error file of the cancelled batch once due
    assert running_input["id"] in {d["id"] for d in removed}
    clock.advance(3600)
    cleanup.run_once()
    assert reg.list_files(PageQuery(limit=10)) == []
    assert reg.get_batch(running["id"])["status"] == "cancelled"  # the batch object stays
    assert cleanup.removed_total == 5


def test_an_old_registry_gets_expiry_columns_on_open(tmp_path):
    import sqlite3

    path = str(tmp_path / "old.sqlite3")
    reg = Registry(path)
    f = _upload(reg, 1000)
    reg.close()
    db = sqlite3.connect(path)
    db.execute("DROP INDEX files_expiry")
    db.execute("ALTER TABLE files DROP COLUMN expires_at")
    db.execute("ALTER TABLE batches DROP COLUMN output_expires_s")
    db.commit()
    db.close()
    reg = Registry(path, file_retention_s=7200)
    assert reg.get_file(f["id"])["expires_at"] == 8200
