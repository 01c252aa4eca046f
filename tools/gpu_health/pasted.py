"""Pasted `nvidia-smi nvlink -e` (error counters per link) and `nvidia-smi nvlink -s` (status and speed per link)
-> the per-GPU NVLink records gpu_health reads from NVML on a node, judged by knowledge/data/nvlink.toml.

NVLink belongs to gpu_health (a GPU's links, read through NVML there), so its pasted text is read here too; the
`dcgmi diag` table is read by dcgm.py. One reading: -e counts are totals since the driver loaded or the counters
were reset, so they name a link to watch, never a node to drain on history alone; -s is judged against the other
GPUs of the same paste where the product wires only a subset of its links (bridged: H100 NVL, A100 PCIe), and
alone where every link is wired (SXM boards on NVSwitch: an inactive link is down), after
knowledge/data/accelerators.toml's interconnect.
"""

from __future__ import annotations

import re

from ..engine.data import load_data
from ..shared.actions import HealthFinding, worst_action
from ..shared.pasted_numbers import count, decimal, lines_of
from .sampling import NvLinkCounters, links_all_wired

GPU_LINE = re.compile(r"^\s*GPU (\d+): (.*)$")   # then "<name> (UUID: <uuid>)"; a cut paste may end inside it
ERROR_LINE = re.compile(r"^\s*Link (\d+): ([A-Za-z][A-Za-z ]*?) Errors: (\d+)\s*$")
STATUS_LINE = re.compile(r"^\s*Link (\d+): (?:<inactive>|([\d.]+) GB/s)\s*$")
MAX_GPUS = 256           # GPU blocks judged in one paste (a node has 8-16)
# nvidia-smi's counter names -> NvLinkCounters fields; newer drivers print more (ECC, Data Tx/Rx), not judged here.
COUNTER_NAMES = {"Replay": "replay", "Recovery": "recovery", "CRC": "crc", "CRC Flit": "crc_flit",
                 "CRC Data": "crc_data"}
EXPECTED = ("`nvidia-smi nvlink -e` output ('GPU 0: <name> (UUID: ...)' then 'Link 0: Replay Errors: 0' lines), "
            "`nvidia-smi nvlink -s` output ('Link 0: 26.562 GB/s' or 'Link 4: <inactive>' lines) or `dcgmi diag` "
            "output (its '| Diagnostic | Result |' table, or the JSON of -j)")


class PastedGpu:
    """One GPU block of the paste: its identity and its links as read (status known only from -s lines)."""

    def __init__(self, index: int, name: str, uuid: str):
        self.index, self.name, self.uuid = index, name, uuid
        self.links: dict[int, NvLinkCounters] = {}
        self.status_read = False
        self.seen: set[tuple[int, str]] = set()   # (link, field) read so far
        self.read_twice = False                   # the paste holds two readings of this GPU: the last one counts

    def link(self, number: int) -> NvLinkCounters:
        return self.links.setdefault(number, NvLinkCounters(link=number))


def parse_nvlink(text: str) -> tuple[list[str], list[PastedGpu]]:
    """([the commands recognised], GPUs in the order pasted); ([], []) when the text holds no NVLink lines.
    BadNumber naming the line for a GPU, link or count that is not a number nvidia-smi prints."""
    gpus: dict[int, PastedGpu] = {}
    kinds: set[str] = set()
    current = None
    with lines_of(text) as lines:
        for line in lines:
            current = _read_line(line, gpus, kinds, current)
    if not kinds:
        return [], []
    return sorted(kinds), list(gpus.values())


def _read_line(line: str, gpus: dict[int, PastedGpu], kinds: set[str], current: PastedGpu | None) -> PastedGpu | None:
    """One line into the GPUs read so far; the GPU block the next lines belong to."""
    if m := GPU_LINE.match(line):
        index = count(m.group(1), "GPU")
        if index not in gpus and len(gpus) == MAX_GPUS:   # judging is per GPU: 20,000 blocks took 14 s
            raise ValueError(f"more than {MAX_GPUS} GPU blocks ('GPU <n>: ...' lines); paste one node's output")
        name, _, uuid = m.group(2).rstrip().partition(" (UUID: ")
        return gpus.setdefault(index, PastedGpu(index, name, uuid.removesuffix(")")))
    if current and (m := ERROR_LINE.match(line)):
        kinds.add("nvidia-smi nvlink -e")
        field, link = COUNTER_NAMES.get(m.group(2).strip()), count(m.group(1), "Link")
        total = count(m.group(3), f"{m.group(2).strip()} Errors")
        if field:
            current.read_twice |= (link, field) in current.seen
            current.seen.add((link, field))
            setattr(current.link(link), field, total)
    elif current and (m := STATUS_LINE.match(line)):
        kinds.add("nvidia-smi nvlink -s")
        link = current.link(count(m.group(1), "Link"))
        current.read_twice |= (link.link, "status") in current.seen
        current.seen.add((link.link, "status"))
        link.active = m.group(2) is not None
        link.speed_gbytes_s = decimal(m.group(2), "link speed (GB/s)") if m.group(2) else None
        current.status_read = True
    return current


