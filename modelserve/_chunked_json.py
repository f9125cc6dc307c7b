"""``orjson.loads`` for large bodies, in pieces that each hold the GIL for a fraction of a millisecond.

orjson holds the GIL for the whole of a call: 10 MiB of JSON numbers (1.15 million floats) is one call of
about 35 ms on a quiet core of the 2-core machine the tests run on, and the event loop answers nothing
meanwhile, even when the call runs in a worker thread. `loads` parses the long runs of array text in a body
(numbers, nulls, commas, whitespace and brackets: a list of numbers, a matrix, a tensor of any rank) in pieces
of about `PIECE` bytes, and the rest of the document (the skeleton) in one call, with a sentinel string where
each run was; between two pieces it pauses now and then, for a thread waiting for the GIL to take it.

The answer is ``orjson.loads(body)``'s, exactly: the same value, or the same error. Whenever anything does not
fit (the skeleton or a piece does not parse, a sentinel is not found where it was put), the whole body is parsed
again by ``orjson.loads``, which also raises orjson's own error for a body that is not valid JSON.

How a run is cut. A run begins at a ``[`` and holds nothing but array text. It is cut at commas found every
`PIECE` bytes, only at a comma between the end of a value (a digit, ``l`` or ``]``) and the start of one
(``-``, a digit, ``n`` or ``[``). The number of arrays open at each cut is counted from the brackets of the
piece before it (`bytes.translate` keeps them, `bytes.replace` drops the pairs: C loops over one piece); a
piece that closes the array the run began with ends the run. A piece is parsed with as many ``[`` before it
as arrays are open where it begins and as many ``]`` after it as are open where it ends, so that it is valid
JSON alone exactly when it is valid where it stands; the arrays it continues are grafted onto the open arrays
of the pieces before it. The skeleton keeps the ``[`` the run begins with and puts ``"\\u0001<nonce>:<k>"``
as the first value of the arrays open at the run's last cut; the rest of the run follows, as it was. Should the
``[`` be inside a JSON string, the sentinel's quote ends that string and the backslash after it is not JSON:
the skeleton does not parse, and the body is parsed whole. The pieces are also wrapped in as many more ``[``
as the run's array is deep in the document, so that orjson's limit on nesting (where the installed version has
one) is met where the whole parse would meet it.

Limits (the whole body in one call, as before): runs shorter than `PIECE`; everything outside the runs, such
as objects, strings and arrays that hold strings, is parsed in the skeleton's one call (a 10 MiB string is one
call of a few milliseconds); a run whose first array ends early (``["id", [1, 2], [3, 4], ...]``) is not split.
"""

from __future__ import annotations

import os
import time
from typing import Any, NamedTuple

import orjson

#: Bytes of array text parsed by one call: 64 KiB of numbers is about 0.12 ms of orjson here.
PIECE = 64 * 1024
#: The body is looked at in windows of PROBE bytes, one every STRIDE bytes: a run of array text long enough to
#: be cut (PIECE) holds a whole window.
PROBE = 4 * 1024
STRIDE = 32 * 1024
#: Arrays nested deeper than this (counted from the document's top) are not split.
MAX_DEPTH = 256
#: Seconds of parsing between two pauses, and the pause: time.sleep releases the GIL for long enough that a
#: thread waiting for it (the event loop, back from epoll) takes it. Without pauses that thread waits for the
#: interpreter's switch interval (5 ms) at each of its wake-ups, however short each call into orjson is. Beside
#: a thread parsing 10 MiB bodies of numbers back to back, one that sleeps 0.5 ms at a time woke 18 times a
#: second (whole-body parses), 160 (pieces) and 700 (pieces and pauses; its p50 lateness 0.85 ms), here; the
#: pauses cost the parses about 10% of their throughput.
WORK = 0.001
PAUSE = 0.0001

_WHITESPACE = b" \t\n\r"
_VALUE_TEXT = b"0123456789+-.eE,nul" + _WHITESPACE  # numbers and nulls, commas, whitespace
_ARRAY_TEXT = _VALUE_TEXT + b"[]"
_VALUE_END = b"0123456789]l"
_VALUE_START = b"-0123456789[n"
#: How far around a comma whitespace is looked through for the values on either side.
_NEAR = 256
#: How far past a piece's length a comma to cut at is looked for.
_SLACK = 16 * 1024


class _Doubt(Exception):
    """The body is not split: the whole-body parse decides."""


class _Pacer:
    """Called between two pieces of work: pauses once per `WORK` seconds."""

    def __init__(self) -> None:
        self.due = time.perf_counter() + WORK

    def __call__(self) -> None:
        if time.perf_counter() >= self.due:
            time.sleep(PAUSE)
            self.due = time.perf_counter() + WORK


