"""The file lease of a shared SQLite table: exclusive takes, fenced renewals, the successor's wait."""

from __future__ import annotations

import os
import threading

import pytest

from services.scheduler.adapters.file_lease import FileLease, LeaseFileError

TTL_S = 5.0


class Wall:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def wall():
    return Wall()


@pytest.fixture
def lease(tmp_path, wall):
    opened = FileLease(tmp_path / "t.lease", wall)
    opened.open()
    return opened


def test_the_first_take_is_epoch_one_and_the_holder_renews_it(lease, wall):
    got = lease.acquire("A", "a:1", TTL_S, 0)
    assert got.held and got.epoch == 1 and got.record.address == "a:1"
    wall.now += TTL_S - 1
    assert lease.renew("A", "a:1", 1, TTL_S).held
    wall.now += TTL_S - 1  # past the first expiry, within the renewed one
    assert not lease.acquire("B", "b:1", TTL_S, 0).held
    assert lease.current_epoch() == 1


def test_an_expired_lease_cannot_be_renewed_and_goes_to_the_next_taker(lease, wall):
    lease.acquire("A", "a:1", TTL_S, 0)
    wall.now += TTL_S + 0.1
    assert not lease.renew("A", "a:1", 1, TTL_S).held
    got = lease.acquire("B", "b:1", TTL_S, 0)
    assert got.held and got.epoch == 2
    renew = lease.renew("A", "a:1", 1, TTL_S)
    assert not renew.held and renew.record.holder == "B" and renew.epoch == 2


def test_of_replicas_racing_for_one_epoch_exactly_one_wins(tmp_path, wall):
    replicas = [FileLease(tmp_path / "t.lease", wall) for _ in range(8)]
    for replica in replicas:
        replica.open()
    start = threading.Barrier(len(replicas))
    answers = []

    def take(i: int) -> None:
        start.wait()
        answers.append(replicas[i].acquire(f"R{i}", f"r:{i}", TTL_S, 0))

    threads = [threading.Thread(target=take, args=(i,)) for i in range(len(replicas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert sum(a.held for a in answers) == 1
    winner = next(a for a in answers if a.held)
    assert {a.record.holder for a in answers if not a.held and a.record} <= {winner.record.holder}


def test_a_renewal_that_lands_after_a_successor_read_the_lease_expired_makes_the_successor_wait(tmp_path, wall):
    """The successor read A's lease expired, then A renewed (it saw no later epoch), then the successor
    took epoch 2: it does not lead until the renewed expiry has passed, and A's next renewal fails."""
    a = FileLease(tmp_path / "t.lease", wall)
    a.open()
    a.acquire("A", "a:1", TTL_S, 0)

    class Racing(FileLease):
        def _create(self, epoch, holder, address, expires_at):
            wall.now -= 0.5  # A renews just before its expiry, between B's read and B's take
            assert a.renew("A", "a:1", 1, TTL_S).held
            wall.now += 0.5
            return super()._create(epoch, holder, address, expires_at)

    b = Racing(tmp_path / "t.lease", wall)
    wall.now += TTL_S + 0.1  # B sees A's lease expired
    first = b.acquire("B", "b:1", TTL_S, 0)
    assert not first.held and first.record.holder == "A" and first.epoch == 1
    assert not a.renew("A", "a:1", 1, TTL_S).held  # epoch 2 exists: A's term ends at its deadline
    again = FileLease(tmp_path / "t.lease", wall)
    wall.now += TTL_S / 2  # B asks again: A's renewed lease still runs, B keeps its take of epoch 2
    waiting = again.acquire("B", "b:1", TTL_S, 0)
    assert not waiting.held and waiting.record.holder == "A"
    assert again.acquire("C", "c:1", TTL_S, 0).record.holder == "B"  # nobody else takes a later epoch
    wall.now += TTL_S / 2  # A's renewed lease has run out
    later = again.acquire("B", "b:1", TTL_S, 0)
    assert later.held and later.epoch == 2


def test_a_take_goes_above_every_epoch_the_replica_saw(lease):
    got = lease.acquire("A", "a:1", TTL_S, 41)
    assert got.held and got.epoch == 42 and lease.current_epoch() == 42


def test_a_released_lease_is_taken_at_once_and_only_its_holder_releases_it(lease):
    lease.acquire("A", "a:1", TTL_S, 0)
    lease.release("B", 1)  # not the holder: nothing happens
    assert not lease.acquire("B", "b:1", TTL_S, 0).held
    lease.release("A", 1)
    got = lease.acquire("B", "b:1", TTL_S, 0)
    assert got.held and got.epoch == 2


def test_old_epochs_and_stale_temporary_files_are_removed(lease, wall, tmp_path):
    stale = tmp_path / "t.lease" / ".tmp-1-dead"
    stale.write_bytes(b"{}")
    os.utime(stale, (0, 0))
    for i in range(5):
        assert lease.acquire(f"R{i}", "r:1", TTL_S, 0).held
        wall.now += TTL_S + 1
    assert lease.epochs() == [4, 5]
    assert not stale.exists()


def test_a_damaged_lease_file_is_an_error_naming_it(lease):
    lease.acquire("A", "a:1", TTL_S, 0)
    (lease.directory / "epoch-1").write_bytes(b"not json")
    with pytest.raises(LeaseFileError, match="epoch-1"):
        lease.renew("A", "a:1", 1, TTL_S)


def test_an_unusable_lease_directory_is_an_error_naming_it(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(LeaseFileError, match="lease directory"):
        FileLease(blocker / "t.lease").open()
