"""gpu_health on pasted `nvidia-smi nvlink -e` / `-s` and `dcgmi diag` table output (tests/fixtures/nvlink_text and
tests/fixtures/dcgm, sources in their SOURCE.md). Clean real reports must come out clean (no false culprit);
faulty variants made from the same texts must name the GPU and link with an action."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.engine.spec import ToolFailure
from tools.gpu_health import GpuHealthParams, run

NVLINK = Path(__file__).parent / "fixtures" / "nvlink_text"
DCGM = Path(__file__).parent / "fixtures" / "dcgm"


def pasted(text: str):
    return run(GpuHealthParams(text=text), lambda *_: None)


def problems(result):
    return [(p.subject, p.code, p.action) for g in result.gpus for p in g.problems] + \
        [(f.subject, f.code, f.action) for f in result.dcgm]


@pytest.mark.parametrize("name", ["nvlink_e_h100_mlengineering.txt", "nvlink_e_gb300_srtslurm307.txt",
                                  "nvlink_s_h100_mlengineering.txt"])
def test_clean_real_reports_are_clean(name):
    result = pasted((NVLINK / name).read_text())
    assert (result.verdict, result.action, problems(result)) == ("ok", "none", [])
    assert result.gpus and all(g.nvlink_links for g in result.gpus)


def test_error_counters_are_read_per_link():
    result = pasted((NVLINK / "nvlink_e_h100_mlengineering.txt").read_text())
    (gpu,) = result.gpus
    assert (gpu.index, gpu.name, gpu.uuid) == (0, "NVIDIA H100 80GB HBM3", "GPU-abcdefab-cdef-abdc-abcd-abababababab")
    assert [(c.link, c.replay, c.recovery, c.crc) for c in gpu.nvlink_links] == [(0, 0, 0, 0), (1, 0, 0, 0), (17, 0, 0, 0)]


def test_a_link_with_replay_errors_is_named_with_monitor_and_what_to_do_next():
    text = (NVLINK / "nvlink_e_h100_mlengineering.txt").read_text().replace("Link 1: Replay Errors: 0",
                                                                            "Link 1: Replay Errors: 2353")
    result = pasted(text)
    assert problems(result) == [("GPU 0", "nvlink_errors_total", "monitor")]
    text_of = result.gpus[0].problems[0].text
    assert text_of.startswith("NVLink 1: replay errors 2353 since") and "nvidia-smi nvlink -re" in text_of
    assert result.verdict == "warn" and result.actions == {"monitor": ["GPU 0"]}


def test_recovery_and_crc_errors_on_the_gb300_link_are_named():
    text = (NVLINK / "nvlink_e_gb300_srtslurm307.txt").read_text()
    result = pasted(text.replace("Recovery Errors: 0", "Recovery Errors: 3").replace("CRC Errors: 0", "CRC Errors: 65535"))
    (problem,) = result.gpus[0].problems
    assert problem.text.startswith("NVLink 0: recovery errors 3, crc errors 65535") and problem.action == "monitor"


def test_inactive_links_alone_cannot_be_compared_and_say_so():
    result = pasted((NVLINK / "nvlink_s_v100_azhpcdiag73.txt").read_text())
    (gpu,) = result.gpus
    assert (gpu.index, gpu.nvlink_active, gpu.nvlink_total) == (3, 4, 6)
    assert problems(result) == [("GPU 3", "nvlink_inactive", "monitor")]
    assert "links [3, 5] <inactive>" in gpu.problems[0].text and "paste every GPU" in gpu.problems[0].text


def test_a_gpu_with_fewer_active_links_than_its_peers_is_named_and_only_it():
    v100 = (NVLINK / "nvlink_s_v100_azhpcdiag73.txt").read_text()
    healthy_peer = "GPU 2: Tesla V100-SXM2-32GB (UUID: ...)\n" + "".join(
        f"         Link {n}: 25.781 GB/s\n" for n in range(6))
    result = pasted(healthy_peer + v100.split("....\n")[1])
    assert problems(result) == [("GPU 3", "nvlink_down", "reset_gpu")]
    assert "4 NVLink links active, 6 on other GPUs" in result.gpus[1].problems[0].text
    assert result.action == "reset_gpu" and result.actions == {"reset_gpu": ["GPU 3"]}


def test_the_same_links_inactive_on_every_gpu_is_wiring_not_a_fault():
    """H100 NVL over NVLink bridges: 6 of 18 links inactive on each GPU (NVIDIA/nccl#1608 was an NCCL setting)."""
    report = (NVLINK / "nvlink_s_h100nvl_nccl1608.txt").read_text()
    block = report.split("GPU 1:")[0].split("\n", 1)[1]          # GPU 0's block as printed
    both = block + block.replace("GPU 0: NVIDIA H100 NVL (UUID: GPU-5895e020-7d50-0c08-6ec8-e543a425c76c)",
                                 "GPU 1: NVIDIA H100 NVL (UUID: GPU-47cff5c0-7501-76b2-8258-f46f8b6af4a2)")
    result = pasted(both)
    assert (result.verdict, problems(result)) == ("ok", [])
    assert any("Links [4, 5, 10, 11, 16, 17] are inactive on every GPU" in f for f in result.findings)
    one_more_down = both.replace("GPU-47cff5c0-7501-76b2-8258-f46f8b6af4a2)\n         Link 0: 26.562 GB/s",
                                 "GPU-47cff5c0-7501-76b2-8258-f46f8b6af4a2)\n         Link 0: <inactive>")
    assert problems(pasted(one_more_down)) == [("GPU 1", "nvlink_down", "reset_gpu")]


def test_the_cut_report_judges_the_gpu_it_has_and_says_the_other_was_cut():
    result = pasted((NVLINK / "nvlink_s_h100nvl_nccl1608.txt").read_text())
    assert [g.index for g in result.gpus] == [0] and result.action == "monitor"
    assert any("GPU 1: no link lines under its header" in f for f in result.findings)


def test_a_slower_link_is_named():
    text = (NVLINK / "nvlink_s_h100_mlengineering.txt").read_text().replace("Link 17: 26.562", "Link 17: 13.281")
    result = pasted(text)
    assert problems(result) == [("GPU 0", "nvlink_slow", "reset_gpu")]
    assert "NVLink 17 at 13.281 GB/s, below the 26.562 GB/s" in result.gpus[0].problems[0].text


def test_dcgm_3x_split_row_names_the_failing_gpu_only():
    result = pasted((DCGM / "dcgmi_r2_gpu_memory_fail_mlengineering.txt").read_text())
    assert problems(result) == [("GPU 0", "GPU Memory", "drain_node")]
    (finding,) = result.dcgm
    assert "Thermal violations totaling 13.3 seconds started at 9.7 seconds into the test for GPU 0 Verify" in finding.text
    assert finding.text.endswith("and any other components.")


def test_dcgm_error_row_without_a_test_row_names_the_gpu_in_its_message():
    result = pasted((DCGM / "dcgmi_r3_row_remap_error_mlengineering.txt").read_text())
    assert [(f.subject, f.action) for f in result.dcgm] == [("GPU 3", "drain_node")]
    assert "GPU 3 has uncorrectable memory errors and row remappings are pending" in result.dcgm[0].text


@pytest.mark.parametrize("name,version,tests", [("dcgmi_r2_4x_pass_dcgm253.txt", "4.2.3", {"software", "memory"}),
                                                ("dcgmi_r2_3x_pass_godcgm52.txt", "3.3.1", {"Denylist", "Graphics Processes"})])
def test_dcgm_tables_that_pass_are_clean(name, version, tests):
    from tools.gpu_health import dcgm

    text = (DCGM / name).read_text()
    results, seen_version = dcgm.parse(text)
    assert seen_version == version and tests <= {r.test for r in results} and {r.status for r in results} == {"Pass"}
    result = pasted(text)
    assert (result.verdict, result.action, result.dcgm) == ("ok", "none", [])


def test_dcgm_4x_per_gpu_rows_and_warning_rows():
    """DCGM 4.x prints 'GPU<n>: <status>' per GPU and '| Warning: GPU<n> | msg |' (dcgmi/Diag.cpp)."""
    text = (DCGM / "dcgmi_r2_4x_pass_dcgm253.txt").read_text().replace(
        "|                           | GPU2: Pass                                     |",
        "|                           | GPU2: Fail                                     |\n"
        "| Warning: GPU2             | Persistence mode for GPU 2 is disabled.        |")
    from tools.gpu_health import dcgm

    results, _ = dcgm.parse(text)
    software = {r.gpu: (r.status, r.message) for r in results if r.test == "software"}
    assert software == {"0": ("Pass", ""), "1": ("Pass", ""), "2": ("Fail", "Persistence mode for GPU 2 is disabled."),
                        "3": ("Pass", "")}
    assert problems(pasted(text)) == [("GPU 2", "software", "drain_node")]


@pytest.mark.parametrize("text", ["", "hello world", "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n",
                                  "+-----+\n| Diagnostic | Result |\n+=====+\n"])
def test_text_in_another_format_names_the_formats_expected(text):
    with pytest.raises(ToolFailure, match=r"text: not a format gpu_health reads; expected `nvidia-smi nvlink -e` "
                                          r"output .* `nvidia-smi nvlink -s` output .* `dcgmi diag` output"):
        pasted(text)


def test_saved_dcgm_table_is_read_through_dcgm_file_too():
    result = run(GpuHealthParams(dcgm_file=str(DCGM / "dcgmi_r3_row_remap_error_mlengineering.txt"), sample_s=0,
                                 load=False, read_kernel_log=False), lambda *_: None)
    assert [(f.subject, f.action) for f in result.dcgm] == [("GPU 3", "drain_node")]


def test_on_a_board_where_every_link_is_wired_an_inactive_link_is_down_even_alone():
    """H100 SXM (NVSwitch board, 18 links wired: accelerators.toml): no peers needed to call a link down."""
    text = (NVLINK / "nvlink_s_h100_mlengineering.txt").read_text().replace("Link 17: 26.562 GB/s", "Link 17: <inactive>")
    result = pasted(text)
    assert problems(result) == [("GPU 0", "nvlink_down", "reset_gpu")]
    assert "every link of a NVIDIA H100 80GB HBM3 is wired" in result.gpus[0].problems[0].text


def test_the_same_link_down_on_every_gpu_of_an_nvswitch_board_is_not_called_wiring():
    block = (NVLINK / "nvlink_s_h100_mlengineering.txt").read_text().replace("Link 17: 26.562 GB/s", "Link 17: <inactive>")
    result = pasted(block + block.replace("GPU 0:", "GPU 1:"))
    assert problems(result) == [("GPU 0", "nvlink_down", "reset_gpu"), ("GPU 1", "nvlink_down", "reset_gpu")]
    assert not any("system's wiring" in f for f in result.findings)


def test_on_a_node_bridged_products_unused_links_are_wiring_and_a_lost_link_is_still_down():
    """The NVML path (gpu_health on the node) applies the same product rule: H100 NVL pairs use 12 of 18 links."""
    from tools.gpu_health import sampling

    def links(inactive):
        return [sampling.NvLinkCounters(link=i, active=i not in inactive) for i in range(18)]

    bridge = {4, 5, 10, 11, 16, 17}
    node = [("NVIDIA H100 NVL", links(bridge)), ("NVIDIA H100 NVL", links(bridge | {0}))]
    unwired = sampling.unwired_links(node)
    assert unwired == bridge
    assert sampling.judge_nvlink("GPU 0", node[0][1], node[0][1], 1.0, unwired) == []
    (lost,) = sampling.judge_nvlink("GPU 1", node[1][1], node[1][1], 1.0, unwired)
    assert lost.code == "nvlink_down" and "[0] down" in lost.text
    sxm = [("NVIDIA H100 80GB HBM3", links({17})), ("NVIDIA H100 80GB HBM3", links({17}))]
    assert sampling.unwired_links(sxm) == set()      # an NVSwitch board: link 17 down everywhere is a fault
    assert [f.code for f in sampling.judge_nvlink("GPU 0", sxm[0][1], sxm[0][1], 1.0, set())] == ["nvlink_down"]


def test_no_link_active_at_all_is_a_question_not_a_reset():
    """A VM slice of an NVSwitch board may expose no NVLink: every link <inactive> is asked about, not reset."""
    text = "GPU 0: NVIDIA H200 (UUID: GPU-1)\n" + "".join(f"         Link {n}: <inactive>\n" for n in range(18))
    result = pasted(text)
    assert problems(result) == [("GPU 0", "nvlink_none_active", "monitor")]
    assert "nvidia-fabricmanager" in result.gpus[0].problems[0].text


def test_reading_pasted_text_occupies_no_gpu(monkeypatch):
    from tools.engine import processes
    from tools.gpu_health import SPEC

    monkeypatch.setattr(processes, "local_gpu_count", lambda: 8)
    assert SPEC.gpu_devices(GpuHealthParams()) == list(range(8))          # a node reading loads every GPU
    assert SPEC.gpu_devices(GpuHealthParams(text="GPU 0: x\n Link 0: <inactive>\n")) == []


def test_two_readings_of_a_gpu_say_the_last_is_judged():
    before = (NVLINK / "nvlink_e_gb300_srtslurm307.txt").read_text()
    after = before.replace("Replay Errors: 0", "Replay Errors: 7")
    result = pasted(before + after)
    assert [c.replay for c in result.gpus[0].nvlink_links] == [7]
    assert any("GPU 0 is read twice in the paste: its last reading is judged" in f for f in result.findings)
    combined = pasted(before + (NVLINK / "nvlink_s_h100_mlengineering.txt").read_text())   # -e and -s: not twice
    assert not any("read twice" in f for f in combined.findings)
