"""The one side channel (tools/shared/sidechannel.py) and the engine's line reader under hostile output:
every malformed line the security review sent (F5, F6, F13) is skipped and counted, the reader keeps
going, and memory stays bounded. Real child processes, real pipes; no stand-ins."""

from __future__ import annotations

import json
import sys
import time
import tracemalloc

import pytest

from tools.engine.processes import Supervised
from tools.fleet_sweep.node import check_event
from tools.shared import sidechannel
from tools.shared.ranks import check_event as check_rank
from tools.shared.sidechannel import PREFIX, Reader, encode


def honest_row(node: str = "n1", value=90.0) -> dict:
    return {"kind": "row", "node": node, "check": "cpu_probe", "verdict": "info", "problems": [],
            "figures": [{"name": "matmul_gflops", "value": value, "unit": "GFLOP/s", "gpu": None}]}


def part(**fields) -> str:
    return json.dumps({"part": "k", "i": 0, "n": 2, "data": "eA==", **fields})


# The ten malformed lines of F6 and the nested line of F5, as the review sent them.
HOSTILE = {
    "nested arrays (F5)": "[" * 100_000 + "]" * 100_000,
    "part n is text": part(n="x"),
    "part i is a list": part(i=[1]),
    "part i is Infinity": '{"part": "k", "i": Infinity, "n": 2, "data": "eA=="}',
    "row without check": json.dumps({k: v for k, v in honest_row().items() if k != "check"}),
    "hello with checks 5": json.dumps({"kind": "hello", "node": "n1", "checks": 5}),
    "figure value fast": json.dumps({**honest_row(), "figures": [{"name": "x", "value": "fast"}]}),
    "figure without name": json.dumps({**honest_row(), "figures": [{"value": 1.0}]}),
    "problems 7": json.dumps({**honest_row(), "problems": 7}),
    "node is a list": json.dumps({**honest_row(), "node": ["a"]}),
    "deep but parseable": json.dumps({**honest_row(), "result": json.loads("[" * 200 + "]" * 200)}),
    "kind unknown": json.dumps({"kind": "rm -rf", "node": "n1"}),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_line_is_skipped_with_a_reason_and_the_next_line_still_reads(name):
    reader = Reader(check_event, labelled=True)
    assert reader.parse("2: " + PREFIX + HOSTILE[name]) is None
    assert sum(reader.skipped.values()) == 1 and list(reader.skipped)[0][0] == 2
    event = reader.parse("2: " + PREFIX + json.dumps(honest_row()))
    assert event.task == 2 and event.data["figures"][0]["value"] == 90.0
    assert reader.notes({2: "mln3"}.get)[0].startswith("1 line(s) from mln3 skipped: ")


def test_nan_and_overflowing_figures_become_no_figure_not_a_crash():
    # F6: a NaN figure once reached the answer as null where the schema wants a number.
    reader = Reader(check_event, labelled=True)
    for value in ("NaN", "Infinity", "-Infinity", "1e400"):
        text = json.dumps(honest_row()).replace("90.0", value)
        assert reader.parse("0: " + PREFIX + text).data["figures"][0]["value"] is None, value
    # The honest writer never sends NaN: it sends no figure.
    (line,) = encode(sidechannel.finite(honest_row(value=float("nan"))))
    assert reader.parse("0: " + line.decode()).data["figures"][0]["value"] is None
    assert not reader.skipped


def test_unfinished_parts_are_bounded_in_count_and_bytes():
    # F13: 300,000 parts with distinct keys, never completed, held 329 MB until the sweep ended.
    reader = Reader(check_event, labelled=True)
    data = "A" * 800   # 600 bytes, the most a part may carry
    tracemalloc.start()
    for i in range(30_000):
        reader.parse(f"1: {PREFIX}" + json.dumps({"part": f"key{i}", "i": 0, "n": 5, "data": data}))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(reader._parts[1]) <= sidechannel.MAX_PENDING_EVENTS
    assert peak < 4 << 20, peak
    assert sum(reader.skipped.values()) == 30_000 - sidechannel.MAX_PENDING_EVENTS


def test_parts_of_one_task_cannot_complete_another_tasks_event():
    reader = Reader(check_event, labelled=True)
    lines = [line.decode().rstrip() for line in encode({**honest_row(), "result": {"x": "y" * 2000}})]
    assert len(lines) > 2
    got = [reader.parse(f"0: {line}") for line in lines[:-1]] + [reader.parse(f"1: {lines[-1]}")]
    assert got == [None] * len(lines)   # task 1 sent the last part of task 0's event: nothing completes


def test_rank_events_are_checked_by_the_same_reader():
    reader = Reader(check_rank)
    good = {"ev": "stage", "rank": 3, "world_size": 4, "local_rank": 1, "pid": 9, "host": "h", "stage": "init", "t": 1.0}
    assert reader.parse(PREFIX + json.dumps(good)).data == good
    for bad in ({**good, "rank": "3"}, {**good, "rank": -1}, {**good, "ev": "boom"}, {**good, "t": [1]},
                {**good, "rank": True}):
        assert reader.parse(PREFIX + json.dumps(bad)) is None
    assert sum(reader.skipped.values()) == 5


def _child(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_line_without_end_keeps_the_reader_bounded_and_later_events_arrive():
    # F13: a node printing 900 MB without a newline grew the sweep's child to 2.4 GB. Here: 256 MB.
    code = ("import os, json\n"
            "chunk = b'x' * (1 << 20)\n"
            "for _ in range(256): os.write(1, chunk)\n"
            f"os.write(1, b'\\n' + {PREFIX!r}.encode() + json.dumps({{'ev': 'done', 'rank': 0}}).encode() + b'\\n')\n")
    reader = Reader(check_rank)
    tracemalloc.start()
    t0 = time.monotonic()
    with Supervised(_child(code), parse_line=reader.parse) as child:
        events = []
        while (event := child.next_event(30)) is not Supervised.EOF:
            assert event is not None, "the reader stopped"
            events.append(event)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [e.data["ev"] for e in events] == ["done"]
    assert child.skipped == {"stdout line longer than 8388608 bytes (skipped)": 1}
    assert peak < 40 << 20, f"{peak / 2**20:.0f} MiB"   # a few lines of 8 MiB at most, not 256 MiB
    assert time.monotonic() - t0 < 60


def test_a_parser_that_raises_costs_one_line_not_the_reader():
    # F5: RecursionError in the parser ended the stdout thread; every later line was lost.
    def fragile(line: str):
        if "boom" in line:
            raise RecursionError("maximum recursion depth exceeded")
        return line if line.startswith("event") else None

    code = "print('event 1'); print('boom'); print('event 2'); import sys; sys.stdout.flush()"
    with Supervised(_child(code), parse_line=fragile) as child:
        got = []
        while (event := child.next_event(30)) is not Supervised.EOF:
            got.append(event)
    assert got == ["event 1", "event 2"]
    assert child.skipped == {"stdout line the parser could not read (RecursionError)": 1}


def test_a_rank_launch_survives_a_nested_line_and_says_it_skipped_it(tmp_path):
    # F5 through the rank launcher (the same reader served torchrun ranks, with the same except clause).
    from tools.shared.culprits import diagnose
    from tools.shared.launch import launch_ranks

    script = tmp_path / "rank.py"
    script.write_text(
        "import json, os, time\n"
        "def say(ev):\n"
        "    os.write(1, b'@@mleng ' + json.dumps({'ev': ev, 'rank': 0, 'world_size': 1, 't': time.time()}).encode() + b'\\n')\n"
        "say('start')\n"
        "os.write(1, b'@@mleng ' + b'[' * 100000 + b']' * 100000 + b'\\n')\n"
        "say('done')\n")
    outcome = launch_ranks([sys.executable, str(script)], 1, timeout_s=5, stall_s=20, deadline_s=60)
    assert outcome.ranks[0].status == "done"
    assert outcome.skipped_lines == ["1 line(s) from the ranks skipped: nested deeper than 64 levels"]
    outcome.ranks[0].status = "vanished"   # diagnose speaks only when something went wrong
    assert diagnose(outcome, 5)[1][-1] == "Side channel: 1 line(s) from the ranks skipped: nested deeper than 64 levels."
