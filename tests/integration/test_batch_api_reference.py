"""Issue 23: every call of OpenAI's Files, Batches and Models reference, with the official `openai` client on
the ROUTER's base URL of a real `bandmaster up` (router -> batch service pass-through for files and batches,
the router itself for models), including files.list and files.delete (405 before) and models.retrieve (404
before); and `bandmaster batch submit --wait` on the same cluster."""

from __future__ import annotations

import functools
import io

import openai
import pytest

from tests.integration.test_planner_e2e import MODEL, _up, batch_file, completed
from tests.support.eventually import wait_until
from tests.support.processes import run_module

pytestmark = pytest.mark.integration


def test_every_files_batches_and_models_call_through_the_router(tmp_path):
    state = tmp_path / "state"
    proc, base_url = _up(state, "--workers", "1")
    try:
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0)
        # Models (the router's own).
        assert [m.id for m in client.models.list().data] == [MODEL]
        model = client.models.retrieve(MODEL)
        assert model.id == MODEL and model.object == "model"
        with pytest.raises(openai.NotFoundError) as missing:
            client.models.retrieve("no-such-model")
        assert missing.value.body["code"] == "model_not_found"

        # Files: create (with and without expires_after), retrieve, list, content.
        uploads = [
            client.files.create(file=(f"in{i}.jsonl", io.BytesIO(batch_file(2))), purpose="batch") for i in range(3)
        ]
        short = client.files.create(
            file=("short.jsonl", io.BytesIO(batch_file(1))),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 3600},
        )
        assert short.expires_at == short.created_at + 3600
        assert uploads[0].expires_at == uploads[0].created_at + 30 * 86400  # OpenAI's default, --file-retention-seconds
        assert client.files.retrieve(uploads[1].id).filename == "in1.jsonl"
        assert client.files.content(uploads[2].id).content == batch_file(2)
        ids = [f.id for f in uploads] + [short.id]
        assert [f.id for f in client.files.list(limit=2, order="asc")] == ids  # auto-paginates via `after`
        first = client.files.list(limit=3)
        assert [f.id for f in first.data] == ids[::-1][:3] and first.has_more
        assert [f.id for f in client.files.list(purpose="batch", after=first.data[-1].id).data] == [ids[0]]

        # Batches: create, retrieve, list (paginated), cancel; outputs by files.content.
        batch = client.batches.create(
            input_file_id=uploads[0].id, endpoint="/v1/chat/completions", completion_window="1h"
        )
        ended = completed(client, batch.id, 90)
        assert ended.request_counts.completed == 2
        assert len(client.files.content(ended.output_file_id).text.splitlines()) == 2
        output = client.files.retrieve(ended.output_file_id)
        assert output.purpose == "batch_output" and output.expires_at == output.created_at + 30 * 86400
        assert [f.id for f in client.files.list(purpose="batch_output").data] == [ended.output_file_id]
        # A batch the lease cannot finish before it is cancelled: a big one, cancelled at once.
        big = client.files.create(file=("big.jsonl", io.BytesIO(batch_file(2000))), purpose="batch")
        doomed = client.batches.create(input_file_id=big.id, endpoint="/v1/chat/completions", completion_window="24h")
        with pytest.raises(openai.ConflictError) as in_use:  # its input is still in use
            client.files.delete(big.id)
        assert in_use.value.body["code"] == "file_in_use"
        assert client.batches.cancel(doomed.id).status in ("cancelling", "cancelled")
        wait_until(lambda: client.batches.retrieve(doomed.id).status == "cancelled", timeout_s=60, interval_s=0.25)
        page = client.batches.list(limit=1)
        assert [b.id for b in page.data] == [doomed.id] and page.has_more and page.last_id == doomed.id
        assert [b.id for b in client.batches.list(limit=1, after=page.last_id).data] == [batch.id]
        assert [b.id for b in client.batches.list(limit=1)] == [doomed.id, batch.id]

        # Files: delete (an ended batch's input, an output file), then 404 for it everywhere.
        for file_id in (big.id, ended.output_file_id, short.id):
            deleted = client.files.delete(file_id)
            assert (deleted.id, deleted.object, deleted.deleted) == (file_id, "file", True)
            with pytest.raises(openai.NotFoundError):
                client.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            client.files.delete(short.id)
        with pytest.raises(openai.BadRequestError) as bad:
            client.files.list(limit=0)
        assert bad.value.body["param"] == "limit"

        # The CLI waits for its batch and names the output file.
        (tmp_path / "in.jsonl").write_bytes(batch_file(3))
        cli = functools.partial(run_module, "services.cli")
        waited = cli(
            "batch", "--base-url", base_url, "submit", str(tmp_path / "in.jsonl"), "--wait", "--poll-seconds", "0.5"
        )
        assert waited.returncode == 0, waited.stderr
        batch_id, summary = waited.stdout.strip().splitlines()
        assert summary.startswith(f"{batch_id} completed: 3/3 completed, 0 failed; output file file_")
        assert "3/3" in waited.stderr  # the progress bar's last line
        shown = cli("status", "--state-dir", str(state), "--once")
        assert "batch service: SERVING" in shown.stdout, shown.stdout + shown.stderr
    finally:
        proc.stop(grace_s=60)
    assert proc.returncode == 0
