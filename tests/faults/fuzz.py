"""A seeded frame fuzzer: real client sessions (tests/faults/seeds/, recorded by
tests/faults/capture.py), cut into frames, mutated and replayed at busd over TCP.

The same seed number gives the same mutations, so a failure is replayed with
`BUSD_FAULTS_SEED=<n>`.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

SEEDS = Path(__file__).parent / "seeds"
HEADER = b"AMQP"


def load_seeds() -> dict[str, list[bytes]]:
    return {p.stem: split_frames(p.read_bytes()) for p in sorted(SEEDS.glob("*.bin"))}


def split_frames(data: bytes) -> list[bytes]:
    """Protocol headers (8 bytes) and frames (by their size field), in order."""
    frames, at = [], 0
    while at < len(data):
        if data[at : at + 4] == HEADER:
            size = 8
        else:
            size = int.from_bytes(data[at : at + 4], "big")
            if size < 8 or at + size > len(data):
                size = len(data) - at  # (a recording never has this; keep the rest whole)
        frames.append(data[at : at + size])
        at += size
    return frames


def _flip_bits(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    return bytes(data)


def _set_byte(rng: random.Random, frame: bytes) -> bytes:
    data = bytearray(frame)
    data[rng.randrange(len(data))] = rng.choice([0x00, 0xFF, 0x7F, 0x80, rng.randrange(256)])
    return bytes(data)


def _set_size(rng: random.Random, frame: bytes) -> bytes:
    size = rng.choice(
        [0, 7, 8, len(frame) + 1, len(frame) - 1, 2**31, 2**32 - 1, rng.randrange(2**32)]
    )
    return size.to_bytes(4, "big") + frame[4:]


def _garbage(rng: random.Random, _frame: bytes) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))


def _big_field(rng: random.Random, frame: bytes) -> bytes:
    """A long binary or string constructor somewhere in the body: lengths near the limits."""
    at = rng.randrange(8, max(9, len(frame)))
    code = rng.choice([b"\xb0", b"\xb1", b"\xb3", b"\xd0", b"\xf0"])  # vbin32 str32 sym32 ...
    return frame[:at] + code + rng.randrange(2**32).to_bytes(4, "big") + frame[at:]


def mutate(rng: random.Random, frames: list[bytes], others: list[list[bytes]]) -> list[bytes]:
    """One mutated replay of a recorded connection, as the pieces to write one by one."""
    frames = list(frames)
    for _ in range(rng.randint(1, 3)):
        i = rng.randrange(len(frames))
        kind = rng.randrange(9)
        if kind == 0:
            frames[i] = _flip_bits(rng, frames[i])
        elif kind == 1:
            frames[i] = _set_byte(rng, frames[i])
        elif kind == 2 and len(frames[i]) > 8:
            frames[i] = _set_size(rng, frames[i])
        elif kind == 3:
            frames.insert(i, frames[i])  # a frame twice
        elif kind == 4 and len(frames) > 1:
            del frames[i]
        elif kind == 5:
            j = rng.randrange(len(frames))
            frames[i], frames[j] = frames[j], frames[i]
        elif kind == 6:
            other = rng.choice(others)
            frames.insert(i, rng.choice(other))  # a frame of another client's session
        elif kind == 7:
            frames.insert(i, _garbage(rng, frames[i]))
        elif len(frames[i]) > 8:
            frames[i] = _big_field(rng, frames[i])
    if rng.random() < 0.2:  # the client vanishes mid-way, maybe inside a frame
        end = rng.randrange(1, len(frames) + 1)
        frames = frames[:end]
        frames[-1] = frames[-1][: rng.randrange(1, len(frames[-1]) + 1)]
    return frames


async def replay(
    port: int, frames: list[bytes], pause_s: float = 0.003, linger_s: float = 0.3
) -> bool:
    """Write the frames one by one, as the client did (a frame may need busd's answer to the
    one before), read what busd answers for a moment, and go; True when busd closed the
    connection itself."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    answer = asyncio.ensure_future(_drain(reader))
    try:
        for frame in frames:
            writer.write(frame)
            await writer.drain()
            if answer.done():
                break
            await asyncio.sleep(pause_s)
        await asyncio.wait_for(asyncio.shield(answer), linger_s)
    except (TimeoutError, OSError):
        pass
    finally:
        writer.close()
    closed_by_busd = answer.done() and not answer.cancelled() and answer.result()
    answer.cancel()
    return bool(closed_by_busd)


async def _drain(reader: asyncio.StreamReader) -> bool:
    """Read until busd closes (True) or the connection breaks (False)."""
    try:
        while await reader.read(65536):
            pass
        return True
    except OSError:
        return False


async def fuzz(port: int, count: int, seed: int, at_once: int = 16) -> dict[str, int]:
    """Replay `count` mutated sessions, `at_once` at a time; how many busd closed itself."""
    seeds = load_seeds()
    names = sorted(seeds)
    rng = random.Random(seed)
    jobs = [
        mutate(rng, seeds[name], [seeds[n] for n in names])
        for name in (rng.choice(names) for _ in range(count))
    ]
    queue = iter(jobs)
    closed = 0

    async def worker() -> None:
        nonlocal closed
        for frames in queue:
            closed += await replay(port, frames)

    await asyncio.gather(*(worker() for _ in range(at_once)))
    return {"connections": count, "frames": sum(len(f) for f in jobs), "closed_by_busd": closed}
