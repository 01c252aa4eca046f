"""NVIDIA Xid and NVSwitch SXid events from kernel logs, and the action each calls for.

Meanings and actions come from knowledge/data/xid_catalog.toml (NVIDIA's Xid catalog, with the version read).
Reads the one-line form "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., <text>", Xid 45's "caused by previous Xid N",
Xid 154's recovery-action text, the newer multi-line "The NVIDIA GPU <bus> ... has fallen off the bus" message
(no Xid line at all), and "nvidia-nvswitchN: SXid (PCI:...): 20034, Fatal, ..." lines. NVLink5 Xids 144-150
are judged by the severity their line states (Fatal: the row's action; Non-fatal: none, per NVIDIA's decode table).
"""

import dataclasses
import re

from ..engine.data import load_data
from .actions import Action, escalate

XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+),(.*)")
PREVIOUS_XID = re.compile(r"caused by previous Xid (\d+)", re.IGNORECASE)
RECOVERY_CHANGED = re.compile(r"recovery action changed from .{0,200}? to 0x[0-9a-fA-F]+ \(([^)]+)\)", re.IGNORECASE)
# The message is spread over up to three kernel-log lines, each starting with "NVRM:" after the prefix.
FALLEN_MULTILINE = re.compile(
    r"NVRM: The NVIDIA GPU ([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s*\n"
    r"(?:[^\n]*?NVRM: [^\n]*\n){0,2}?[^\n]*?NVRM: fallen off the bus", re.MULTILINE)
# The head of an Xid 144-150 line: "<sub component> <Fatal|Nonfatal|Link Fatal> XC0 ..." (catalog format).
NVLINK5_HEAD = re.compile(r"^\s*([A-Z0-9_/]+)\s+(Link Fatal|Fatal|Non-?fatal)\b", re.IGNORECASE)
SXID_LINE = re.compile(r"nvidia-nvswitch(\d+): SXid \(PCI:([0-9a-fA-F:.]+)\): (\d+), (Fatal|Non-fatal)?,?\s*(.*)")


@dataclasses.dataclass
class XidEvent:
    bus: str                 # short PCI form 'bb:dd' (lower case), what NVML's bus id reduces to
    code: int                # Xid number (79 for the multi-line fallen-off-bus message); SXid number for switches
    text: str                # the rest of the line, cut at 160 characters
    previous: int | None = None   # Xid 45 "caused by previous Xid N"
    switch: int | None = None     # NVSwitch index for SXid events
    fatal: bool | None = None     # SXid Fatal / Non-fatal


def short_bus(bus_id: str) -> str:
    """'00000000:3B:00.0', '0000:3b:00' and '3b:00.0' -> '3b:00'."""
    parts = bus_id.lower().split(":")
    return ":".join(parts[-2:]).split(".")[0] if len(parts) >= 2 else bus_id.lower()


def parse_events(log_text: str) -> list[XidEvent]:
    """Every Xid / SXid event in a kernel log, in order of appearance."""
    found: list[tuple[int, XidEvent]] = []
    for m in XID_LINE.finditer(log_text):
        rest = m.group(3).strip()
        prev = PREVIOUS_XID.search(rest)
        found.append((m.start(), XidEvent(short_bus(m.group(1)), int(m.group(2)), rest[:160],
                                          previous=int(prev.group(1)) if prev else None)))
    for m in FALLEN_MULTILINE.finditer(log_text):
        found.append((m.start(), XidEvent(short_bus(m.group(1)), 79, "GPU has fallen off the bus (multi-line "
                                          "driver message, no Xid line)")))
    for m in SXID_LINE.finditer(log_text):
        found.append((m.start(), XidEvent(short_bus(m.group(2)), int(m.group(3)), m.group(5).strip()[:160],
                                          switch=int(m.group(1)), fatal=(m.group(4) == "Fatal") if m.group(4) else None)))
    return [e for _, e in sorted(found, key=lambda p: p[0])]


def catalog() -> dict:
    return load_data("xid_catalog")


def judge(event: XidEvent, repeated: bool = False) -> tuple[Action, str]:
    """(action, meaning) for one event; `repeated` when the same code came back on the same device."""
    data = catalog()
    if event.switch is not None:
        return _judge_sxid(data["sxid"], event, repeated)
    row = data["xid"].get(str(event.code))
    if row is None:
        return data["catalog"]["unknown_action"], (f"Xid {event.code} is not in the catalog mleng carries "
                                                    f"({data['catalog']['version']}): look it up at {data['catalog']['source']}")
    meaning = row["description"] + (f": {row['note']}" if row.get("note") else "")
    if event.code == 45 and event.previous is not None:
        return "none", f"{meaning} (this one names Xid {event.previous} as its cause: act on that)"
    if event.code == 154:
        wanted = RECOVERY_CHANGED.search(event.text)
        action = data["xid154_actions"].get(wanted.group(1).strip(), "monitor") if wanted else "monitor"
        return action, f"{meaning} (the driver asks for: {wanted.group(1) if wanted else 'not stated'})"
    if event.code in data["nvlink5"]["codes"]:
        return _judge_nvlink5(data["nvlink5"], row, event, repeated, meaning)
    return escalate(row["action"], repeated, row["on_repeat"]), meaning


def _judge_nvlink5(rules: dict, row: dict, event: XidEvent, repeated: bool, meaning: str) -> tuple[Action, str]:
    """Xid 144-150 by the severity the line states (the catalog's decode table, knowledge/data/xid_catalog.toml)."""
    head = NVLINK5_HEAD.match(event.text)
    if head is None:
        return escalate(row["action"], repeated, row["on_repeat"]), meaning + " (no severity in the line: worst case)"
    component, severity = head.group(1).upper(), head.group(2).lower()
    if "fatal" in severity and not severity.startswith("non"):
        return escalate(row["action"], repeated, row["on_repeat"]), f"{meaning} ({component}, {head.group(2)})"
    action = rules["nonfatal_by_component"].get(component.split("/")[0], rules["nonfatal_action"])
    return (escalate(action, repeated, rules["nonfatal_on_repeat"]),
            f"{meaning} ({component}, non-fatal: NVIDIA's decode table gives no recovery action"
            + (", unless an intrInfo bit calls for a GPU reset" if action != "none" else "") + ")")


def _judge_sxid(rules: dict, event: XidEvent, repeated: bool) -> tuple[Action, str]:
    if event.fatal:
        action = escalate(rules["fatal_action"], repeated, rules["fatal_on_repeat"])
        return action, "fatal NVSwitch error: the GPUs behind this switch lose the fabric until GPUs and switches are reset"
    action = escalate(rules["nonfatal_action"], repeated, rules["nonfatal_on_repeat"])
    return action, "non-fatal NVSwitch error, logged and corrected: watch whether it repeats on the same link"


def causes(events: list[XidEvent]) -> list[XidEvent]:
    """Events that are not consequences: Xid 45 (and 154) only point at other Xids."""
    return [e for e in events if e.switch is not None or e.code not in (45, 154)] or events
