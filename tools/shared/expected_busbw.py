"""The busbw a healthy system reaches for given hardware (knowledge/data/interconnects.toml): used by
collective_bench to judge what it measures and by nccl_log_analyze to judge nccl-tests output a user pasted."""

from ..engine.data import load_data


def nic_link(rate_gbits: float | None, link_layer: str | None) -> str | None:
    """interconnects.toml link id for an RDMA port's rate and link layer."""
    if not rate_gbits:
        return None
    ethernet = (link_layer or "").lower() == "ethernet"
    if rate_gbits >= 800:
        return "ib-xdr"
    if rate_gbits >= 400:
        return "roce-400" if ethernet else "ib-ndr"
    return "ib-hdr" if rate_gbits >= 200 and not ethernet else None


def expected_across_nodes(ports: list[dict], nccl_env: dict) -> tuple[dict | None, str]:
    """Per-NIC expected busbw x the active RDMA ports of the first node (Ring across nodes)."""
    active = [p for p in ports if p.get("active")]
    kinds = {nic_link(p.get("rate_gbits"), p.get("link_layer")) for p in active}
    if not active or len(kinds) != 1 or None in kinds:
        return None, ("no expected figure across nodes: no single kind of active InfiniBand/RoCE port found "
                      "on the first node (gpu_topology lists the NICs)")
    link = kinds.pop()
    rec = next((r for r in load_data("interconnects").get("expected_busbw", [])
                if r.get("link") == link and r.get("gpus") == 0), None)
    if not rec:
        return None, f"no per-NIC figure for {link}"
    note = "" if nccl_env.get("NCCL_ALGO", "").lower() == "ring" else \
        "2-node runs with Tree or NVLS can read above the fabric; set NCCL_ALGO=RING to measure the network"
    return ({"id": f"{rec['id']} x {len(active)}", "busbw_gbps": rec["busbw_gbps"] * len(active), "algo": "ring"},
            note)


def expected_busbw(accelerator_id: str | None, gpus_per_node: int, nnodes: int, op: str,
                   nccl_env: dict | None = None, rdma: list[dict] | None = None) -> tuple[dict | None, str]:
    """(interconnects.toml expected_busbw record, note) for this hardware, or (None, why not)."""
    if accelerator_id == "cpu":
        return None, "CPU ranks (gloo): no expected figure"
    if not accelerator_id:
        return None, "GPU not recognised, so no expected figure"
    env = nccl_env or {}
    if nnodes > 1:
        return expected_across_nodes(rdma or [], env)
    nvls_off = env.get("NCCL_NVLS_ENABLE") == "0" or env.get("NCCL_ALGO", "").lower() in ("ring", "tree")
    records = [r for r in load_data("interconnects").get("expected_busbw", [])
               if accelerator_id in r.get("accelerators", []) and r.get("gpus", 0) > 0]
    want_algo = "nvls" if op == "all_reduce" and not nvls_off else "ring"
    for algo in dict.fromkeys([want_algo, "ring"]):
        exact = [r for r in records if r["gpus"] == gpus_per_node and r["algo"] == algo]
        if exact:
            return exact[0], "" if algo == want_algo else "NVLS figure missing, Ring used"
    ring = sorted((r for r in records if r["algo"] == "ring"), key=lambda r: abs(r["gpus"] - gpus_per_node))
    if ring:
        return ring[0], f"approximate: figure for {ring[0]['gpus']} GPUs, ran on {gpus_per_node}"
    return None, f"no expected figure for {gpus_per_node}x {accelerator_id}"
