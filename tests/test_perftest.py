"""perftest runner and parsers (tools/shared/perftest.py). The parser reads a real ib_write_bw report
(tests/fixtures/perftest/SOURCE.md); the pair runner's plumbing (server first, client's output parsed, both
killed at the deadline) is checked with local processes standing in for the two srun steps. A real RDMA pair
needs two nodes with RDMA devices and perftest: not on this machine (say so), not on the H200 box either."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tools.shared import perftest

FIXTURES = Path(__file__).parent / "fixtures" / "perftest"

LAT_TABLE = """---------------------------------------------------------------------------------------
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
 2       1000          1.10           2.05         1.11              1.12            0.00            1.19                   2.05
---------------------------------------------------------------------------------------
"""


def test_bw_table_from_a_real_report():
    rows = perftest.parse_bw((FIXTURES / "ib_write_bw_perftest273.txt").read_text())
    assert rows == [perftest.BwRow(8, 224958464, 0.0, 0.48, 7.498617)]


def test_bw_in_megabytes_and_other_text_are_refused_naming_the_format():
    with pytest.raises(ValueError, match=r"run with --report_gbits"):
        perftest.parse_bw(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
                          " 65536      5000             3293.63            3293.56             0.052697\n")
    with pytest.raises(ValueError, match=r"expected an ib_write_bw table"):
        perftest.parse_bw("Couldn't connect to 10.0.0.1:18515\n")


def test_lat_table_every_column():
    (row,) = perftest.parse_lat(LAT_TABLE)
    assert (row.size_bytes, row.t_typical_us, row.p99_us, row.p999_us) == (2, 1.11, 1.19, 2.05)


def test_command_lines_server_and_client():
    assert perftest.argv("bw", "mlx5_0", 18515) == ["ib_write_bw", "-d", "mlx5_0", "-p", "18515", "-s", "1048576",
                                                    "-n", "2000", "-F", "--report_gbits"]
    assert perftest.argv("lat", "mlx5_1", 18516, server="10.0.0.7", gid_index=3)[-3:] == ["-x", "3", "10.0.0.7"]


def _local_launch(client_text: str | None, client_sleep_s: float = 0):
    """Stand-ins for the two srun steps: the server waits like ib_write_bw does; the client prints a report."""
    started = []

    def launch(node, argv):
        if argv[-1].startswith("10."):  # the client names the server
            code = f"import time,sys; time.sleep({client_sleep_s}); sys.stdout.write({client_text!r})"
        else:
            code = "import time; time.sleep(60)"
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        started.append(proc)
        return proc
    return launch, started


def test_pair_runner_reads_the_client_and_leaves_nothing_running(monkeypatch):
    monkeypatch.setattr(perftest, "SERVER_START_S", 0.1)
    launch, started = _local_launch((FIXTURES / "ib_write_bw_perftest273.txt").read_text())
    result = perftest.run_pair("n1", "n2", launch, test="bw", device="mlx5_0", port=18515, server_addr="10.0.0.1",
                               deadline_s=20)
    assert (result.value, result.unit, result.detail) == (0.48, "Gb/s", "ok")
    time.sleep(0.2)
    assert not [p.pid for p in started if psutil.pid_exists(p.pid) and p.poll() is None]


def test_pair_runner_names_a_hung_pair_at_the_deadline(monkeypatch):
    monkeypatch.setattr(perftest, "SERVER_START_S", 0.1)
    launch, started = _local_launch("", client_sleep_s=30)
    t0 = time.monotonic()
    result = perftest.run_pair("n1", "n2", launch, test="lat", device="mlx5_0", port=18515,
                               server_addr="10.0.0.1", deadline_s=1)
    assert result.value is None and "hung" in result.detail and time.monotonic() - t0 < 10
    time.sleep(0.2)
    assert all(p.poll() is not None for p in started)


def test_absent_perftest_says_not_present(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    ok, detail = perftest.available()
    assert not ok and detail == "not present (ib_write_bw, ib_write_lat not on PATH)"


class SaidOnNodes:
    """A transport whose nodes print the given lines: the readiness step's parsing without a cluster (the step runs
    for real by srun in tests/test_nic_health_cluster.py and over ssh in tests/test_collective_bench_ssh.py)."""

    def __init__(self, lines: dict[str, str], ends: dict | None = None):
        self.lines, self.ends, self.refused = lines, ends or {}, {}

    def run_step(self, nodes, argv, deadline_s, on_line):
        from tools.engine.transport import NodeEnd

        for node in nodes:
            for line in self.lines.get(node, "").splitlines():
                on_line(node, line)
        return {n: self.ends.get(n) or NodeEnd(n, "exited", 0) for n in nodes}


def test_rdma_readiness_names_each_node_and_what_it_lacks():
    """Each node's answer is the transport's: a line naming another node is still its own node's."""
    from tools.collective_bench import rdma_rounds
    from tools.engine.spec import ToolFailure
    from tools.engine.transport import NodeEnd

    printed = {"n1": "mlx5_0 /usr/bin/ib_write_bw /usr/bin/ib_write_lat", "n2": "- /usr/bin/ib_write_bw /usr/bin/ib_write_lat",
               "n4": "mlx5_1 - -", "n5": "n1 mlx5_0 /x/ib_write_bw /x/ib_write_lat"}
    dead = {"n3": NodeEnd("n3", "unreachable", why="n3: sshd not answering (Connection refused)"),
            "n6": NodeEnd("n6", "silent")}
    with pytest.raises(ToolFailure) as failure:
        rdma_rounds.readiness(SaidOnNodes(printed, dead), ["n1", "n2", "n3", "n4", "n5", "n6"])
    said = str(failure.value)
    assert "n1:" not in said and "n2: no RDMA device with an ACTIVE port;" in said
    assert "n3: no answer (sshd not answering (Connection refused));" in said and "n4: perftest not present" in said
    assert "n5: no answer;" in said and "n6: no answer within 60 s." in said
    ready = {"n1": "mlx5_0 /x/ib_write_bw /x/ib_write_lat", "n2": "mlx5_3 /x/ib_write_bw /x/ib_write_lat"}
    assert rdma_rounds.readiness(SaidOnNodes(ready), ["n1", "n2"]) == {"n1": ["mlx5_0"], "n2": ["mlx5_3"]}
    rails = {"n1": "mlx5_0,mlx5_1 /x/ib_write_bw /x/ib_write_lat", "n2": "mlx5_2,mlx5_3 /x/ib_write_bw /x/ib_write_lat"}
    assert rdma_rounds.readiness(SaidOnNodes(rails), ["n1", "n2"]) == {"n1": ["mlx5_0", "mlx5_1"],
                                                                       "n2": ["mlx5_2", "mlx5_3"]}


