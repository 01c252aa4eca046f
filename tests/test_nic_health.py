"""nic_health on sysfs trees of real RDMA devices (tests/fixtures/nic_sysfs, sources in SOURCE.md) and on real
network interfaces in private network namespaces. Faults are made on a copy of a tree WHILE the tool samples,
so the window logic is the one a node runs. The namespace-cluster test (a flap during a fleet_sweep) is
tests/test_nic_health_cluster.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tools import nic_health
from tools.engine.runner import execute
from tools.shared import topology

FIXTURES = Path(__file__).parent / "fixtures" / "nic_sysfs"
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A copy of a fixture tree as this process's sysfs root (the tool's seam: MLENG_SYSFS)."""
    def use(name: str) -> Path:
        root = tmp_path / name
        shutil.copytree(FIXTURES / name, root, symlinks=True)
        monkeypatch.setenv("MLENG_SYSFS", str(root))
        monkeypatch.setattr(topology, "SYSFS", root)
        return root
    return use


def port_dir(root: Path, device: str, port: int = 1) -> Path:
    return root / "class" / "infiniband" / device / "ports" / str(port)


def run(sample_s: float = 0, during=None):
    """nic_health's run(); `during(…)` changes the tree half way through the window."""
    if during:
        timer = threading.Timer(sample_s / 2, during)
        timer.start()
    try:
        return nic_health.run(nic_health.NicHealthParams(sample_s=sample_s), lambda f, m: None)
    finally:
        if during:
            timer.join()


def by_subject(result) -> dict:
    return {p.subject: p for p in result.rdma_ports}


def test_roce_node_from_a_real_report_is_healthy_through_the_runner(tree):
    tree("roce_mlx5_nccl1866")
    result = execute(nic_health.SPEC, nic_health.NicHealthParams(sample_s=0.5), timeout_s=60)
    assert result.verdict == "ok" and result.action == "none", result.findings
    assert [(p.device, p.port, p.state, p.rate_gbits, p.link_layer, p.gids) for p in result.rdma_ports] == [
        ("mlx5_0", 1, "ACTIVE", 100.0, "Ethernet", 1), ("mlx5_1", 1, "ACTIVE", 100.0, "Ethernet", 1)]
    assert result.rdma_ports[0].pci == "0000:17:00.0" and result.result_id
    present = {p.component: p for p in result.present}
    assert present["rdma_devices"].present and "mlx5_0, mlx5_1" in present["rdma_devices"].detail
    # perftest is installed on some machines that run this (the machine decides, the row must say which)
    installed = bool(shutil.which("ib_write_bw") and shutil.which("ib_write_lat"))
    assert present["perftest"].present is installed
    assert ("/ib_write_bw" in present["perftest"].detail) if installed else ("not present" in present["perftest"].detail)


def test_an_unused_disabled_ib_port_is_not_a_culprit_but_one_that_carried_traffic_is(tree):
    root = tree("ib_mlx4_rdmacore847")
    result = run()
    ports = by_subject(result)
    assert ports["mlx4_0 port 2"].verdict == "ok" and ports["mlx4_0 port 2"].rate == "56 Gb/sec (4X FDR)"
    assert ports["mlx4_0 port 1"].action == "none" and "unused" in ports["mlx4_0 port 1"].problems[0].text
    assert result.verdict == "ok" and ports["mlx4_0 port 1"].fw_ver == "2.42.5000"
    (port_dir(root, "mlx4_0", 1) / "counters" / "port_xmit_data").write_text("123456\n")
    ports = by_subject(run())
    assert ports["mlx4_0 port 1"].action == "drain_node", ports["mlx4_0 port 1"].problems


def test_link_downed_rising_in_the_window_drains_the_node_and_names_the_port(tree):
    root = tree("roce_mlx5_nccl1866")
    result = run(1.0, during=lambda: (port_dir(root, "mlx5_1") / "counters" / "link_downed").write_text("2\n"))
    ports = by_subject(result)
    assert ports["mlx5_0 port 1"].verdict == "ok"
    bad = ports["mlx5_1 port 1"]
    assert bad.action == "drain_node" and bad.window == {"link_downed": 2}
    assert "link_downed rose by 2 in the 1" in bad.problems[0].text
    assert result.actions == {"drain_node": ["mlx5_1 port 1"]}


