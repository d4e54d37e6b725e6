"""The side channel's line splitter: a line longer than the limit is skipped whole (a
trainer that writes one 5 MiB line costs the agent neither its memory nor its life)."""

from __future__ import annotations

import asyncio

from trainctl.agent.spawner import split_lines


def lines_of(chunks, limit):
    async def gen():
        for c in chunks:
            yield c

    async def collect():
        return [line async for line in split_lines(gen(), limit)]

    return asyncio.run(collect())


def test_lines_across_chunks_and_an_oversized_one_skipped_whole():
    huge = [b"x" * 40 for _ in range(10)]  # 400 bytes, no newline yet
    chunks = [b'{"a":1}\n{"b"', b":2}\n", *huge, b"tail-of-huge\n", b'{"c":3}\n']
    assert lines_of(chunks, limit=100) == [b'{"a":1}\n', b'{"b":2}\n', b'{"c":3}\n']


def test_a_last_line_without_newline_is_not_delivered():
    assert lines_of([b"one\n", b"two"], limit=100) == [b"one\n"]
