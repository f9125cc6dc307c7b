"""The Redis job store: several processes or machines share one queue.

Keys (``P`` is the ``prefix`` of the ``jobs:`` block, ``A`` the API's name)::

    P:A:job:<id>   a hash: seq, status, kind, payload, attempts, owner, result, error, finished, trace (the
                   submit's trace context, with tracing on)
    P:A:queue      a list of queued job ids in submission order (by seq)
    P:A:seq        the counter that numbers the API's submissions (a job's seq)
    P:A:running    a sorted set of running job ids, scored by the time their lease expires

Every change is one Lua script, so claiming, finishing and cancelling are atomic across processes. An ended
job's hash expires after the API's ``result_ttl`` (Redis key expiry); queued and running jobs never expire.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from modelserve.errors import DuplicateJob, JobQueueFull, LoadError, MissingExtraError
from modelserve.jobs.base import (
    INTERRUPTED_TWICE,
    LEASE_SECONDS,
    MAX_ATTEMPTS,
    ClaimedJob,
    JobStore,
    JobView,
    NewJob,
    now,
)

if TYPE_CHECKING:
    from modelserve.config import JobsConfig


SUBMIT = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 'duplicate' end
if redis.call('LLEN', KEYS[2]) >= tonumber(ARGV[4]) then return 'full' end
local seq = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], 'seq', seq, 'status', 'in_queue', 'kind', ARGV[2], 'payload', ARGV[3], 'attempts', 0)
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'trace', ARGV[5]) end
redis.call('RPUSH', KEYS[2], ARGV[1])
return 'ok'
"""

CLAIM = """
local claimed = {}
while #claimed < tonumber(ARGV[4]) do
  local id = redis.call('LPOP', KEYS[1])
  if not id then break end
  local key = ARGV[1] .. id
  if redis.call('HGET', key, 'status') == 'in_queue' then
    local attempts = redis.call('HINCRBY', key, 'attempts', 1)
    redis.call('HSET', key, 'status', 'in_progress', 'owner', ARGV[2])
    redis.call('ZADD', KEYS[2], ARGV[3], id)
    local fields = redis.call('HMGET', key, 'kind', 'payload', 'trace')
    table.insert(claimed, {id, fields[1], fields[2], attempts, fields[3]})
  end
end
return claimed
"""

FINISH = """
local fields = redis.call('HMGET', KEYS[1], 'status', 'owner')
if fields[1] ~= 'in_progress' or fields[2] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'status', ARGV[3], 'finished', ARGV[6])
if ARGV[4] ~= '' then redis.call('HSET', KEYS[1], 'result', ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'error', ARGV[5]) end
redis.call('HDEL', KEYS[1], 'payload', 'owner')
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[7])
return 1
"""

# A job put back goes to its place in submission order. The walk from the head is short: only the other jobs
# put back (released, recovered) can be older than it. A job stored before seq existed counts as the oldest.
# RELEASE and RECOVER call it; it is put in front of them when they are registered.
REQUEUE = """
local function requeue(queue, jobs, id)
  local seq = tonumber(redis.call('HGET', jobs .. id, 'seq')) or 0
  local n = 0
  while true do
    local other = redis.call('LINDEX', queue, n)
    if not other then
      redis.call('RPUSH', queue, id)
      return
    end
    if (tonumber(redis.call('HGET', jobs .. other, 'seq')) or 0) > seq then
      redis.call('LINSERT', queue, 'BEFORE', other, id)
      return
    end
    n = n + 1
  end
end
"""

RELEASE = """
local fields = redis.call('HMGET', KEYS[1], 'status', 'owner')
if fields[1] == 'in_progress' and fields[2] == ARGV[2] then
  redis.call('HSET', KEYS[1], 'status', 'in_queue')
  redis.call('HDEL', KEYS[1], 'owner')
  redis.call('HINCRBY', KEYS[1], 'attempts', -1)
  requeue(KEYS[2], ARGV[3], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
end
return 0
"""

