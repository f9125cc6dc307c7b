"""The `JobStore` contract, run against every store: memory, SQLite and Redis must pass the same assertions.

The contract is read from `modelserve.jobs.base` (the docstrings of `JobStore` and of the module):

- submit: a new job is queued with nothing else; a taken id is `DuplicateJob` while its record lasts (even
  when the queue is full, since retrying would not help), per API; `JobQueueFull` beyond ``max_queued``
  jobs *waiting* in that API.
- claim: the oldest queued jobs first, up to ``limit``, with what was submitted and the try they are on;
  concurrent claims never hand out one job twice.
- finish: only the owner of a running job records its end, once; the record carries the result or the
  error and the time it ended.
- release: the owner's running job goes back to the queue at its place in submission order (ahead of every
  job submitted after it, whatever order jobs were released in), and that try does not count.
- cancel: a queued or running job is cancelled (its status before is returned); an ended one stays as it
  is; a cancelled running job is no longer its owner's (finish is refused, the heartbeat names it lost).
- heartbeat: renews the leases of exactly the listed jobs the owner runs and names the ids that are no
  longer its own; an unlisted job's lease runs out.
- recover (stores that several processes share): a running job whose lease expired is put back in the
  queue at its place in submission order, and failed the second time (`MAX_ATTEMPTS`, `INTERRUPTED_TWICE`);
  a renewed lease is left alone. A lease is expired at its end time (``end <= now``).
  A store of one process has no leases to lose: its running jobs are never requeued.
- durable stores keep every job across a close and a reopen; another store object over the same data (a
  new process after a crash) recovers the dead owner's jobs.
- retention: an ended record lasts its ``ttl`` and then goes (on `sweep`, or by itself in Redis), freeing
  its id; queued and running jobs never expire.

Time is a fake clock (`now` of every store module); only Redis's own key expiry needs real time to pass,
and waits on Redis's clock for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from uuid import uuid4

import orjson
import pytest

from modelserve.errors import DuplicateJob, JobQueueFull, LoadError
from modelserve.jobs import base, memory, sqlite
from modelserve.jobs import redis as redis_store
from modelserve.jobs.base import (
    CANCELLED,
    COMPLETED,
    FAILED,
    IN_PROGRESS,
    IN_QUEUE,
    INTERRUPTED_TWICE,
    LEASE_SECONDS,
    ClaimedJob,
    JobStore,
    JobView,
    NewJob,
)
from modelserve.jobs.memory import MemoryStore
from modelserve.jobs.redis import RedisStore
from modelserve.jobs.sqlite import SQLiteStore
from tests.conftest import free_port, redis_server

pytestmark = pytest.mark.anyio

API = "m"
OTHER = "other"
TTL = 3600.0
#: The fake clock starts here (any time will do; a fixed one makes failures reproducible).
START = 1_900_000_000.25

KINDS = ["memory", "sqlite", pytest.param("redis", marks=pytest.mark.server)]
SHARED = ["sqlite", pytest.param("redis", marks=pytest.mark.server)]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clock:
    """The time every store reads (`now`), moved by the test."""

    def __init__(self, start: float) -> None:
        self.time = start

    def __call__(self) -> float:
        return self.time

    def advance(self, seconds: float) -> None:
        self.time += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock(START)
    for module in (base, memory, sqlite, redis_store):
        monkeypatch.setattr(module, "now", fake)
    return fake


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One redis-server for the module; every test keeps to a prefix of its own."""
    with redis_server(tmp_path_factory.mktemp("redis")) as port:
        yield f"redis://127.0.0.1:{port}/0"


