"""p2p_bandwidth — copy bandwidth and latency between every pair of GPUs in this node; flags slow pairs.

For every ordered pair: unidirectional copy bandwidth (back-to-back copies timed with CUDA events on the
source GPU), bidirectional bandwidth (both directions at once), and small-copy latency; plus the
peer-access matrix. A pair below 70% of the median pair, or below 70% of its link's line rate (NVLink
count from NVML x per-link speed, or the PCIe generation, from knowledge/data), is flagged.
Measured NVLink copies reach about 80-88% of line rate (nccl issue 1264), PCIe less.

By hand:
    mleng run p2p_bandwidth                        # all visible GPUs, 256 MiB copies
    CUDA_VISIBLE_DEVICES=0,3 mleng run p2p_bandwidth --size-mib 1024
"""

import statistics
import time


from .engine.figures import Figure, Measured, SweepContract
from .engine.spec import SELF_EVIDENT, Field, Params, Record, Result, ToolFailure, ToolSpec
from .engine.data import load_data
from .engine.processes import local_gpu_count

FLAG_SHARE = 0.7


class P2pBandwidthParams(Params):
    size_mib: int = Field(256, ge=1, le=16384, description="Per copy.")
    iters: int = Field(20, ge=1, le=1000, description="Copies per timing.")
    warmup: int = Field(3, ge=0, le=100, json_schema_extra=SELF_EVIDENT, description="Untimed copies.")
    latency_iters: int = Field(200, ge=1, le=100000, description="8-byte copies for latency.")
    bidirectional: bool = Field(True, description="Also both directions at once.")


class PairResult(Record):
    src: int = Field(description="Source GPU.")
    dst: int = Field(description="Destination GPU.")
    link: str = Field("", description="NV<n> or the PCIe path (PIX/PXB/PHB/NODE/SYS).")
    peer_access: bool = Field(False, description="cudaDeviceCanAccessPeer(src, dst).")
    unidir_gbps: float = Field(0.0, description="src -> dst copy bandwidth, GB/s decimal.")
    bidir_gbps: float | None = Field(None, description="Both directions at once, sum, GB/s (listed on src < dst).")
    latency_us: float = Field(0.0, description="Time per 8-byte copy, launch included, microseconds.")
    expected_gbps: float | None = Field(None, description="Line rate of the link, one direction, GB/s.")
    flagged: bool = Field(False, description="Below 70% of the median pair or of its link.")


class P2pBandwidthResult(Result):
    gpu_count: int = Field(0, description="GPUs measured.")
    gpu: str | None = Field(None, description="GPU name.")
    pairs: list[PairResult] = Field(default_factory=list, description="Per ordered pair.")
    peer_matrix: list[list[bool]] = Field(default_factory=list, description="Peer access, [src][dst].")
    median_unidir_gbps: float | None = Field(None, description="Median unidirectional bandwidth over pairs, GB/s.")
    min_unidir_gbps: float | None = Field(None, description="Slowest pair, GB/s.")
    local_copy_gbps: float | None = Field(None, description="Copy within GPU 0 (read+write counted once), GB/s.")
    flagged_pairs: list[str] = Field(default_factory=list, description="'src->dst' of flagged pairs.")


def expected_link_gbps(link: str, gpu_name: str) -> float | None:
    """Line rate, one direction, of a pair's link: NV<n> x per-link speed, or the GPU's PCIe x16 rate."""
    from .shared.accelerators import match_accelerator
    from .shared.topology import ARCH_LINK

    accel = match_accelerator(gpu_name) or {}
    links = {r["id"]: r for r in load_data("interconnects")["link"]}
    if link.startswith("NV") and link[2:].isdigit():
        rec = links.get(ARCH_LINK.get(accel.get("arch", ""), ""))
        return int(link[2:]) * rec["per_link_unidir_gbps"] if rec else None
    gen = (accel.get("pcie") or "").lower().split()[:1]
    rec = links.get(f"pcie{gen[0][3:]}-x16") if gen and gen[0].startswith("gen") else None
    return rec["per_gpu_unidir_gbps"] if rec else None


