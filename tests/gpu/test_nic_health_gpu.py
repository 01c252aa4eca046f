"""nic_health and env_report's network stack on the GPU box, through the runner as users run them.
`python -m pytest tests/gpu/test_nic_health_gpu.py -m gpu -s` prints FIGURE lines for docs/benchmarks.md.
The H200 box has no RDMA device: nic_health must say "not present" in a plain row, judge its Ethernet
interfaces, and give each GPU's closest NIC where one has a PCI address. About 10 s."""

import pytest
import torch

from tools import env_report, nic_health
from tools.engine.runner import execute

pytestmark = pytest.mark.gpu


def test_nic_health_on_the_gpu_box_says_what_is_not_present_and_judges_the_rest():
    r = execute(nic_health.SPEC, nic_health.NicHealthParams(sample_s=5), timeout_s=120)
    print(f"\nFIGURE nic_health on {torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}: verdict {r.verdict}, "
          f"action {r.action}, window {r.window_s} s")
    for line in r.findings:
        print(f"FIGURE   {line}")
    for n in r.netdevs:
        print(f"FIGURE   {n.name} ({n.kind}, {n.source}): {n.operstate}, carrier_changes {n.carrier_changes}, "
              f"{n.speed_mbps} Mb/s, MTU {n.mtu}, problems {[p.text for p in n.problems]}")
    for a in r.affinity:
        print(f"FIGURE   GPU {a.gpu} ({a.gpu_pci}) -> {a.nic}: {a.path}")
    present = {p.component: p for p in r.present}
    assert set(present) == {"rdma_devices", "ethtool", "perftest"}
    if not present["rdma_devices"].present:
        assert present["rdma_devices"].detail.startswith("not present") and r.rdma_ports == []
        assert any(f.startswith("rdma_devices: not present") for f in r.findings)
    assert r.netdevs, "a GPU node has at least one network interface"
    assert r.verdict in ("ok", "warn", "fail") and r.result_id


def test_env_report_records_the_network_stack_on_the_gpu_box():
    r = execute(env_report.SPEC, env_report.EnvReportParams(), timeout_s=180)
    print(f"\nFIGURE env_report network stack: plugin {r.nccl_net_plugin}; {r.rdma_core}; firmware {r.nic_firmware}; "
          f"kernel {r.kernel}; VBIOS {r.gpu_vbios}; container {r.container}")
    assert r.nccl_net_plugin and r.kernel
    assert r.gpu_vbios, "NVML gives every GPU's VBIOS version"
