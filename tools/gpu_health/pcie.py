"""PCIe links of a GPU judged against what the link can really do.

A link trains to the lowest generation and width both of its ends support, so a Gen5 x16 GPU behind a
Gen4 switch port runs Gen4 by design: that is not a downtrained link. This module walks the PCI tree in
sysfs from the GPU up to the root port, takes, for each hop, the minimum of the two ends' maxima as what
the link should run, and compares it with what it runs. Idle GPUs drop their link generation to save power,
so readings are taken while the GPU is busy (the caller keeps a small load running), several times, and a
link whose speed or width changes between those readings is reported as flapping.
"""

import os
import re

from ..engine.spec import Field, Record
from ..shared.actions import HealthFinding

SYSFS_PCI = "/sys/bus/pci/devices"
BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
GTS_TO_GEN = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6}


class PcieHop(Record):
    bdf: str = Field(description="PCI address of the device at the lower end of this link.")
    gen: int | None = Field(None, description="Generation the link runs now.")
    width: int | None = Field(None, description="Lanes the link runs now.")
    max_gen: int | None = Field(None, description="Highest generation this device supports.")
    max_width: int | None = Field(None, description="Widest link this device supports.")


def gen_of(speed: str) -> int | None:
    """sysfs '16.0 GT/s PCIe' -> 4; None for 'Unknown' or an unexpected string."""
    m = re.match(r"\s*([0-9.]+)\s*GT/s", speed or "")
    return GTS_TO_GEN.get(float(m.group(1))) if m else None


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def read_hop(bdf: str, root: str = SYSFS_PCI) -> PcieHop:
    d = os.path.join(root, bdf)
    to_int = lambda s: int(s) if s and s.isdigit() else None  # noqa: E731
    return PcieHop(bdf=bdf, gen=gen_of(_read(f"{d}/current_link_speed") or ""),
                   width=to_int(_read(f"{d}/current_link_width")),
                   max_gen=gen_of(_read(f"{d}/max_link_speed") or ""), max_width=to_int(_read(f"{d}/max_link_width")))


def chain(bdf: str, root: str = SYSFS_PCI) -> list[PcieHop]:
    """The device and every bridge above it, device first, root port last (sysfs path order, reversed)."""
    real = os.path.realpath(os.path.join(root, bdf.lower()))
    bdfs = [part for part in real.split(os.sep) if BDF.match(part)]
    return [read_hop(b, root) for b in reversed(bdfs)]


def nvml_bdf(bus_id: str) -> str:
    """NVML's '00000000:3B:00.0' -> sysfs '0000:3b:00.0'."""
    dom, rest = bus_id.lower().split(":", 1)
    return f"{int(dom, 16):04x}:{rest}"


def expected(hops: list[PcieHop]) -> list[tuple[PcieHop, int | None, int | None]]:
    """(hop, gen it should run, width it should run) for each link: min of its two ends' maxima."""
    out = []
    for child, parent in zip(hops, hops[1:]):
        gens = [g for g in (child.max_gen, parent.max_gen) if g]
        widths = [w for w in (child.max_width, parent.max_width) if w]
        out.append((child, min(gens) if gens else None, min(widths) if widths else None))
    return out


def judge(subject: str, samples: list[list[PcieHop]], loaded: bool) -> list[HealthFinding]:
    """Findings for one GPU's chain, from several readings taken `loaded` (under load) or idle."""
    if not samples or len(samples[0]) < 2:
        return []
    found: list[HealthFinding] = []
    for i, (hop, want_gen, want_width) in enumerate(expected(samples[-1])):
        seen = [(s[i].gen, s[i].width) for s in samples if i < len(s) - 1]
        where = "GPU link" if i == 0 else f"upstream link at {hop.bdf}"
        if len(set(seen)) > 1:
            found.append(HealthFinding(text=f"{where} changes between readings under load: "
                                       + ", ".join(f"Gen{g} x{w}" for g, w in seen) + " (a flapping link: reseat, check the riser/cable)",
                                       action="drain_node", subject=subject, code="pcie_flapping", source="sysfs"))
            continue
        gen, width = seen[-1]
        if want_width and width and width < want_width:
            found.append(HealthFinding(text=f"{where} runs x{width}, both ends support x{want_width}: downtrained "
                                       "(host-device copies lose bandwidth in proportion); reseat or check the riser",
                                       action="drain_node", subject=subject, code="pcie_width", source="sysfs"))
        if loaded and want_gen and gen and gen < want_gen:
            found.append(HealthFinding(text=f"{where} runs Gen{gen} under load, both ends support Gen{want_gen}: "
                                       "downtrained speed", action="monitor", subject=subject, code="pcie_gen",
                                       source="sysfs"))
    return found


def capped_by_parent(samples: list[list[PcieHop]]) -> str | None:
    """A note when the GPU runs below its own maximum only because the port above it is slower (not a fault)."""
    if not samples or len(samples[-1]) < 2:
        return None
    gpu, port = samples[-1][0], samples[-1][1]
    if gpu.max_gen and port.max_gen and port.max_gen < gpu.max_gen and gpu.gen == port.max_gen:
        return f"runs Gen{gpu.gen}, the most its port {port.bdf} supports (the GPU supports Gen{gpu.max_gen}): expected, not a fault"
    return None