class _Run(NamedTuple):
    start: int  # the "[" that the run begins with
    cuts: list[int]  # the commas where its pieces end, in order
    depths: list[int]  # arrays open at each cut, the one at start included


def loads(body: bytes) -> Any:
    """``orjson.loads(body)``: the same value, or the same `orjson.JSONDecodeError`.

    Long runs of numeric arrays are parsed in pieces of `PIECE` bytes, so that another thread (the event loop)
    can take the GIL between two of them::

        loads(b'{"x": [0.1, 0.2, 0.3]}') == {"x": [0.1, 0.2, 0.3]}
    """
    try:
        return _loads_in_pieces(body)
    except Exception:
        # Any doubt, and any body that is not valid JSON: the whole-body parse decides, and raises orjson's error.
        return orjson.loads(body)


def _loads_in_pieces(body: bytes) -> Any:
    pace = _Pacer()
    runs = _runs(body, pace)
    if not runs:
        raise _Doubt("no run of array text to split")
    nonce = os.urandom(8).hex()
    parts: list[bytes] = []
    at = 0
    for k, run in enumerate(runs):
        parts += (body[at : run.start], b"[" * run.depths[-1], b'"\\u0001%s:%d"' % (nonce.encode(), k))
        at = run.cuts[-1]
    parts.append(body[at:])
    skeleton = orjson.loads(b"".join(parts))
    places = _places(skeleton, f"\x01{nonce}:", runs)
    # The last run first: a later run's array may lie in what an earlier run's graft copies from the skeleton.
    for run, (holder, key, rest, depth) in zip(reversed(runs), reversed(places), strict=True):
        tree = _assemble(body, run, rest, depth, pace)
        if holder is None:
            skeleton = tree
        else:
            holder[key] = tree
    return skeleton


def _runs(body: bytes, pace: _Pacer) -> list[_Run]:
    """The runs of array text long enough to cut, in the order of the body."""
    runs: list[_Run] = []
    end = len(body)
    floor = 0  # a run begins after the previous one stopped
    probe = 0
    while probe + PROBE <= end:
        pace()
        if body[probe : probe + PROBE].translate(None, _ARRAY_TEXT):
            probe += STRIDE
            continue
        start = body.find(b"[", _run_begins(body, probe, floor), probe + PROBE)
        if start < 0:  # no run begins in this array text before the end of the window
            floor = probe + PROBE
            probe += STRIDE
            continue
        run, stop = _cut(body, start, pace)
        if run is not None:
            runs.append(run)
        floor = stop
        probe = max(stop, probe + PROBE)
    return runs


def _run_begins(body: bytes, probe: int, floor: int) -> int:
    """Where the array text that holds ``body[probe]`` begins (not before floor)."""
    at = probe
    while at > floor:
        low = max(floor, at - PROBE)
        kept = body[low:at].rstrip(_ARRAY_TEXT)
        if kept:
            return low + len(kept)
        at = low
    return floor


def _cut(body: bytes, start: int, pace: _Pacer) -> tuple[_Run | None, int]:
    """The run that begins with the array at start, if it can be cut; and where the search goes on."""
    first = body[start + 1 : start + 1 + _NEAR].lstrip(_WHITESPACE)[:1]
    if not first or first not in _VALUE_START:
        return None, start + 1
    cuts: list[int] = []
    depths: list[int] = []
    depth, last = 1, start
    while True:
        head = body[last + 1 : last + PIECE]
        brackets = head.translate(None, _VALUE_TEXT)  # and whatever is not array text
        if brackets.translate(None, b"[]"):  # the array text ends before the piece is long enough
            stop = last + 1 + len(head) - len(head.lstrip(_ARRAY_TEXT))
            break
        comma = _comma_after(body, last + PIECE)
        if comma < 0:
            stop = last + PIECE
            break
        unmatched = _unmatched(brackets + body[last + PIECE : comma].translate(None, _VALUE_TEXT))
        if unmatched is None:
            stop = comma
            break
        closed, opened = unmatched
        if depth - closed < 1 or depth - closed + opened > MAX_DEPTH:
            # The run's first array ends in this piece (an array of arrays whose first values are not all
            # array text, such as ["id", [1, 2], [3, 4]]), or the run is deeper than is split.
            stop = comma
            break
        depth += opened - closed
        cuts.append(comma)
        depths.append(depth)
        last = comma
        pace()
    return (_Run(start, cuts, depths) if cuts else None), stop