class Backing:
    """One store's data. Each `open` is another store object over it: another process, for a shared store."""

    def __init__(self, kind: str, clock: Clock, make: Callable[[], JobStore], redis_url: str | None = None) -> None:
        self.kind = kind
        self.clock = clock
        self.make = make
        self.redis_url = redis_url
        #: Redis removes an ended record by itself when its retention passes: `sweep` finds nothing to do.
        self.expires_by_itself = kind == "redis"
        self.opened: list[JobStore] = []

    async def open(self) -> JobStore:
        store = self.make()
        await store.open()
        self.opened.append(store)
        return store

    async def close_all(self) -> None:
        for store in self.opened:
            await store.close()

    async def let_pass(self, seconds: float) -> None:
        """Move the fake clock; for Redis, whose key expiry runs on its own clock, wait until that clock moved
        as far (a condition on Redis's clock, not a guess at how long that takes)."""
        self.clock.advance(seconds)
        if self.redis_url is None:
            return
        client = redis_store._import_redis().asyncio.Redis.from_url(self.redis_url)
        try:
            seconds_now, micros = await client.time()
            until = seconds_now + micros / 1e6 + seconds
            while True:
                seconds_now, micros = await client.time()
                left = until - (seconds_now + micros / 1e6)
                if left < 0:
                    break
                await asyncio.sleep(left)
        finally:
            await client.aclose()