def flag_pairs(pairs: list[PairResult]) -> tuple[float | None, list[str]]:
    """Mark pairs under FLAG_SHARE of the median pair or of their link; (median, findings)."""
    if not pairs:
        return None, []
    median = statistics.median(p.unidir_gbps for p in pairs)
    findings = []
    for p in pairs:
        low_vs_median = p.unidir_gbps < FLAG_SHARE * median
        low_vs_link = p.expected_gbps is not None and p.unidir_gbps < FLAG_SHARE * p.expected_gbps
        if low_vs_median or low_vs_link:
            p.flagged = True
            why = [f"{p.unidir_gbps / median:.0%} of the median pair ({median:.0f} GB/s)"] if low_vs_median else []
            if low_vs_link:
                why.append(f"{p.unidir_gbps / p.expected_gbps:.0%} of its {p.link} line rate ({p.expected_gbps:.0f} GB/s)")
            findings.append(f"GPU {p.src} -> GPU {p.dst} ({p.link or '?'}) copies at {p.unidir_gbps:.1f} GB/s: "
                            + " and ".join(why) + ".")
    return median, findings


def _copy_gbps(torch, dst, src, iters: int, warmup: int) -> float:
    for _ in range(warmup):
        dst.copy_(src)
    with torch.cuda.device(src.device):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(src.device)
        torch.cuda.synchronize(dst.device)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    return src.numel() * iters / seconds / 1e9


def _bidir_gbps(torch, a, b, a2, b2, iters: int) -> float:
    """a -> b and b2 -> a2 at the same time; host-timed (events cannot span two devices).

    A cross-device copy_ orders itself against the *current* stream of both devices, so each direction
    gets its own pair of streams; on the default streams the two directions would run one after the other.
    """
    devs = (a.device, b.device)
    fwd = (torch.cuda.Stream(devs[0]), torch.cuda.Stream(devs[1]))
    back = (torch.cuda.Stream(devs[1]), torch.cuda.Stream(devs[0]))
    for d in devs:
        torch.cuda.synchronize(d)
    t0 = time.perf_counter()
    for _ in range(iters):
        with torch.cuda.stream(fwd[0]), torch.cuda.stream(fwd[1]):
            b.copy_(a)
        with torch.cuda.stream(back[0]), torch.cuda.stream(back[1]):
            a2.copy_(b2)
    for d in devs:
        torch.cuda.synchronize(d)
    return 2 * a.numel() * iters / (time.perf_counter() - t0) / 1e9


def _latency_us(torch, dst, src, iters: int) -> float:
    with torch.cuda.device(src.device):
        dst.copy_(src)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(src.device)
        start.record()
        for _ in range(iters):
            dst.copy_(src)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / iters


