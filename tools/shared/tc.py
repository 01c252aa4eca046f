"""Linux traffic control as this process's network namespace sees it: one bounded `tc` call, and which qdisc kinds
shape traffic (limit a rate or add delay) rather than only queue it.

Two readers use it: nic_health (which rules shape an interface, and towards whom) and straggler_find's node sampler
(how many packets a shaper held back during the window). srun and ssh put the caller in the node's namespace.
The text is tc's, from this host: callers parse it with bounded patterns, nothing in it is run.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

# Kinds that limit a rate or add delay. Queueing-only kinds (fq, fq_codel, pfifo_fast, mq, noqueue, ...) are not
# here: every host has them and they slow nothing down.
SHAPING_KINDS = frozenset({"tbf", "htb", "hfsc", "cbq", "cake", "netem"})
MAX_CHARS = 200_000      # of one answer: a few thousand classes is already far more than any host sets


def tc_output(*args: str, timeout_s: float = 5.0) -> str:
    """What `tc ARGS` prints (at most MAX_CHARS), or "" with no tc binary, an error, or no answer in `timeout_s`."""
    tc = shutil.which("tc") or next((p for p in ("/usr/sbin/tc", "/sbin/tc") if Path(p).exists()), None)
    if not tc:
        return ""
    try:
        done = subprocess.run([tc, *args], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout[:MAX_CHARS] if done.returncode == 0 else ""
