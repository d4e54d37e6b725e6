"""A plain loop (no torch) that pauses and hangs: 30 batches 0.1 s apart, an 8 s pause
that heals by itself, 30 batches, a silent 3 s evaluation ended by its summary line,
30 batches, then a hang (it sleeps until killed).

    python pauses.py"""

import time


def stretch(first: int) -> None:
    for i in range(first, first + 30):
        print(f"step {i}/1000 loss=0.5", flush=True)
        time.sleep(0.1)


stretch(1)
time.sleep(8)  # a pause that heals by itself
stretch(31)
time.sleep(3)  # a silent evaluation...
print("eval: accuracy 0.91", flush=True)  # ...ended by its summary line, no batch
stretch(61)
print("hanging now", flush=True)
time.sleep(3600)