def run(params: P2pBandwidthParams, progress) -> P2pBandwidthResult:
    try:
        import torch
    except ImportError:
        raise ToolFailure("torch is not installed: p2p_bandwidth copies with torch.cuda; install a CUDA build of torch") from None
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise ToolFailure("No CUDA GPUs visible (torch.cuda.is_available() is False): p2p_bandwidth needs NVIDIA "
                          "GPUs and a CUDA build of torch. On a CPU-only machine there is nothing to measure; check "
                          "the driver with env_report or gpu_health if GPUs should be there.")
    n = torch.cuda.device_count()
    name = torch.cuda.get_device_name(0)
    size = params.size_mib << 20
    progress(0.05, f"{n} GPUs: local copy on GPU 0")
    src0 = torch.empty(size, dtype=torch.uint8, device="cuda:0")
    local = _copy_gbps(torch, torch.empty_like(src0), src0, params.iters, params.warmup)
    del src0
    if n < 2:
        return P2pBandwidthResult(verdict="info", gpu_count=1, gpu=name, local_copy_gbps=round(local, 1),
                                  findings=[f"One GPU ({name}): no pairs to measure; a copy within it runs at "
                                            f"{local:.0f} GB/s. Pair bandwidth needs at least 2 GPUs."],
                                  next=["memory_bandwidth_bench", "gpu_topology"])
    links = _link_matrix(n)
    peer = [[i != j and torch.cuda.can_device_access_peer(i, j) for j in range(n)] for i in range(n)]
    bufs = [torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}") for i in range(n)]
    pairs: list[PairResult] = []
    total = n * (n - 1)
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            progress(0.1 + 0.85 * len(pairs) / total, f"GPU {i} -> GPU {j}")
            link = links[i][j] if links else ""
            pair = PairResult(src=i, dst=j, link=link, peer_access=peer[i][j],
                              unidir_gbps=round(_copy_gbps(torch, bufs[j], bufs[i], params.iters, params.warmup), 2),
                              latency_us=round(_latency_us(torch, bufs[j][:8], bufs[i][:8], params.latency_iters), 2),
                              expected_gbps=expected_link_gbps(link, name) if link else None)
            if params.bidirectional and i < j:
                back_src, back_dst = torch.empty(size, dtype=torch.uint8, device=f"cuda:{j}"), \
                    torch.empty(size, dtype=torch.uint8, device=f"cuda:{i}")
                pair.bidir_gbps = round(_bidir_gbps(torch, bufs[i], bufs[j], back_dst, back_src, params.iters), 2)
                del back_src, back_dst
            pairs.append(pair)
    median, flagged = flag_pairs(pairs)
    no_peer = [f"{p.src}->{p.dst}" for p in pairs if not p.peer_access]
    findings = [f"{n} x {name}: median GPU-pair copy {median:.0f} GB/s one way, slowest "
                f"{min(p.unidir_gbps for p in pairs):.0f} GB/s, median small-copy latency "
                f"{statistics.median(p.latency_us for p in pairs):.1f} us; copy within GPU 0 {local:.0f} GB/s."]
    if no_peer:
        findings.append(f"No peer access for {', '.join(no_peer[:8])}: those copies bounce through host memory "
                        "(check IOMMU/ACS settings and the driver; NCCL falls back to SHM there).")
    findings += flagged
    return P2pBandwidthResult(
        verdict="warn" if flagged or no_peer else "ok", gpu_count=n, gpu=name, pairs=pairs, peer_matrix=peer,
        median_unidir_gbps=round(median, 2), min_unidir_gbps=min(p.unidir_gbps for p in pairs),
        local_copy_gbps=round(local, 1), flagged_pairs=[f"{p.src}->{p.dst}" for p in pairs if p.flagged],
        findings=findings,
        next=(["gpu_topology", "gpu_health", "knowledge://network/intra-node.md"]
              + (["knowledge://network/acs-iommu.md"] if no_peer else []) if flagged or no_peer
              else ["collective_bench"]))


def _link_matrix(n: int) -> list[list[str]] | None:
    """NV<n>/PCIe path per pair from NVML (None when NVML is unavailable or sees other GPUs)."""
    try:
        import pynvml

        from .shared.topology import nvml_gpus

        pynvml.nvmlInit()
        try:
            _, matrix = nvml_gpus(pynvml)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None
    return matrix if len(matrix) == n else None


MEDIAN_PAIR = Figure("median_unidir_gbps", "GB/s", "higher")
SLOWEST_PAIR = Figure("min_unidir_gbps", "GB/s", "higher")
SWEEP = SweepContract(
    figures=(MEDIAN_PAIR, SLOWEST_PAIR),
    read=lambda res: [Measured(MEDIAN_PAIR, res.median_unidir_gbps), Measured(SLOWEST_PAIR, res.min_unidir_gbps)],
    evidence=lambda res: [f"slow pair {p}" for p in res.flagged_pairs])

SPEC = ToolSpec(
    name="p2p_bandwidth",
    summary="GPU-pair copy bandwidth (one way and both ways) and latency within a node; flags slow pairs.",
    description=(
        "Copy bandwidth (one way and both ways) and latency of every GPU pair in one node, and the "
        "peer-access matrix; flags slow pairs (below 70% of the median or of their link). Use when one GPU or "
        "pair is suspected slow, to know which pairs are fastest (tensor-parallel groups), after gpu_topology "
        "shows an odd link, when collective_bench is low inside a node, and on consumer or PCIe cards (RTX "
        "3090/4090/5090, RTX 6000 Ada) where peer access fails ('Peer access: No') or NCCL hangs unless "
        "NCCL_P2P_DISABLE=1. Seconds; >= 2 GPUs. No network."),
    Params=P2pBandwidthParams, Result=P2pBandwidthResult, run=run, runs="subprocess", needs_torch=True,
    read_only=True, destructive=False, idempotent=True, open_world=False, timeout_s=600,
    gpu_devices=lambda params: list(range(local_gpu_count())), metric="median_unidir_gbps", higher_is_better=True, sweep=SWEEP,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