def test_symbol_errors_rising_are_monitored_and_totals_alone_are_not_judged(tree):
    root = tree("roce_mlx5_nccl1866")
    (port_dir(root, "mlx5_0") / "counters" / "symbol_error").write_text("40\n")
    assert run(0.6).verdict == "ok"  # an old total: history, reported in counters, not judged
    result = run(1.0, during=lambda: (port_dir(root, "mlx5_0") / "counters" / "symbol_error").write_text("47\n"))
    port = by_subject(result)["mlx5_0 port 1"]
    assert port.action == "monitor" and port.counters["symbol_error"] == 47 and port.window == {"symbol_error": 7}


def test_a_counter_cleared_during_the_window_is_reported_as_a_reset_not_an_error(tree):
    root = tree("roce_mlx5_nccl1866")
    (port_dir(root, "mlx5_0") / "counters" / "symbol_error").write_text("40\n")
    result = run(1.0, during=lambda: (port_dir(root, "mlx5_0") / "counters" / "symbol_error").write_text("0\n"))
    port = by_subject(result)["mlx5_0 port 1"]
    assert port.verdict == "ok" and port.resets == ["symbol_error 40 -> 0"]
    assert any("went back during the window" in f for f in result.findings)


def test_a_saturated_counter_says_its_true_count_is_at_least_the_maximum(tree):
    root = tree("roce_mlx5_nccl1866")
    (port_dir(root, "mlx5_0") / "counters" / "symbol_error").write_text("65535\n")
    port = by_subject(run())["mlx5_0 port 1"]
    assert port.saturated == ["symbol_error"] and port.action == "monitor"
    assert "perfquery -R" in port.problems[0].text


def test_a_port_slower_than_its_peers_and_a_roce_port_without_gid_drain(tree):
    root = tree("roce_mlx5_nccl1866")
    (port_dir(root, "mlx5_1") / "rate").write_text("25 Gb/sec (1X EDR)\n")
    (port_dir(root, "mlx5_0") / "gids" / "0").write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
    ports = by_subject(run())
    assert [p.code for p in ports["mlx5_1 port 1"].problems] == ["ib_rate_degraded"]
    assert "25 Gb/sec (1X EDR)" in ports["mlx5_1 port 1"].problems[0].text
    assert [p.code for p in ports["mlx5_0 port 1"].problems] == ["roce_no_gid"]
    assert {p.action for p in ports.values()} == {"drain_node"}


def test_a_node_without_rdma_says_not_present(tmp_path, monkeypatch):
    monkeypatch.setenv("MLENG_SYSFS", str(tmp_path))
    monkeypatch.setattr(topology, "SYSFS", tmp_path)
    result = run()
    assert result.verdict == "ok" and result.rdma_ports == [] and result.netdevs == []
    present = {p.component: p for p in result.present}
    assert not present["rdma_devices"].present and present["rdma_devices"].detail.startswith("not present")
    assert any(f.startswith("rdma_devices: not present") for f in result.findings)


@pytest.mark.parametrize("sample_s", [-1, 301, "x"])
def test_bad_sample_window_names_the_field(sample_s):
    with pytest.raises(ValueError, match="sample_s"):
        nic_health.NicHealthParams(sample_s=sample_s)


# Real interfaces: a private pair of network namespaces per test; the node's end is veth0 in A, its "switch
# port" is veth1 in B, flapped from B as a cable pull would be.

def _ns_available() -> str | None:
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("nsenter"):
        return "needs root, iproute2 and nsenter"
    return None


