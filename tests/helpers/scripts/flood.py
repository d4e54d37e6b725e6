"""A trainer that floods its output: ``flood.py MB_PER_S SECONDS``.

~120-byte lines (1 in 50 a progress line) in 256 KiB writes, paced by the clock.  For the
agent-under-flood test (tests/e2e/test_client_backlog.py) and bench/bench_flood_status.py."""

import os
import sys
import time

rate, seconds = float(sys.argv[1]) * 1e6, float(sys.argv[2])
block = b"".join(
    (b"epoch=1/1 batch=%d/9999999 loss=0.5\n" % i) if i % 50 == 0 else b"noise %05d %s\n" % (i, b"x" * 100)
    for i in range(2200)
)[: 256 << 10]
block = block[: block.rfind(b"\n") + 1]
t0 = time.monotonic()
sent = 0
while (now := time.monotonic()) < t0 + seconds:
    if sent < (now - t0) * rate:
        os.write(1, block)
        sent += len(block)
    else:
        time.sleep(0.002)
