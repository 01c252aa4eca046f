"""The pasted-output readers of gpu_health on the GPU box's own output: `nvidia-smi nvlink -s` / `-e` (and
`dcgmi diag -r 1`, table and -j, where DCGM is installed) read through gpu_health(text=...) must agree with what
gpu_health reads from NVML (or DCGM's JSON) on the same GPUs at the same moment. `python -m pytest
tests/gpu/test_pasted_nvlink_gpu.py -m gpu -s` prints FIGURE lines for docs/benchmarks.md. About 20 s."""

import shutil
import subprocess

import pytest

from tools.gpu_health import GpuHealthParams, dcgm, run

pytestmark = pytest.mark.gpu


def nvidia_smi(*args: str) -> str:
    if not shutil.which("nvidia-smi"):
        pytest.skip("no nvidia-smi on this machine")
    out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        pytest.skip(f"nvidia-smi {' '.join(args)} exited {out.returncode}: {(out.stderr or out.stdout).strip()[:200]}")
    return out.stdout


def test_nvlink_status_and_counters_pasted_agree_with_nvml():
    status, errors = nvidia_smi("nvlink", "-s"), nvidia_smi("nvlink", "-e")
    print(f"\nFIGURE nvidia-smi nvlink -s ({len(status.splitlines())} lines):\n{status[:1500]}")
    print(f"FIGURE nvidia-smi nvlink -e ({len(errors.splitlines())} lines):\n{errors[:1500]}")
    if "Link 0:" not in status:
        pytest.skip("nvidia-smi lists no NVLink link on this machine (a PCIe product or a VM without NVLink)")
    node = run(GpuHealthParams(sample_s=0, load=False, read_kernel_log=False), lambda *_: None)
    pasted = run(GpuHealthParams(text=status + "\n" + errors), lambda *_: None)
    print(f"FIGURE gpu_health(text=nvlink -s + -e): verdict {pasted.verdict}, action {pasted.action}")
    for line in pasted.findings:
        print(f"FIGURE   {line}")
    by_index = {g.index: g for g in node.gpus}
    for g in pasted.gpus:
        live = by_index[g.index]
        print(f"FIGURE GPU {g.index}: pasted {g.nvlink_active}/{g.nvlink_total} active, NVML {live.nvlink_active}/"
              f"{live.nvlink_total}")
        assert g.nvlink_active == live.nvlink_active, (g.nvlink_links, live.nvlink_links)
        nvml = {c.link: c for c in live.nvlink_links}
        for c in g.nvlink_links:
            if c.link in nvml and nvml[c.link].replay is not None and c.replay is not None:
                assert (c.replay, c.recovery) == (nvml[c.link].replay, nvml[c.link].recovery), c.link
    assert {g.index for g in pasted.gpus} <= set(by_index)


def test_dcgmi_table_and_json_give_the_same_results():
    if not dcgm.dcgmi_path():
        pytest.skip("DCGM is not installed here (no dcgmi on PATH)")
    table = subprocess.run(["dcgmi", "diag", "-r", "1"], capture_output=True, text=True, timeout=300).stdout
    as_json, note = dcgm.run_diag(1, timeout_s=300)
    if as_json is None:
        pytest.skip(note)
    print(f"\nFIGURE dcgmi diag -r 1:\n{table[:3000]}")
    from_table, _ = dcgm.parse(table)
    from_json, _ = dcgm.parse(as_json)
    statuses = lambda results: sorted({(r.test.lower(), r.status) for r in results})  # noqa: E731
    print(f"FIGURE table {statuses(from_table)}\nFIGURE json  {statuses(from_json)}")
    assert {s for _, s in statuses(from_table)} == {s for _, s in statuses(from_json)}