CANCEL = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return false end
if status == 'in_queue' then redis.call('LREM', KEYS[2], 0, ARGV[1]) end
if status == 'in_queue' or status == 'in_progress' then
  redis.call('HSET', KEYS[1], 'status', 'cancelled', 'finished', ARGV[2])
  redis.call('HDEL', KEYS[1], 'payload', 'owner')
  redis.call('ZREM', KEYS[3], ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return status
"""

HEARTBEAT = """
local lost = {}
for i = 4, #ARGV do
  local fields = redis.call('HMGET', ARGV[1] .. ARGV[i], 'status', 'owner')
  if fields[1] == 'in_progress' and fields[2] == ARGV[2] then
    redis.call('ZADD', KEYS[1], ARGV[3], ARGV[i])
  else
    table.insert(lost, ARGV[i])
  end
end
return lost
"""

RECOVER = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2])
local requeued, failed = 0, 0
for _, id in ipairs(ids) do
  redis.call('ZREM', KEYS[1], id)
  local key = ARGV[1] .. id
  local fields = redis.call('HMGET', key, 'status', 'attempts')
  if fields[1] == 'in_progress' then
    if tonumber(fields[2]) >= tonumber(ARGV[4]) then
      redis.call('HSET', key, 'status', 'failed', 'error', ARGV[5], 'finished', ARGV[2])
      redis.call('HDEL', key, 'payload', 'owner')
      redis.call('PEXPIRE', key, ARGV[3])
      failed = failed + 1
    else
      redis.call('HSET', key, 'status', 'in_queue')
      redis.call('HDEL', key, 'owner')
      requeue(KEYS[2], ARGV[1], id)
      requeued = requeued + 1
    end
  end
end
return {requeued, failed}
"""


def _redacted(url: str) -> str:
    """The URL without its credentials: the userinfo and the password/token query parameters."""
    url = re.sub(r"//[^@/]*@", "//***@", url)
    return re.sub(r"([?&](?:password|token|auth|secret)[^=&]*=)[^&#]*", r"\1***", url, flags=re.IGNORECASE)


def _import_redis() -> Any:
    try:
        import redis.asyncio
    except ImportError:
        raise MissingExtraError("redis", "redis") from None
    return redis


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisStore(JobStore):
    durable = True
    shared = True
    poll_interval = 0.02

    @classmethod
    def from_config(cls, jobs: JobsConfig, root: Path) -> RedisStore:
        return cls(jobs.store, jobs.prefix)

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.prefix = prefix
        self.description = f"redis store {_redacted(url)} (prefix {prefix!r})"
        self._client: Any = None
        self._scripts: dict[str, Any] = {}

    def check(self) -> None:
        redis = _import_redis()
        try:
            client = redis.Redis.from_url(self.url, socket_connect_timeout=3, socket_timeout=3)
            try:
                client.ping()
            finally:
                client.close()
        except (redis.RedisError, OSError, ValueError) as exc:
            raise LoadError(f"cannot open the {self.description}: {exc}") from exc

    async def open(self) -> None:
        redis = _import_redis()
        self._client = redis.asyncio.Redis.from_url(self.url, socket_connect_timeout=3)
        try:
            await self._client.ping()
        except (redis.RedisError, OSError) as exc:
            raise LoadError(f"cannot open the {self.description}: {exc}") from exc
        scripts = {
            "submit": SUBMIT,
            "claim": CLAIM,
            "finish": FINISH,
            "release": REQUEUE + RELEASE,
            "cancel": CANCEL,
            "heartbeat": HEARTBEAT,
            "recover": REQUEUE + RECOVER,
        }
        self._scripts = {name: self._client.register_script(text) for name, text in scripts.items()}

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ---------------------------------------------------------------------------------------------
    # keys

    def _job(self, api: str, job_id: str) -> str:
        return f"{self.prefix}:{api}:job:{job_id}"

    def _jobs(self, api: str) -> str:
        return f"{self.prefix}:{api}:job:"

    def _queue(self, api: str) -> str:
        return f"{self.prefix}:{api}:queue"

    def _running(self, api: str) -> str:
        return f"{self.prefix}:{api}:running"

    def _seq(self, api: str) -> str:
        return f"{self.prefix}:{api}:seq"

    # ---------------------------------------------------------------------------------------------
    # the interface

    async def submit(self, job: NewJob, max_queued: int) -> None:
        answer = await self._scripts["submit"](
            keys=[self._job(job.api, job.id), self._queue(job.api), self._seq(job.api)],
            args=[job.id, job.kind, job.payload, max_queued, job.trace or ""],
        )
        if answer == b"duplicate":
            raise DuplicateJob(job.id)
        if answer == b"full":
            raise JobQueueFull(max_queued)

    async def claim(self, api: str, owner: str, limit: int = 1) -> list[ClaimedJob]:
        rows = await self._scripts["claim"](
            keys=[self._queue(api), self._running(api)],
            args=[self._jobs(api), owner, now() + LEASE_SECONDS, limit],
        )
        return [
            ClaimedJob(
                api, row[0].decode(), row[1].decode(), row[2], int(row[3]), _text(row[4] if len(row) > 4 else None)
            )
            for row in rows
        ]

    async def finish(
        self, api: str, job_id: str, owner: str, status: str, result: bytes | None, error: str | None, ttl: float
    ) -> bool:
        done = await self._scripts["finish"](
            keys=[self._job(api, job_id), self._running(api)],
            args=[job_id, owner, status, result or b"", error or "", repr(now()), _ms(ttl)],
        )
        return bool(done)

    async def release(self, api: str, job_id: str, owner: str) -> None:
        await self._scripts["release"](
            keys=[self._job(api, job_id), self._queue(api), self._running(api)],
            args=[job_id, owner, self._jobs(api)],
        )

    async def get(self, api: str, job_id: str) -> JobView | None:
        status, result, error, finished = await self._client.hmget(
            self._job(api, job_id), "status", "result", "error", "finished"
        )
        if status is None:
            return None
        return JobView(
            job_id,
            status.decode(),
            result,
            error.decode() if error is not None else None,
            float(finished) if finished is not None else None,
        )

    async def cancel(self, api: str, job_id: str, ttl: float) -> str | None:
        before = await self._scripts["cancel"](
            keys=[self._job(api, job_id), self._queue(api), self._running(api)],
            args=[job_id, repr(now()), _ms(ttl)],
        )
        return before.decode() if before is not None else None

    async def heartbeat(self, api: str, owner: str, job_ids: list[str]) -> set[str]:
        lost = await self._scripts["heartbeat"](
            keys=[self._running(api)], args=[self._jobs(api), owner, now() + LEASE_SECONDS, *job_ids]
        )
        return {job_id.decode() for job_id in lost}

    async def recover(self, api: str, ttl: float) -> tuple[int, int]:
        requeued, failed = await self._scripts["recover"](
            keys=[self._running(api), self._queue(api)],
            args=[self._jobs(api), repr(now()), _ms(ttl), MAX_ATTEMPTS, INTERRUPTED_TWICE],
        )
        return int(requeued), int(failed)

    async def queued(self, api: str) -> int:
        return int(await self._client.llen(self._queue(api)))


def _text(value: bytes | None) -> str | None:
    return value.decode() if value else None