@pytest.fixture
def veth_pair():
    why = _ns_available()
    if why:
        pytest.skip(why)
    tag = uuid.uuid4().hex[:6]
    a, b = f"nict{tag}a", f"nict{tag}b"
    ip = lambda *args: subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)  # noqa: E731
    ip("netns", "add", a)
    try:
        ip("netns", "add", b)
        ip("-n", a, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns", b)
        ip("-n", a, "link", "set", "veth0", "up")
        ip("-n", b, "link", "set", "veth1", "up")
        yield a, b
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


def _tool_in(namespace: str, how: str, sample_s: float) -> dict:
    """nic_health --json inside a namespace: `ip netns exec` remounts /sys (the sysfs path), `nsenter --net`
    keeps the host's /sys (the netlink path, as on a namespace-cluster node)."""
    enter = (["ip", "netns", "exec", namespace] if how == "sysfs" else ["nsenter", f"--net=/run/netns/{namespace}"])
    env = {k: v for k, v in os.environ.items() if k != "MLENG_SYSFS"}
    out = subprocess.run([*enter, sys.executable, "-m", "tools.nic_health", "--sample-s", str(sample_s), "--json"],
                         capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    result = json.loads(out.stdout or "{}")
    assert out.returncode == (3 if result.get("verdict") == "fail" else 0), out.stderr[-800:]  # the CLI's exit codes
    return result


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sysfs", "netlink"])
def test_a_real_link_flap_is_seen_and_a_quiet_link_is_not(veth_pair, how):
    a, b = veth_pair
    quiet = _tool_in(a, how, 1.0)
    assert [(n["name"], n["source"], n["verdict"]) for n in quiet["netdevs"]] == [("veth0", how, "ok")], quiet
    stop = threading.Event()

    def flap():
        while not stop.wait(0.5):
            subprocess.run(["ip", "-n", b, "link", "set", "veth1", "down"], check=True, timeout=10)
            time.sleep(0.1)
            subprocess.run(["ip", "-n", b, "link", "set", "veth1", "up"], check=True, timeout=10)

    flapper = threading.Thread(target=flap)
    flapper.start()
    try:
        result = _tool_in(a, how, 3.0)
    finally:
        stop.set()
        flapper.join()
    veth0 = result["netdevs"][0]
    assert veth0["verdict"] == "fail" and veth0["window"]["carrier_changes"] >= 2, veth0
    assert result["action"] == "drain_node" and "carrier changes in the 3" in " ".join(result["findings"])


# Pasted output (tests/fixtures/nic_text, sources in SOURCE.md).

TEXTS = Path(__file__).parent / "fixtures" / "nic_text"


def pasted(text: str):
    return nic_health.run(nic_health.NicHealthParams(text=text), lambda f, m: None)


def test_pasted_ibstat_from_a_real_report_reads_both_ports():
    result = pasted((TEXTS / "ibstat_rdmacore847.txt").read_text())
    ports = by_subject(result)
    assert (ports["mlx4_0 port 2"].state, ports["mlx4_0 port 2"].rate_gbits, ports["mlx4_0 port 2"].fw_ver) == \
        ("ACTIVE", 56.0, "2.42.5000")
    assert ports["mlx4_0 port 1"].state == "DOWN" and ports["mlx4_0 port 1"].action == "none"
    assert result.verdict == "ok" and "Read pasted ibstat output: 2 port(s)" in result.findings[1]


def test_pasted_perfquery_reads_counters_and_names_a_nonzero_error_counter():
    text = (TEXTS / "perfquery_x_infinibanddiags16.txt").read_text()
    clean = pasted(text)
    assert clean.verdict == "ok" and clean.rdma_ports[0].counters["link_downed"] == 0
    flapped = pasted(text.replace("LinkDownedCounter:...............0", "LinkDownedCounter:...............14"))
    port = flapped.rdma_ports[0]
    assert port.subject == "lid 10 port 1" and port.counters["link_downed"] == 14
    assert port.action == "monitor" and "link_downed = 14" in port.problems[0].text


@pytest.mark.parametrize("text", ["", "hello world", "+-----+\n| GPU | Name |\n"])
def test_text_in_another_format_names_the_formats_expected(text):
    with pytest.raises(Exception, match=r"text: not a format nic_health reads; expected `ibv_devinfo` output .* `ibstat` output .* `perfquery` .* `ibdiagnet` output"):
        pasted(text)


def test_pasted_ibv_devinfo_reads_state_firmware_and_link_layer():
    down = pasted((TEXTS / "ibv_devinfo_deepep60.txt").read_text())
    (port,) = down.rdma_ports
    assert (port.device, port.state, port.link_layer, port.fw_ver) == ("mlx5_12", "DOWN", "Ethernet", "22.38.1900")
    assert port.action == "none"  # one reading of a down port with no traffic counters: an unused port
    up = pasted((TEXTS / "ibv_devinfo_azhpc44.txt").read_text())
    assert [(p.device, p.state) for p in up.rdma_ports] == [("rdmaP23800p0s2", "ACTIVE")] and up.verdict == "ok"


# Pasted ibdiagnet output: the fabric's checks and the ports whose counters rose during its run.

def test_ibdiagnet_summary_of_a_clean_fabric_lists_its_checks_and_acts_on_none():
    result = pasted((TEXTS / "ibdiagnet_ar_summary_openai_recipe.txt").read_text())
    assert [(c.stage, c.warnings, c.errors) for c in result.fabric_checks] == \
        [("Discovery", 3, 0), ("Virtualization", 0, 0), ("Routing", 0, 0)]
    assert (result.verdict, result.action, result.rdma_ports) == ("ok", "none", [])
    assert [(f.subject, f.action) for f in result.fabric] == [("fabric (Discovery)", "none")]


def test_ibdiagnet_check_with_errors_is_named_with_its_count():
    text = (TEXTS / "ibdiagnet_ar_summary_openai_recipe.txt").read_text().replace(
        "-I- Routing                   0          0", "-I- Routing                   0          12")
    result = pasted(text)
    assert [(f.subject, f.action) for f in result.fabric if f.action != "none"] == [("fabric (Routing)", "monitor")]
    assert "1 with errors (Routing: 12)" in result.findings[0] and result.verdict == "warn"


def test_ibdiagnet_port_counter_rises_are_judged_like_a_nodes_ports():
    flap = pasted((TEXTS / "ibdiagnet_pm_rose_pot.txt").read_text())
    assert [(f.subject, f.code, f.action) for f in flap.fabric] == [
        ("Sfc6a1c03009be0c0/Nfc6a1c03009be0c0/P1/3/1", "ib_link_downed", "drain_node"),
        ("Sfc6a1c0300b00580/Nfc6a1c0300b00580/P1/5/1", "ib_symbol_error", "monitor")]
    assert flap.action == "drain_node" and "symbol_error rose by 27 during ibdiagnet's run" in flap.fabric[1].text
    upstream = pasted((TEXTS / "ibdiagnet_pm_rose_ncar.txt").read_text())
    assert [(f.subject, f.action) for f in upstream.fabric] == [
        ("Se41d2d03004bcfb0/Ne41d2d03004bcfb0/P20", "monitor"), ("r9i1n24/U1/P1", "monitor")]
    assert "rose by 117" in upstream.fabric[1].text and "upstream link" in upstream.fabric[1].text


def test_ibdiagnet_lines_with_the_logs_error_prefix_read_the_same():
    lines = (TEXTS / "ibdiagnet_pm_rose_ncar.txt").read_text().splitlines()
    result = pasted("\n".join("-E- " + line for line in lines))
    assert [f.subject for f in result.fabric] == ["Se41d2d03004bcfb0/Ne41d2d03004bcfb0/P20", "r9i1n24/U1/P1"]


# Each GPU's closest NIC (the PCIe path, as nvidia-smi topo -m names it), on a sysfs-shaped tree.

def _pci(root: Path, path: str, numa: int) -> str:
    dev = root / "devices" / path
    dev.mkdir(parents=True, exist_ok=True)
    (dev / "numa_node").write_text(f"{numa}\n")
    pci = path.rsplit("/", 1)[1]
    (root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
    os.symlink(dev, root / "bus/pci/devices" / pci)
    return pci


def _rdma(root: Path, name: str, pci: str) -> None:
    port = root / "class/infiniband" / name / "ports/1"
    port.mkdir(parents=True)
    os.symlink(root / "bus/pci/devices" / pci, root / "class/infiniband" / name / "device")
    (port / "state").write_text("4: ACTIVE\n")
    (port / "link_layer").write_text("InfiniBand\n")


def test_each_gpu_is_given_its_closest_nic_and_a_far_one_is_said(tmp_path, monkeypatch):
    """Two sockets: GPU 0 and mlx5_0 under one PCIe switch, GPU 1 and mlx5_1 under another root on NUMA 1.
    Each GPU's closest NIC is its own (PIX); with mlx5_1 gone, GPU 1's closest is across the sockets (SYS)."""
    gpu0 = _pci(tmp_path, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/0000:03:00.0", 0)
    nic0 = _pci(tmp_path, "pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0/0000:04:00.0", 0)
    gpu1 = _pci(tmp_path, "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:00.0/0000:83:00.0", 1)
    nic1 = _pci(tmp_path, "pci0000:80/0000:80:01.0/0000:81:00.0/0000:82:01.0/0000:84:00.0", 1)
    _rdma(tmp_path, "mlx5_0", nic0)
    _rdma(tmp_path, "mlx5_1", nic1)
    monkeypatch.setattr(topology, "SYSFS", tmp_path)
    fake_nvml = type(sys)("pynvml")
    fake_nvml.nvmlInit = fake_nvml.nvmlShutdown = lambda: None
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    gpus = [topology.GpuInfo(index=0, name="H100", pci=gpu0, numa_node=0),
            topology.GpuInfo(index=1, name="H100", pci=gpu1, numa_node=1)]
    monkeypatch.setattr(topology, "nvml_gpus", lambda nv: (gpus, []))
    from tools.nic_health import sample

    assert [(a.gpu, a.nic, a.path) for a in sample.affinity()] == [(0, "mlx5_0", "PIX"), (1, "mlx5_1", "PIX")]
    shutil.rmtree(tmp_path / "class/infiniband/mlx5_1")
    far = sample.affinity()
    assert [(a.gpu, a.nic, a.path) for a in far] == [(0, "mlx5_0", "PIX"), (1, "mlx5_0", "SYS")]
    findings = nic_health.summarise([], [], far, [], 0.0).findings
    assert "GPU 1 -> mlx5_0: SYS." in findings and not any(f.startswith("GPU 0 ->") for f in findings)


def _tc_in(namespace: str, *rule: str) -> None:
    subprocess.run(["ip", "netns", "exec", namespace, "tc", *rule], check=True, capture_output=True, timeout=10)


def test_a_per_destination_rate_limit_is_read_from_tc_and_named_with_the_peer(veth_pair, tmp_path):
    """Model rounds 7-8 (ssh-slow-link, cl-slow-link, cl-link-and-starved-node): pairwise named the link mln1-mln2
    and said to check tc rules on both ends, and no tool read them. The drills' own rule (an htb class at 50 Mbit/s
    and a u32 filter on the peer's address), set on a real interface, is read with the peer's name from the host's
    resolver; a plain tbf, and the interface without a shaper, too."""
    if not shutil.which("tc"):
        pytest.skip("needs tc (iproute2)")
    a, _ = veth_pair
    hosts = tmp_path / "hosts"   # `ip netns exec` binds /etc/netns/NS/hosts over /etc/hosts, as the cluster does
    netns_etc = Path("/etc/netns") / a
    netns_etc.mkdir(parents=True)
    try:
        (netns_etc / "hosts").write_text("127.0.0.1 localhost\n10.99.7.2 peer-node2\n")
        quiet = _tool_in(a, "sysfs", 0)
        assert quiet["netdevs"][0]["verdict"] == "ok" and not quiet["netdevs"][0]["problems"], quiet
        # Read and found unshaped, and said so (model round 9 on a clean eth0: "no tool shows tc qdisc").
        assert quiet["netdevs"][0]["root_qdisc"] == "noqueue", quiet["netdevs"][0]
        assert "tc: no rate limit or delay at the root of veth0 (noqueue): queueing only." in quiet["findings"], quiet
        for rule in (["qdisc", "add", "dev", "veth0", "root", "handle", "1:", "htb", "default", "10"],
                     ["class", "add", "dev", "veth0", "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit"],
                     ["class", "add", "dev", "veth0", "parent", "1:", "classid", "1:20", "htb", "rate", "50mbit"],
                     ["filter", "add", "dev", "veth0", "parent", "1:", "protocol", "ip", "u32", "match", "ip", "dst",
                      "10.99.7.2/32", "flowid", "1:20"]):
            _tc_in(a, *rule)
        shaped = _tool_in(a, "sysfs", 0)
        veth0 = shaped["netdevs"][0]
        assert veth0["verdict"] == "warn" and [p["code"] for p in veth0["problems"]] == ["traffic_shaper"], veth0
        said = veth0["problems"][0]["text"]
        assert ("a htb qdisc sends traffic to 10.99.7.2 (peer-node2) at 50Mbit (class 1:20); the rest at 10Gbit "
                "(class 1:10)") in said, said
        assert "`tc qdisc del dev veth0 root`" in said and shaped["action"] == "none" and shaped["verdict"] == "warn"
        # The shaper leads the answer, above "action for the node: none" (model round 12: three plays called the
        # census headline above it underselling the cause).
        assert shaped["findings"][0].startswith("veth0: a htb qdisc"), shaped["findings"]
        assert veth0["root_qdisc"] == "htb" and not any(f.startswith("tc: no rate") for f in shaped["findings"])
        _tc_in(a, "qdisc", "del", "dev", "veth0", "root")
        _tc_in(a, "qdisc", "add", "dev", "veth0", "root", "tbf", "rate", "50mbit", "burst", "32kbit", "latency", "400ms")
        tbf = _tool_in(a, "sysfs", 0)["netdevs"][0]["problems"][0]["text"]
        assert tbf.startswith("a tbf qdisc limits all traffic out of this interface to rate 50Mbit"), tbf
    finally:
        shutil.rmtree(netns_etc, ignore_errors=True)


def test_a_u32_match_is_read_as_an_address_only_under_a_prefix_mask():
    from tools.nic_health.shaping import _network

    assert _network("a630002", "ffffffff") == "10.99.0.2"          # tc prints the value without its leading zero
    assert _network("0ad50300", "ffffff00") == "10.213.3.0/24"
    assert _network("0ad50300", "ff00ff00") is None                # a match on something else than an address


def test_straggler_finds_sampler_counts_the_same_shapers_from_the_shared_tc_reader(veth_pair):
    """One reader of tc (tools/shared/tc.py) serves nic_health and straggler_find's node sampler: the sampler counts
    a shaping qdisc (here a tbf) on the node's interface, and leaves a queueing-only one (pfifo) out."""
    if not shutil.which("tc"):
        pytest.skip("needs tc (iproute2)")
    a, _ = veth_pair

    def counters() -> dict:
        out = subprocess.run(["ip", "netns", "exec", a, sys.executable, "-c",
                              "import json; from tools.straggler_find.probes import qdisc_counters; "
                              "print(json.dumps(qdisc_counters()))"],
                             capture_output=True, text=True, timeout=60, cwd=REPO, check=True)
        return json.loads(out.stdout)

    _tc_in(a, "qdisc", "replace", "dev", "veth0", "root", "pfifo")
    assert counters() == {}
    _tc_in(a, "qdisc", "replace", "dev", "veth0", "root", "tbf", "rate", "50mbit", "burst", "32kbit", "latency", "400ms")
    assert counters() == {"veth0:tbf": ["tbf", 0, 0]}