def test_rdma_readiness_script_lists_every_active_port_in_a_sysfs_tree(tmp_path):
    """The readiness shell line itself, on a tree laid out as /sys/class/infiniband is (ports/1/state)."""
    from tools.collective_bench import rdma_rounds

    for dev, state in (("mlx5_0", "4: ACTIVE"), ("mlx5_1", "1: DOWN"), ("mlx5_2", "4: ACTIVE")):
        (tmp_path / dev / "ports" / "1").mkdir(parents=True)
        (tmp_path / dev / "ports" / "1" / "state").write_text(state + "\n")
    tools_dir = tmp_path / "bin"       # the commands the line uses, and no perftest
    tools_dir.mkdir()
    for tool in ("grep", "basename", "dirname"):
        (tools_dir / tool).symlink_to(shutil.which(tool))
    script = rdma_rounds.READINESS.replace("/sys/class/infiniband", str(tmp_path))
    env = {"PATH": str(tools_dir)}
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env).stdout
    assert out.split() == ["mlx5_0,mlx5_2", "-", "-"]
    (tmp_path / "mlx5_0" / "ports" / "1" / "state").write_text("1: DOWN\n")
    (tmp_path / "mlx5_2" / "ports" / "1" / "state").write_text("2: INIT\n")
    out = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env).stdout
    assert out.split() == ["-", "-", "-"]


