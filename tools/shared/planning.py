"""Helpers shared by the planning tools (memory_estimate, mfu_calc, upgrade_roi); no SPEC."""

from ..engine.spec import ToolFailure

GIB = 2**30


def find_accelerator(name: str) -> dict:
    """The accelerators.toml record for a name, id or alias (what NVML reports works too), matched by
    accelerator_specs so both tools agree; an unknown name raises ToolFailure listing the known ids."""
    from .accelerators import accelerators, match_accelerator

    record = match_accelerator(name)
    if record is None:
        ids = ", ".join(a["id"] for a in accelerators())
        raise ToolFailure(f"accelerator {name!r} is not in knowledge/data/accelerators.toml; known ids: {ids}")
    return record


def capacity_gib(acc: dict) -> float:
    """Datasheet memory in GiB (datasheets print decimal GB)."""
    return acc["memory_gb"] * 1e9 / GIB


def gib(nbytes: float) -> float:
    return round(nbytes / GIB, 2)