def _unmatched(brackets: bytes) -> tuple[int, int] | None:
    """How many arrays a piece closes that were open before it, and how many it leaves open, from its brackets:
    ``b"]][[]["`` closes 2 and opens 2. Each turn drops the innermost pairs (a matrix's rows: one turn); None
    when they nest deeper than is split."""
    for _ in range(MAX_DEPTH):
        paired = brackets.replace(b"[]", b"")
        if len(paired) == len(brackets):
            closed = len(brackets) - len(brackets.lstrip(b"]"))
            return closed, len(brackets) - closed
        brackets = paired
    return None


def _comma_after(body: bytes, at: int) -> int:
    """The first comma from at, in the array text that goes on from there (looked for within _SLACK bytes),
    between a value's end and a value's start; or -1."""
    for size in (_NEAR, _SLACK):  # numbers are short: the first window nearly always holds one
        window = body[at : at + size]
        extent = len(window)
        if window.translate(None, _ARRAY_TEXT):
            extent -= len(window.lstrip(_ARRAY_TEXT))
        comma = _comma_in(body, at, at + extent)
        if comma >= 0 or extent < size:
            return comma
    return -1


def _comma_in(body: bytes, at: int, limit: int) -> int:
    """The first comma in body[at:limit] between a value's end and a value's start, or -1."""
    while True:
        comma = body.find(b",", at, limit)
        if comma < 0:
            return -1
        before = body[max(0, comma - _NEAR) : comma].rstrip(_WHITESPACE)[-1:]
        after = body[comma + 1 : comma + 1 + _NEAR].lstrip(_WHITESPACE)[:1]
        if before and after and before in _VALUE_END and after in _VALUE_START:
            return comma
        at = comma + 1


#: A container in the skeleton: (the container, its parent's record, its key in the parent, its depth).
_Record = tuple[Any, Any, Any, int]


def _places(skeleton: Any, tag: str, runs: list[_Run]) -> list[tuple[Any, Any, list[Any], int]]:
    """For each run: the container that holds its array in the skeleton (None: the top), the key there, the
    array (its first values are the open arrays down to the sentinel), and how deep it lies."""
    found: dict[str, _Record] = {}
    stack: list[_Record] = [(skeleton, None, None, 0)]
    while stack:
        record = stack.pop()
        node = record[0]
        children: Any
        if type(node) is list:
            if node and type(node[0]) is str and node[0].startswith(tag):
                if node[0] in found:
                    raise _Doubt("a sentinel found twice")
                found[node[0]] = record
            children = enumerate(node)
        elif type(node) is dict:
            children = node.items()
        else:
            continue
        for key, child in children:
            if type(child) is list or type(child) is dict:
                stack.append((child, record, key, record[3] + 1))
    places = []
    for k, run in enumerate(runs):
        if f"{tag}{k}" not in found:
            raise _Doubt(f"sentinel {k} not found")
        record = found.pop(f"{tag}{k}")
        for _ in range(run.depths[-1] - 1):  # up the open arrays, each the first value of the one above
            parent = record[1]
            if parent is None or record[2] != 0 or type(parent[0]) is not list:
                raise _Doubt(f"sentinel {k} is not where it was put")
            record = parent
        if record[3] + max(run.depths) > MAX_DEPTH:
            raise _Doubt(f"run {k} lies too deep")
        parent = record[1]
        places.append((None if parent is None else parent[0], record[2], record[0], record[3]))
    if found:
        raise _Doubt("a string that looks like a sentinel")
    return places


def _assemble(body: bytes, run: _Run, rest: list[Any], depth: int, pace: _Pacer) -> list[Any]:
    """The run's array: its pieces parsed one by one, then the rest of it, from the skeleton."""
    tree: list[Any] = []
    spine = [tree]  # the arrays open at the last cut, outermost first
    last, opened = run.start, 1
    for comma, still_open in zip(run.cuts, run.depths, strict=True):
        value = orjson.loads(b"".join((b"[" * (depth + opened), body[last + 1 : comma], b"]" * (depth + still_open))))
        for _ in range(depth):  # the wrapping that stands for the arrays and objects around the run's array
            if len(value) != 1:
                raise _Doubt("a piece closed more arrays than were open")
            value = value[0]
        _graft(spine, value, opened, 0)
        pace()
        spine = [tree]
        for _ in range(still_open - 1):
            spine.append(spine[-1][-1])
        last, opened = comma, still_open
    _graft(spine, rest, opened, 1)
    return tree


def _graft(spine: list[list[Any]], value: list[Any], levels: int, skip: int) -> None:
    """Append a parsed piece to the open arrays: its first value at each of the levels (but the innermost)
    goes on the array open at that level; `skip` values of the innermost are left out (the sentinel)."""
    lefts = [value]
    for _ in range(levels - 1):
        lefts.append(lefts[-1][0])
    spine[levels - 1].extend(lefts[levels - 1][skip:])
    for level in range(levels - 1):
        spine[level].extend(lefts[level][1:])
