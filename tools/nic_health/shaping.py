"""What shapes an interface's traffic on this host: `tc` qdiscs, classes and filters (the child side of nic_health).

A link slow between two hosts only, both fine with every other partner, is most often something on the path: a
rate limit or delay set with tc on one end is the one part of that path this host can read about itself. Counters
and carrier say nothing of it (a shaped link has no errors), and pairwise can name the link but not why (three
model rounds, 2026-12-03/04: "no tool reads tc, routes or firewall rules on the mln1-mln2 path").

Read with the `tc` binary in this process's network namespace (srun / ssh put the child in the node's). A qdisc
that only queues (fq, fq_codel, pfifo_fast, mq, noqueue, ...) is not reported; one that limits a rate or adds delay
(tbf, htb, hfsc, cbq, cake, netem) is, with its rate, and for a classful one which destinations its filters send to
which class. The text is tc's, from this host: numbers are parsed with bounded patterns, nothing in it is run.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from dataclasses import dataclass, field

from ..shared.tc import SHAPING_KINDS, tc_output

REMOVE = "; a setting to remove unless it is meant to be there: `tc qdisc del dev {} root`, and find what set it"
MAX_ROUTED = 8           # destinations named per interface (the rest counted)

QDISC = re.compile(r"^qdisc (\S{1,16}) (\S{1,16}) (root|parent \S{1,16})[^\n]{0,400}", re.M)
CLASS = re.compile(r"^class (\S{1,16}) (\S{1,16}) [^\n]{0,200}?\brate (\S{1,16})", re.M)
RATE = re.compile(r"\brate (\S{1,16})")
NETEM = re.compile(r"\b(delay \S{1,16}(?: \S{1,16})?|loss \S{1,16}|duplicate \S{1,16}|corrupt \S{1,16}|reorder \S{1,16})")
DEFAULT = re.compile(r"\bdefault ((?:0x)?[0-9a-f]{1,8})\b")
FILTER = re.compile(r"flowid (\S{1,16})[^\n]{0,200}\n\s+match ([0-9a-f]{1,8})/([0-9a-f]{8}) at (12|16)\b")


@dataclass
class Routed:
    """Traffic a filter sends to one class: to (offset 16) or from (offset 12) an address or subnet."""
    direction: str      # to | from
    network: str        # 10.213.3.2 or 10.213.3.0/24
    classid: str
    rate: str | None    # the class's rate ("50Mbit"), None when no class says one


@dataclass
class Shaper:
    interface: str
    kind: str                       # the root qdisc's kind
    rate: str | None = None         # tbf's (or a classless qdisc's) own rate
    effects: list[str] = field(default_factory=list)  # netem's delay / loss / ...
    default_class: str | None = None
    default_rate: str | None = None
    routed: list[Routed] = field(default_factory=list)


def read(interface: str) -> tuple[str | None, Shaper | None]:
    """The qdisc kind at the root of `interface` (None: no tc here, or no answer) and, when that kind shapes
    traffic, what it limits. The kind is said for a clean interface too: "no tool reads tc" was a model's note
    (round 9) on an interface nic_health had read and found unshaped."""
    roots = [m for m in QDISC.finditer(tc_output("qdisc", "show", "dev", interface)) if m.group(3) == "root"]
    if not roots:
        return None, None
    if roots[0].group(1) not in SHAPING_KINDS:
        return roots[0].group(1), None
    kind, handle, line = roots[0].group(1), roots[0].group(2), roots[0].group(0)
    shaper = Shaper(interface=interface, kind=kind)
    rate = RATE.search(line)
    shaper.rate = rate.group(1) if rate else None
    shaper.effects = NETEM.findall(line) if kind == "netem" else []
    if kind in ("htb", "hfsc", "cbq"):
        rates = {m.group(2): m.group(3) for m in CLASS.finditer(tc_output("class", "show", "dev", interface))}
        default = DEFAULT.search(line)
        if default:   # tc reads and prints class minors in hex ("default 10" is class 1:10, shown 0x10)
            shaper.default_class = f"{handle.rstrip(':')}:{int(default.group(1).removeprefix('0x'), 16):x}"
            shaper.default_rate = rates.get(shaper.default_class)
        for flowid, value, mask, offset in FILTER.findall(tc_output("filter", "show", "dev", interface)):
            network = _network(value, mask)
            if network:
                shaper.routed.append(Routed("to" if offset == "16" else "from", network, flowid, rates.get(flowid)))
    return kind, shaper


def _network(value: str, mask: str) -> str | None:
    """A u32 match on an IPv4 address (hex value and mask, as tc prints them) as an address or a subnet."""
    bits = bin(int(mask, 16)).count("1")
    if int(mask, 16) != (0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF:
        return None      # not a prefix mask: a u32 match on something other than an address
    net = ipaddress.IPv4Network((int(value, 16) & int(mask, 16), bits))
    return str(net.network_address) if bits == 32 else str(net)


def host_name(address: str) -> str | None:
    """The name this host's resolver gives `address` (/etc/hosts, DNS), within 2 s; None without one."""
    try:
        done = subprocess.run(["getent", "hosts", address], capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = done.stdout.split()[1:2] if done.returncode == 0 else []
    return names[0][:64] if names and re.fullmatch(r"[A-Za-z0-9_.\-]{1,64}", names[0][:64]) else None


def describe(shaper: Shaper) -> str:
    """The finding's text: what limits which traffic, in tc's own units, and where to see it."""
    where = f"`tc qdisc show dev {shaper.interface}`"
    if shaper.kind == "netem":
        return (f"a netem qdisc adds {', '.join(shaper.effects) or 'delay or loss'} to every packet out of this "
                f"interface (set on this host: {where}){REMOVE.format(shaper.interface)}")
    if not shaper.routed:
        limit = f"rate {shaper.rate}" if shaper.rate else (
            f"default class {shaper.default_class} at {shaper.default_rate}" if shaper.default_rate else "a shaper")
        return (f"a {shaper.kind} qdisc limits all traffic out of this interface to {limit} (set on this host: "
                f"{where}){REMOVE.format(shaper.interface)}")
    parts = []
    for r in shaper.routed[:MAX_ROUTED]:
        name = host_name(r.network) if "/" not in r.network else None
        parts.append(f"{r.direction} {r.network}{f' ({name})' if name else ''} at {r.rate or '?'} (class {r.classid})")
    more = f" and {len(shaper.routed) - MAX_ROUTED} more" if len(shaper.routed) > MAX_ROUTED else ""
    rest = f"; the rest at {shaper.default_rate} (class {shaper.default_class})" if shaper.default_rate else ""
    return (f"a {shaper.kind} qdisc sends traffic {'; '.join(parts)}{more}{rest}: a per-destination limit set on "
            f"this host ({where}, `tc filter show dev {shaper.interface}`){REMOVE.format(shaper.interface)}")
