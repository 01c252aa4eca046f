"""memory_estimate's fit verdict and the changes that make a setup fit (no SPEC: not a tool)."""

from pydantic import ValidationError

from .activations import NotModelled
from .memory_math import max_micro_batch, total_bytes
from .setup import Setup, setup_from, unmodelled
from ..shared.planning import GIB, capacity_gib, find_accelerator

MAX_TP = 8  # tensor parallelism beyond one NVLink domain (8 GPUs) is slow: not suggested


def candidate_changes(p) -> list[tuple[str, dict]]:
    """Single changes worth trying, least disruptive first."""
    if p.mode == "inference":
        changes = [("kv_dtype=fp8", {"kv_dtype": "fp8"}), ("precision=fp8 (fp8 weights)", {"precision": "fp8"})]
        changes += [(f"tp={p.tp * k}", {"tp": p.tp * k}) for k in (2, 4) if p.tp * k <= MAX_TP]
        return changes
    changes = []
    arch = p.architecture()
    if p.activation_checkpointing in ("none", "selective") and arch is not None and not arch.moe and not arch.mla:
        changes += [("activation_checkpointing=op_selective", {"activation_checkpointing": "op_selective"})]
    flash = setup_from(p).flash_attention
    if p.activation_checkpointing == "none" and not flash:  # with flash it saves nothing more
        changes += [("activation_checkpointing=selective", {"activation_checkpointing": "selective"})]
    if not flash and p.precision != "fp32":  # in fp32 there is no flash kernel to turn on: autocast is the change
        changes += [("flash_attention=true", {"flash_attention": True})]
    if p.kernels == "eager":
        changes += [("kernels=fused", {"kernels": "fused"})]
    if p.activation_checkpointing != "full":
        changes += [("activation_checkpointing=full", {"activation_checkpointing": "full"})]
    order = ["none", "zero1", "zero2", "zero3"]
    if p.dp * p.cp > 1 and p.sharding in order[:-1]:
        changes += [(f"sharding={s}", {"sharding": s}) for s in order[order.index(p.sharding) + 1:]]
    if p.optimizer in ("adam", "adamw"):
        changes += [("optimizer=adam_8bit", {"optimizer": "adam_8bit"})]
    if p.offload == "none" and p.sharding in ("zero1", "zero2", "zero3"):
        changes += [("offload=optimizer (CPU)", {"offload": "optimizer"})]
    changes += [(f"tp={p.tp * 2}", {"tp": p.tp * 2})] if p.tp * 2 <= MAX_TP else []
    changes += [(f"pp={p.pp * 2}", {"pp": p.pp * 2})]
    if p.sharding in ("zero3", "fsdp_full_shard"):
        changes += [(f"dp={p.dp * 2} (more GPUs to shard over)", {"dp": p.dp * 2})]
    return changes


def changes_that_fit(p, capacity_bytes: float) -> list[str]:
    """Single changes that fit; when none does, pairs of them."""
    singles = candidate_changes(p)
    found = _fitting(p, singles, capacity_bytes)
    if not found:
        pairs = [(f"{a} + {b}", {**ua, **ub}) for i, (a, ua) in enumerate(singles) for b, ub in singles[i + 1:]
                 if not ua.keys() & ub.keys()]
        found = _fitting(p, pairs, capacity_bytes)
    return found


def _fitting(p, changes: list[tuple[str, dict]], capacity_bytes: float) -> list[str]:
    found = []
    for label, update in changes:
        try:
            q = type(p)(**{**p.model_dump(exclude_unset=True), **update})
            s = setup_from(q)
            if unmodelled(s):
                continue
            total = total_bytes(s)
        except (ValidationError, NotModelled):  # e.g. tp that no longer divides the heads
            continue
        if total <= capacity_bytes:
            found.append(f"{label}: {total / GIB:.1f} GiB")
    return found


def judge(params, s: Setup, total: float, res) -> None:
    if params.gpu_memory_gib is not None:
        res.accelerator, res.capacity_gib = "given", params.gpu_memory_gib
    elif params.accelerator:
        acc = find_accelerator(params.accelerator)
        res.accelerator, res.capacity_gib = acc["name"], round(capacity_gib(acc), 2)
    else:
        res.findings.append("No accelerator given: set accelerator (e.g. h100) to check the fit.")
        return
    cap = res.capacity_gib * GIB
    res.fits = total <= cap
    res.max_micro_batch = max_micro_batch(s, cap) if s.arch is not None else None
    if res.fits:
        res.verdict = "ok" if total <= 0.9 * cap else "warn"
        res.findings.insert(0, f"Fits: {total / GIB:.1f} of {res.capacity_gib:.1f} GiB on {res.accelerator} "
                            f"({100 * total / cap:.0f}%).")
        if res.verdict == "warn":
            res.findings.append("Less than 10% headroom: allocator fragmentation or a longer batch can still OOM.")
    else:
        res.verdict = "fail"
        res.findings.insert(0, f"Does not fit: {total / GIB:.1f} GiB needed, {res.capacity_gib:.1f} GiB on "
                            f"{res.accelerator}.")
        res.changes_to_fit = changes_that_fit(params, cap)
        if res.changes_to_fit:
            res.findings.append("Changes that fit: " + "; ".join(res.changes_to_fit[:4]) + ".")
        else:
            res.findings.append("No single change or pair fits: add GPUs (tp/pp/dp), combine more, or offload to CPU.")
    if res.max_micro_batch == 0:
        res.findings.append("Even a micro batch of 1 sequence does not fit.")
    elif res.max_micro_batch is not None:
        what = "Most concurrent sequences that fit" if s.mode == "inference" else "Largest micro batch that fits"
        res.findings.append(f"{what}: {res.max_micro_batch}.")