@pytest.fixture(params=KINDS)
async def backing(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> AsyncIterator[Backing]:
    kind: str = request.param
    if kind == "memory":
        made = Backing(kind, clock, MemoryStore)
    elif kind == "sqlite":
        made = Backing(kind, clock, lambda: SQLiteStore(tmp_path / "jobs.db"))
    else:
        url: str = request.getfixturevalue("redis_url")
        prefix = f"contract-{uuid4().hex}"
        made = Backing(kind, clock, lambda: RedisStore(url, prefix), redis_url=url)
    try:
        yield made
    finally:
        await made.close_all()


@pytest.fixture
async def store(backing: Backing) -> JobStore:
    return await backing.open()


def new_job(job_id: str, api: str = API, kind: str = "json", payload: bytes | None = None) -> NewJob:
    if payload is None:
        payload = orjson.dumps({"job": job_id})
    return NewJob(api, job_id, kind, payload)


async def submit_all(store: JobStore, *job_ids: str, api: str = API, max_queued: int = 100) -> None:
    for job_id in job_ids:
        await store.submit(new_job(job_id, api), max_queued)


async def status(store: JobStore, job_id: str, api: str = API) -> str | None:
    view = await store.get(api, job_id)
    return None if view is None else view.status


def ids(claimed: list[ClaimedJob]) -> list[str]:
    return [job.id for job in claimed]


# -------------------------------------------------------------------------------------------------
# what each store declares


@pytest.mark.parametrize(
    ("backing", "durable", "shared", "polls"),
    [
        ("memory", False, False, False),
        ("sqlite", True, True, True),
        pytest.param("redis", True, True, True, marks=pytest.mark.server),
    ],
    indirect=["backing"],
)
async def test_each_store_declares_what_it_offers(
    backing: Backing, store: JobStore, durable: bool, shared: bool, polls: bool
) -> None:
    assert store.durable is durable
    assert store.shared is shared
    # A shared store is told of jobs submitted in other processes only by asking for them.
    assert (store.poll_interval is not None and store.poll_interval > 0) is polls
    assert isinstance(store.description, str) and store.description


async def test_check_passes_for_a_store_that_opens(store: JobStore) -> None:
    store.check()


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_check_of_a_store_that_cannot_open_is_a_load_error(kind: str, tmp_path: Path) -> None:
    if kind == "sqlite":
        (tmp_path / "file").write_text("not a folder")
        broken: JobStore = SQLiteStore(tmp_path / "file" / "jobs.db")
    else:
        broken = RedisStore(f"redis://127.0.0.1:{free_port()}/0", "p")
    with pytest.raises(LoadError):
        broken.check()


# -------------------------------------------------------------------------------------------------
# submit and status reads


async def test_a_submitted_job_is_queued_with_nothing_else(store: JobStore) -> None:
    await store.submit(new_job("a"), 10)
    assert await store.get(API, "a") == JobView("a", IN_QUEUE, None, None, None)
    assert await store.queued(API) == 1
    assert await store.queued(OTHER) == 0


async def test_an_unknown_job_reads_as_none(store: JobStore) -> None:
    await store.submit(new_job("a"), 10)
    assert await store.get(API, "b") is None
    assert await store.get(OTHER, "a") is None


async def test_a_taken_id_is_a_duplicate_while_its_record_lasts(store: JobStore) -> None:
    await store.submit(new_job("a", payload=b'"first"'), 10)
    with pytest.raises(DuplicateJob):
        await store.submit(new_job("a", payload=b'"second"'), 10)
    assert await store.queued(API) == 1
    [claimed] = await store.claim(API, "o1")
    assert claimed.payload == b'"first"'
    with pytest.raises(DuplicateJob):
        await store.submit(new_job("a"), 10)
    assert await store.finish(API, "a", "o1", COMPLETED, b"1", None, TTL)
    with pytest.raises(DuplicateJob):
        await store.submit(new_job("a"), 10)
    assert await store.queued(API) == 0
    assert await status(store, "a") == COMPLETED


async def test_the_same_id_in_two_apis_is_two_jobs(store: JobStore) -> None:
    await store.submit(new_job("a", payload=b'"mine"'), 10)
    await store.submit(new_job("a", api=OTHER, payload=b'"theirs"'), 10)
    [claimed] = await store.claim(OTHER, "o1")
    assert (claimed.api, claimed.payload) == (OTHER, b'"theirs"')
    assert await status(store, "a") == IN_QUEUE
    assert await status(store, "a", OTHER) == IN_PROGRESS


async def test_the_queue_limit_counts_only_the_waiting_jobs_of_the_api(store: JobStore) -> None:
    await submit_all(store, "a", "b", max_queued=2)
    with pytest.raises(JobQueueFull):
        await store.submit(new_job("c"), 2)
    assert await store.get(API, "c") is None
    await store.submit(new_job("c", api=OTHER), 2)  # another API's queue is its own
    await store.claim(API, "o1")  # a running job does not wait
    await store.submit(new_job("c"), 2)
    with pytest.raises(JobQueueFull):
        await store.submit(new_job("d"), 2)
    assert await store.cancel(API, "b", TTL) == IN_QUEUE  # a cancelled job does not wait either
    await store.submit(new_job("d"), 2)
    assert await store.queued(API) == 2


async def test_a_duplicate_id_is_a_duplicate_even_when_the_queue_is_full(store: JobStore) -> None:
    """The client must send another id: 'retry later' (a full queue) would only earn it a duplicate then."""
    await store.submit(new_job("a"), 1)
    with pytest.raises(DuplicateJob):
        await store.submit(new_job("a"), 1)


async def test_concurrent_submits_of_one_id_admit_exactly_one(store: JobStore) -> None:
    outcomes = await asyncio.gather(
        *(store.submit(new_job("a", payload=str(n).encode()), 10) for n in range(6)), return_exceptions=True
    )
    assert sum(outcome is None for outcome in outcomes) == 1
    assert all(isinstance(outcome, DuplicateJob) for outcome in outcomes if outcome is not None)
    assert await store.queued(API) == 1


# -------------------------------------------------------------------------------------------------
# claim and ordering


async def test_claims_take_the_oldest_jobs_first_up_to_the_limit(store: JobStore) -> None:
    await submit_all(store, "j0", "j1", "j2", "j3", "j4")
    first = await store.claim(API, "o1", 2)
    assert ids(first) == ["j0", "j1"]
    assert ids(await store.claim(API, "o2", 10)) == ["j2", "j3", "j4"]
    assert await store.claim(API, "o1", 10) == []
    assert [await status(store, f"j{n}") for n in range(5)] == [IN_PROGRESS] * 5
    assert await store.queued(API) == 0


async def test_a_claim_hands_over_what_was_submitted_on_its_first_try(store: JobStore) -> None:
    submitted = [
        new_job("j", kind="json", payload=b'{"x":[1,2]}'),
        new_job("t", kind="text", payload="h\u00e9llo".encode()),
        new_job("b", kind="bytes", payload=bytes(range(256))),
    ]
    for job in submitted:
        await store.submit(job, 10)
    claimed = await store.claim(API, "o1", 3)
    assert claimed == [ClaimedJob(API, job.id, job.kind, job.payload, 1) for job in submitted]


async def test_jobs_of_another_api_are_never_claimed(store: JobStore) -> None:
    await submit_all(store, "a", api=OTHER)
    assert await store.claim(API, "o1", 10) == []
    assert await status(store, "a", OTHER) == IN_QUEUE


async def test_concurrent_claims_never_hand_out_one_job_twice(store: JobStore) -> None:
    everything = [f"j{n:02d}" for n in range(20)]
    await submit_all(store, *everything)
    batches = await asyncio.gather(*(store.claim(API, f"o{n}", 3) for n in range(10)))
    claimed = [job_id for batch in batches for job_id in ids(batch)]
    assert sorted(claimed) == everything
    for batch in batches:
        assert ids(batch) == sorted(ids(batch))  # each batch oldest first


# -------------------------------------------------------------------------------------------------
# finish


@pytest.mark.parametrize(
    ("outcome", "result", "error"), [(COMPLETED, b'{"y":1}', None), (FAILED, None, "predict raised ValueError: no")]
)
async def test_finish_records_the_end_with_its_result_or_error_and_time(
    store: JobStore, clock: Clock, outcome: str, result: bytes | None, error: str | None
) -> None:
    await submit_all(store, "a")
    await store.claim(API, "o1")
    clock.advance(2.5)
    assert await store.finish(API, "a", "o1", outcome, result, error, TTL) is True
    assert await store.get(API, "a") == JobView("a", outcome, result, error, clock.time)
    assert await store.claim(API, "o1") == []


async def test_a_completed_jobs_document_carries_the_stored_result(store: JobStore) -> None:
    await submit_all(store, "a")
    await store.claim(API, "o1")
    await store.finish(API, "a", "o1", COMPLETED, b'{"y":[1,2]}', None, TTL)
    view = await store.get(API, "a")
    assert view is not None
    document = orjson.loads(view.to_json())
    assert document == {"id": "a", "status": COMPLETED, "result": {"y": [1, 2]}, "timestamp": base.iso(START)}


async def test_only_the_owner_finishes_a_job_and_only_once(store: JobStore) -> None:
    await submit_all(store, "a", "q")
    await store.claim(API, "o1")
    assert await store.finish(API, "a", "stranger", COMPLETED, b"0", None, TTL) is False
    assert await status(store, "a") == IN_PROGRESS
    assert await store.finish(API, "a", "o1", COMPLETED, b"1", None, TTL) is True
    assert await store.finish(API, "a", "o1", COMPLETED, b"2", None, TTL) is False
    assert await store.finish(API, "a", "o1", FAILED, None, "late", TTL) is False
    view = await store.get(API, "a")
    assert view is not None and (view.status, view.result, view.error) == (COMPLETED, b"1", None)
    # Nobody owns a queued job or an unknown one.
    assert await store.finish(API, "q", "o1", COMPLETED, b"1", None, TTL) is False
    assert await status(store, "q") == IN_QUEUE
    assert await store.finish(API, "nobody", "o1", COMPLETED, b"1", None, TTL) is False
    assert await store.get(API, "nobody") is None


# -------------------------------------------------------------------------------------------------
# release


async def test_a_released_job_goes_back_to_the_head_of_the_queue_without_counting_a_try(store: JobStore) -> None:
    await submit_all(store, "a", "b")
    [claimed] = await store.claim(API, "o1")
    assert claimed.attempts == 1
    await store.release(API, "a", "o1")
    assert await store.get(API, "a") == JobView("a", IN_QUEUE, None, None, None)
    assert await store.queued(API) == 2
    again = await store.claim(API, "o2", 10)
    assert ids(again) == ["a", "b"]
    assert again[0].attempts == 1


@pytest.mark.parametrize("released", [["a", "b"], ["b", "a"]])
async def test_released_jobs_are_claimed_again_in_submission_order(store: JobStore, released: list[str]) -> None:
    """The order a stopping worker releases its jobs in is the order their tasks happen to end: not an order."""
    await submit_all(store, "a", "b", "c")
    assert ids(await store.claim(API, "o1", 2)) == ["a", "b"]
    for job_id in released:
        await store.release(API, job_id, "o1")
    assert ids(await store.claim(API, "o2", 10)) == ["a", "b", "c"]


async def test_a_release_by_a_stranger_or_a_second_time_changes_nothing(store: JobStore) -> None:
    await submit_all(store, "a", "b")
    await store.claim(API, "o1")
    await store.release(API, "a", "stranger")
    assert await status(store, "a") == IN_PROGRESS
    await store.release(API, "a", "o1")
    await store.release(API, "a", "o1")
    assert await store.queued(API) == 2
    assert ids(await store.claim(API, "o2", 10)) == ["a", "b"]  # queued once, not twice
    assert await store.claim(API, "o2", 10) == []


async def test_a_cancelled_job_is_not_released_back_into_the_queue(store: JobStore) -> None:
    await submit_all(store, "a")
    await store.claim(API, "o1")
    await store.cancel(API, "a", TTL)
    await store.release(API, "a", "o1")
    assert await status(store, "a") == CANCELLED
    assert await store.queued(API) == 0
    assert await store.claim(API, "o1") == []


# -------------------------------------------------------------------------------------------------
# cancel


async def test_a_cancelled_queued_job_is_never_claimed(store: JobStore, clock: Clock) -> None:
    await submit_all(store, "a", "b", "c")
    clock.advance(1.0)
    assert await store.cancel(API, "b", TTL) == IN_QUEUE
    assert await store.get(API, "b") == JobView("b", CANCELLED, None, None, clock.time)
    assert await store.queued(API) == 2
    assert ids(await store.claim(API, "o1", 10)) == ["a", "c"]


async def test_a_cancelled_running_job_is_no_longer_its_owners(store: JobStore, clock: Clock) -> None:
    await submit_all(store, "a")
    await store.claim(API, "o1")
    clock.advance(1.0)
    assert await store.cancel(API, "a", TTL) == IN_PROGRESS
    assert await store.heartbeat(API, "o1", ["a"]) == {"a"}
    assert await store.finish(API, "a", "o1", COMPLETED, b"1", None, TTL) is False
    assert await store.get(API, "a") == JobView("a", CANCELLED, None, None, clock.time)


async def test_an_ended_job_stays_as_it_is_when_cancelled(store: JobStore) -> None:
    await submit_all(store, "done", "gone")
    await store.claim(API, "o1", 2)
    await store.finish(API, "done", "o1", COMPLETED, b"1", None, TTL)
    before = await store.get(API, "done")
    assert await store.cancel(API, "done", TTL) == COMPLETED
    assert await store.get(API, "done") == before
    assert await store.cancel(API, "gone", TTL) == IN_PROGRESS
    assert await store.cancel(API, "gone", TTL) == CANCELLED


async def test_cancelling_an_unknown_job_is_none(store: JobStore) -> None:
    await submit_all(store, "a", api=OTHER)
    assert await store.cancel(API, "a", TTL) is None
    assert await store.get(API, "a") is None
    assert await status(store, "a", OTHER) == IN_QUEUE


# -------------------------------------------------------------------------------------------------
# heartbeat and leases


async def test_the_heartbeat_names_the_jobs_that_are_no_longer_the_owners(store: JobStore) -> None:
    await submit_all(store, "mine", "cancelled", "finished", "theirs")
    await store.claim(API, "o1", 3)
    await store.claim(API, "o2")
    await store.cancel(API, "cancelled", TTL)
    await store.finish(API, "finished", "o1", COMPLETED, b"1", None, TTL)
    listed = ["mine", "cancelled", "finished", "theirs", "unknown"]
    assert await store.heartbeat(API, "o1", listed) == {"cancelled", "finished", "theirs", "unknown"}
    assert await store.heartbeat(API, "o1", ["mine"]) == set()
    assert await store.heartbeat(API, "o1", []) == set()
    assert await status(store, "mine") == IN_PROGRESS


@pytest.mark.parametrize("backing", SHARED, indirect=True)
async def test_an_expired_lease_puts_the_job_back_once_then_fails_it(store: JobStore, clock: Clock) -> None:
    await submit_all(store, "a", "b")
    assert ids(await store.claim(API, "dead")) == ["a"]
    clock.advance(LEASE_SECONDS + 1)
    assert await store.recover(API, TTL) == (1, 0)
    assert await store.get(API, "a") == JobView("a", IN_QUEUE, None, None, None)
    assert await store.queued(API) == 2
    # The process that lost the lease has lost the job.
    assert await store.heartbeat(API, "dead", ["a"]) == {"a"}
    assert await store.finish(API, "a", "dead", COMPLETED, b"1", None, TTL) is False

    [retry] = await store.claim(API, "second")
    assert (retry.id, retry.attempts) == ("a", 2)  # before the jobs submitted after it
    clock.advance(LEASE_SECONDS + 1)
    assert await store.recover(API, TTL) == (0, 1)
    assert await store.get(API, "a") == JobView("a", FAILED, None, INTERRUPTED_TWICE, clock.time)
    assert await store.finish(API, "a", "second", COMPLETED, b"1", None, TTL) is False
    assert await store.recover(API, TTL) == (0, 0)
    assert ids(await store.claim(API, "third", 10)) == ["b"]


@pytest.mark.parametrize("backing", SHARED, indirect=True)
async def test_a_renewed_lease_is_not_recovered(store: JobStore, clock: Clock) -> None:
    await submit_all(store, "a")
    await store.claim(API, "o1")
    clock.advance(LEASE_SECONDS - 1)
    assert await store.heartbeat(API, "o1", ["a"]) == set()
    clock.advance(LEASE_SECONDS - 1)  # past the first lease, within the renewed one
    assert await store.recover(API, TTL) == (0, 0)
    assert await status(store, "a") == IN_PROGRESS
    clock.advance(2)
    assert await store.recover(API, TTL) == (1, 0)


@pytest.mark.parametrize("backing", SHARED, indirect=True)
async def test_a_heartbeat_renews_only_the_listed_jobs(store: JobStore, clock: Clock) -> None:
    """A job its owner no longer lists (its task lost) is not kept alive by the owner's other jobs."""
    await submit_all(store, "listed", "unlisted")
    await store.claim(API, "o1", 2)
    clock.advance(LEASE_SECONDS - 1)
    assert await store.heartbeat(API, "o1", ["listed"]) == set()
    clock.advance(1)
    assert await store.recover(API, TTL) == (1, 0)
    assert [await status(store, "listed"), await status(store, "unlisted")] == [IN_PROGRESS, IN_QUEUE]


@pytest.mark.parametrize("backing", SHARED, indirect=True)
async def test_a_lease_is_expired_at_its_end_time(store: JobStore, clock: Clock) -> None:
    await submit_all(store, "a")
    await store.claim(API, "o1")
    clock.advance(LEASE_SECONDS - 0.25)  # quarters add up exactly in binary: the clock lands on the lease end
    assert await store.recover(API, TTL) == (0, 0)
    clock.advance(0.25)
    assert await store.recover(API, TTL) == (1, 0)
    assert await status(store, "a") == IN_QUEUE


@pytest.mark.parametrize("backing", SHARED, indirect=True)
async def test_recovered_jobs_are_claimed_again_in_submission_order(store: JobStore, clock: Clock) -> None:
    """Jobs claimed together expire together; their ids say nothing of their order ("b" came first here)."""
    await submit_all(store, "b", "a")
    await store.claim(API, "dead", 2)
    await submit_all(store, "c")
    clock.advance(LEASE_SECONDS + 1)
    assert await store.recover(API, TTL) == (2, 0)
    assert ids(await store.claim(API, "o1", 10)) == ["b", "a", "c"]


@pytest.mark.parametrize("backing", SHARED, indirect=True)
async def test_recovery_takes_only_the_expired_leases_of_its_api(store: JobStore, clock: Clock) -> None:
    await submit_all(store, "early", "late")
    await submit_all(store, "elsewhere", api=OTHER)
    await store.claim(API, "o1")
    await store.claim(OTHER, "o1")
    clock.advance(LEASE_SECONDS / 2)
    await store.claim(API, "o2")
    clock.advance(LEASE_SECONDS / 2 + 1)
    assert await store.recover(API, TTL) == (1, 0)
    assert [await status(store, "early"), await status(store, "late")] == [IN_QUEUE, IN_PROGRESS]
    assert await status(store, "elsewhere", OTHER) == IN_PROGRESS
    assert await store.recover(OTHER, TTL) == (1, 0)


@pytest.mark.parametrize("backing", SHARED, indirect=True)
async def test_a_cancelled_job_whose_lease_ran_out_stays_cancelled(store: JobStore, clock: Clock) -> None:
    await submit_all(store, "a")
    await store.claim(API, "o1")
    await store.cancel(API, "a", TTL)
    clock.advance(LEASE_SECONDS + 1)
    assert await store.recover(API, TTL) == (0, 0)
    assert await status(store, "a") == CANCELLED


@pytest.mark.parametrize("backing", ["memory"], indirect=True)
async def test_a_store_of_one_process_never_requeues_its_running_jobs(store: JobStore, clock: Clock) -> None:
    """Its jobs live and die with the one process that runs them: no lease can outlive its owner."""
    await submit_all(store, "a")
    await store.claim(API, "o1")
    clock.advance(1e6)
    assert await store.recover(API, TTL) == (0, 0)
    assert await status(store, "a") == IN_PROGRESS
    assert await store.finish(API, "a", "o1", COMPLETED, b"1", None, TTL) is True


# -------------------------------------------------------------------------------------------------
# durability: a store object is a process; its data outlives it


@pytest.mark.parametrize("backing", SHARED, indirect=True)
async def test_a_durable_store_keeps_every_job_across_a_reopen(backing: Backing, clock: Clock) -> None:
    first = await backing.open()
    await submit_all(first, "running", "done", "cancelled", "queued")
    await first.claim(API, "o1", 2)
    await first.finish(API, "done", "o1", COMPLETED, b'"r"', None, TTL)
    await first.cancel(API, "cancelled", TTL)
    before = {job_id: await first.get(API, job_id) for job_id in ("queued", "running", "done", "cancelled")}
    await first.close()

    second = await backing.open()
    assert {job_id: await second.get(API, job_id) for job_id in before} == before
    assert await second.queued(API) == 1
    assert ids(await second.claim(API, "o2", 10)) == ["queued"]


@pytest.mark.parametrize("backing", SHARED, indirect=True)
async def test_another_process_recovers_the_jobs_of_one_that_crashed(backing: Backing, clock: Clock) -> None:
    crashed = await backing.open()
    survivor = await backing.open()
    await submit_all(crashed, "a", "b")
    assert ids(await crashed.claim(API, "crashed-owner", 2)) == ["a", "b"]
    await survivor.submit(new_job("c"), 10)
    # The crashed process never heartbeats again; the survivor's upkeep notices once the leases ran out.
    clock.advance(LEASE_SECONDS + 1)
    assert await survivor.recover(API, TTL) == (2, 0)
    taken = await survivor.claim(API, "survivor-owner", 10)
    assert [(job.id, job.attempts) for job in taken] == [("a", 2), ("b", 2), ("c", 1)]
    assert await survivor.finish(API, "a", "survivor-owner", COMPLETED, b"1", None, TTL) is True
    assert await crashed.finish(API, "b", "crashed-owner", COMPLETED, b"1", None, TTL) is False


# -------------------------------------------------------------------------------------------------
# retention


async def test_records_stay_until_their_retention_passes(store: JobStore, clock: Clock) -> None:
    await submit_all(store, "done", "failed", "cancelled")
    await store.claim(API, "o1", 2)
    await store.finish(API, "done", "o1", COMPLETED, b"1", None, TTL)
    await store.finish(API, "failed", "o1", FAILED, None, "no", TTL)
    await store.cancel(API, "cancelled", TTL)
    clock.advance(TTL - 1)
    assert await store.sweep() == 0
    assert [await status(store, job_id) for job_id in ("done", "failed", "cancelled")] == [COMPLETED, FAILED, CANCELLED]


async def test_queued_and_running_jobs_never_expire(store: JobStore, clock: Clock) -> None:
    await submit_all(store, "running", "queued")
    await store.claim(API, "o1")
    clock.advance(100 * TTL)
    assert await store.sweep() == 0
    assert await status(store, "running") == IN_PROGRESS
    assert await status(store, "queued") == IN_QUEUE


async def test_an_ended_record_goes_once_its_retention_passed_and_frees_its_id(
    backing: Backing, store: JobStore
) -> None:
    await submit_all(store, "done", "cancelled", "failed", "kept")
    await store.claim(API, "o1", 3)
    short = 0.001
    await store.finish(API, "done", "o1", COMPLETED, b"1", None, short)
    await store.finish(API, "failed", "o1", FAILED, None, "no", short)
    await store.cancel(API, "cancelled", short)
    await backing.let_pass(short)
    removed = await store.sweep()
    assert removed == (0 if backing.expires_by_itself else 3)
    assert await store.sweep() == 0
    for job_id in ("done", "cancelled", "failed"):
        assert await store.get(API, job_id) is None
        await store.submit(new_job(job_id), 10)
    assert ids(await store.claim(API, "o1", 10)) == ["kept", "done", "cancelled", "failed"]
