"""A 200-step loop whose peak is a 192 MiB spike held 30 ms at step 123 (issue 38's job, in
Python): each step makes 8 MiB of activations and frees them, and keeps 64 KiB."""

import time

import memsight


def attention_spike():
    scores = bytearray(192 << 20)  # THE SPIKE
    for i in range(0, len(scores), 4096):
        scores[i] = 1
    time.sleep(0.03)
    return scores[4096]


def ordinary_step():
    acts = bytearray(8 << 20)
    return acts[4096]


kept = []
for n in range(200):
    memsight.step(n)
    ordinary_step()
    if n == 123:
        attention_spike()
    kept.append(bytearray(64 << 10))
    time.sleep(0.001)