def judge(gpus: list[PastedGpu], subject_of) -> dict[int, list[HealthFinding]]:
    """{GPU index: findings}: error totals per link, then link status against the other GPUs of the paste."""
    rules = load_data("nvlink")
    found: dict[int, list[HealthFinding]] = {g.index: _error_totals(g, subject_of(g), rules["totals"]) for g in gpus}
    with_status = [g for g in gpus if g.status_read]
    for g, finding in _status(with_status, subject_of, rules["status"]):
        found[g.index].append(finding)
    return found


def _error_totals(g: PastedGpu, subject: str, rules: dict) -> list[HealthFinding]:
    out = []
    for link in sorted(g.links.values(), key=lambda c: c.link):
        counts = {name: getattr(link, name) for name in ("replay", "recovery", "crc", "crc_flit", "crc_data")
                  if getattr(link, name)}
        if not counts:
            continue
        action = worst_action(rules[f"{'crc' if name.startswith('crc') else name}_action"] for name in counts)
        out.append(HealthFinding(
            subject=subject, action=action, code="nvlink_errors_total", source="nvidia-smi nvlink -e",
            text=f"NVLink {link.link}: " + ", ".join(f"{k} errors {v}" for k, v in counts.items())
                 + " since the driver loaded or the counters were reset; reset them (nvidia-smi nvlink -re), run a "
                   "load and read again: DCGM fails a link whose replay or recovery count grows at all within a "
                   "minute, or whose CRC errors reach 100/s"))
    return out


def _status(gpus: list[PastedGpu], subject_of, rules: dict):
    """(GPU, finding) pairs for links inactive or slower than their peers in the paste."""
    if not gpus:
        return
    active = {g.index: [c.link for c in g.links.values() if c.active] for g in gpus}
    most = max(len(a) for a in active.values())
    speeds = [c.speed_gbytes_s for g in gpus for c in g.links.values() if c.active and c.speed_gbytes_s]
    fastest = max(speeds, default=None)
    for g in gpus:
        inactive = sorted(c.link for c in g.links.values() if not c.active)
        subject = subject_of(g)
        if inactive and active[g.index] and links_all_wired(g.name):
            yield g, HealthFinding(subject=subject, action=rules["inactive_on_fully_wired_action"], code="nvlink_down",
                                   source="nvidia-smi nvlink -s",
                                   text=f"NVLink links {inactive} <inactive>, {len(active[g.index])} active: every "
                                        f"link of a {g.name} is wired (knowledge/data/accelerators.toml), so these are "
                                        "down; reset the GPU, drain the node if they stay down (the same links down "
                                        "on every GPU: an NVSwitch or nvidia-fabricmanager)")
        elif most == 0:
            yield g, HealthFinding(subject=subject, action=rules["inactive_without_peers_action"], code="nvlink_none_active",
                                   source="nvidia-smi nvlink -s",
                                   text=f"no NVLink link active ({len(inactive)} listed <inactive>) on any GPU of the "
                                        "paste: a product or a VM slice without NVLink between these GPUs, or every "
                                        "link down (an NVSwitch board whose nvidia-fabricmanager is not running); "
                                        "check `nvidia-smi topo -m` for NV# entries")
        elif len(active[g.index]) < most and len(gpus) > 1:
            yield g, HealthFinding(subject=subject, action=rules["fewer_active_than_peers_action"], code="nvlink_down",
                                   source="nvidia-smi nvlink -s",
                                   text=f"{len(active[g.index])} NVLink links active, {most} on other GPUs of the "
                                        f"paste; inactive: {inactive}: links went down, GPU-GPU bandwidth is cut; "
                                        "reset the GPU, drain the node if they stay down")
        elif inactive and len(gpus) == 1:
            yield g, HealthFinding(subject=subject, action=rules["inactive_without_peers_action"], code="nvlink_inactive",
                                   source="nvidia-smi nvlink -s",
                                   text=f"NVLink links {inactive} <inactive>, {len(active[g.index])} active; with one "
                                        "GPU pasted there is nothing to compare with (some products wire a subset "
                                        "of links): paste every GPU's block")
        for c in sorted(g.links.values(), key=lambda c: c.link):
            if fastest and c.active and c.speed_gbytes_s and c.speed_gbytes_s < rules["slower_share"] * fastest:
                yield g, HealthFinding(subject=subject, action=rules["slower_action"], code="nvlink_slow",
                                       source="nvidia-smi nvlink -s",
                                       text=f"NVLink {c.link} at {c.speed_gbytes_s:g} GB/s, below the "
                                            f"{fastest:g} GB/s of the fastest link in the paste: it trained at a "
                                            "lower speed; reset the GPU, drain the node if it stays slow")


def same_inactive_everywhere(gpus: list[PastedGpu]) -> list[int] | None:
    """The links inactive on every GPU of the paste when all GPUs share one set (the system's wiring), else None."""
    read = [g for g in gpus if g.status_read]
    sets = {tuple(sorted(c.link for c in g.links.values() if not c.active)) for g in read}
    if len(read) < 2 or len(sets) != 1 or any(links_all_wired(g.name) for g in read):
        return None
    return list(sets.pop()) or None