def test_rdma_round_measures_every_rail_and_names_the_slowest(monkeypatch):
    """Two nodes with two rails each (device names differ between them): rail k of one node with rail k of the
    other, the client on its own device; the pair's figure is its slowest rail, named in the record."""
    from tools.collective_bench import rdma_rounds

    monkeypatch.setattr(perftest, "SERVER_START_S", 0.05)
    bw = (FIXTURES / "ib_write_bw_perftest273.txt").read_text()
    lat = (FIXTURES / "ib_write_lat_dgxspark_playbooks.txt").read_text()
    reports = {("ib_write_bw", "mlx5_2"): bw.replace(" 0.48 ", " 392.10 "), ("ib_write_bw", "mlx5_3"): bw,
               ("ib_write_lat", "mlx5_2"): lat, ("ib_write_lat", "mlx5_3"): lat.replace(" 1.47 ", " 2.50 ", 1)}
    clients = []

    def launch(node, argv):
        if argv[-1].startswith("10."):
            clients.append((node, argv[0], argv[argv.index("-d") + 1], argv[-1]))
            code = f"import sys; sys.stdout.write({reports[(argv[0], argv[argv.index('-d') + 1])]!r})"
        else:
            code = "import time; time.sleep(60)"
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    (run,) = rdma_rounds.run_round_rdma([[0, 1]], names=["n1", "n2"], devices={"n1": ["mlx5_0", "mlx5_1"],
                                        "n2": ["mlx5_2", "mlx5_3"]}, addresses={"n1": "10.0.0.1", "n2": "10.0.0.2"},
                                        deadline_s=40, launch=launch)
    assert sorted(clients) == [("n2", t, d, "10.0.0.1") for t in ("ib_write_bw", "ib_write_lat")
                               for d in ("mlx5_2", "mlx5_3")]
    assert run.status == "ok" and run.busbw_gbps == pytest.approx(0.48 / 8) and run.latency_us == 2.5
    assert run.detail == "2 rails, slowest mlx5_1->mlx5_3: mlx5_0->mlx5_2 392.1 Gb/s, mlx5_1->mlx5_3 0.48 Gb/s"


def test_lat_table_from_a_real_report():
    (row,) = perftest.parse_lat((FIXTURES / "ib_write_lat_dgxspark_playbooks.txt").read_text())
    assert row == perftest.LatRow(2, 1000, 1.42, 1.93, 1.47, 1.47, 0.0, 1.57, 1.93)


def test_lat_row_is_read_past_perftests_cpu_frequency_warning():
    """Without -F perftest prints a warning line between the header and each row (many public reports show it)."""
    text = (FIXTURES / "ib_write_lat_dgxspark_playbooks.txt").read_text().replace(
        "99.9% percentile[usec]\n",
        "99.9% percentile[usec]\nConflicting CPU frequency values detected: 1500.000000 != 3393.826000. "
        "CPU Frequency is not max.\n")
    assert [r.t_typical_us for r in perftest.parse_lat(text)] == [1.47]


@pytest.mark.skipif(not perftest.available()[0], reason="perftest (ib_write_bw, ib_write_lat) is not installed here")
@pytest.mark.skipif(any(Path("/sys/class/infiniband").glob("*")), reason="this machine has RDMA devices")
@pytest.mark.parametrize("test", ["bw", "lat"])
def test_real_perftest_on_a_machine_without_rdma_says_not_present(test):
    """The real ib_write_bw / ib_write_lat, server and client on this machine, which has no RDMA device: the pair
    gets a plain 'not present' answer naming the node, and neither process is left running."""
    started = []

    def launch(node, argv):
        started.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        start_new_session=True))
        return started[-1]

    result = perftest.run_pair("n1", "n2", launch, test=test, device="mlx5_0", port=18631, server_addr="127.0.0.1",
                               deadline_s=20)
    assert result.value is None and result.detail.startswith("not present: no RDMA device on n2"), result.detail
    assert [p.args[0] for p in started] == [perftest.TESTS[test]] * 2
    time.sleep(0.2)
    assert all(p.poll() is not None for p in started)
