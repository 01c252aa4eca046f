"""The network-stack facts env_report records and fleet_sweep compares (tools/shared/netstack.py): the NCCL net
plugin NCCL would load, found on real files in NCCL's search order; rdma-core from libibverbs' file name."""

from __future__ import annotations

import os

from tools import env_report
from tools.shared import netstack


def _lib(folder, name, content=b"plugin"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(content)
    return folder / name


def test_unset_plugin_variable_finds_libnccl_net_on_ld_library_path_first(tmp_path):
    first, second = _lib(tmp_path / "a", "libnccl-net.so", b"A"), _lib(tmp_path / "b", "libnccl-net.so", b"B")
    env = {"LD_LIBRARY_PATH": f"{first.parent}:{second.parent}"}
    found = netstack.net_plugin(env, cache={"libnccl-net.so": str(second)})
    assert found.startswith(f"{first} (sha256 ") and found != netstack.net_plugin(
        {"LD_LIBRARY_PATH": str(second.parent)}, cache={})


def test_a_plugin_name_tries_the_name_then_the_suffix_form(tmp_path):
    suffixed = _lib(tmp_path, "libnccl-net-ofi.so")
    env = {"LD_LIBRARY_PATH": str(tmp_path), "NCCL_NET_PLUGIN": "ofi"}
    assert netstack.plugin_candidates(env) == ["ofi", "libnccl-net-ofi.so"]
    assert netstack.net_plugin(env, cache={}).startswith(str(suffixed))
    absolute = {"NCCL_NET_PLUGIN": str(suffixed)}
    assert netstack.net_plugin(absolute, cache={}).startswith(str(suffixed))


def test_none_and_nothing_found_say_so(tmp_path):
    assert netstack.net_plugin({"NCCL_NET_PLUGIN": "none"}, cache={}) == "none (NCCL_NET_PLUGIN=none)"
    missing = netstack.net_plugin({"LD_LIBRARY_PATH": str(tmp_path), "NCCL_NET_PLUGIN": "sharp"}, cache={})
    assert missing.startswith("none found (sharp / libnccl-net-sharp.so)")


def test_rdma_core_version_comes_from_the_libibverbs_file_name(tmp_path, monkeypatch):
    real = _lib(tmp_path, "libibverbs.so.1.14.50.0")
    os.symlink(real, tmp_path / "libibverbs.so.1")
    monkeypatch.setenv("PATH", str(tmp_path))  # no ofed_info here
    assert netstack.rdma_core({"libibverbs.so.1": str(tmp_path / "libibverbs.so.1")}) == \
        "rdma-core 50.0 (libibverbs.so.1.14.50.0)"
    assert netstack.rdma_core({}) is None


def test_env_report_records_the_network_stack(monkeypatch, tmp_path):
    _lib(tmp_path, "libnccl-net.so")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    result = env_report.run(env_report.EnvReportParams(probe_torch=False), lambda f, m: None)
    assert result.nccl_net_plugin.startswith(f"{tmp_path}/libnccl-net.so (sha256 ")
    assert result.kernel == os.uname().release
    assert any(f.startswith("Network stack: NCCL net plugin ") for f in result.findings)


def test_a_fifo_named_like_the_plugin_is_never_opened(tmp_path):
    os.mkfifo(tmp_path / "libnccl-net.so")  # opening a FIFO with no writer would block the run forever
    assert netstack.net_plugin({"LD_LIBRARY_PATH": str(tmp_path)}, cache={}).startswith("none found")
