"""env_report — versions of the ML stack and the settings that break or slow distributed jobs.

Python, torch and what it was built with (CUDA/ROCm, cuDNN, NCCL), the driver and the newest CUDA it
supports, key packages, and every NCCL_* / TORCH_* / CUDA_* / PYTORCH_* variable, with warnings for
mismatches and settings that hurt. Torch is asked in a short child process so that no CUDA context
is ever created inside the MCP server.

By hand (any machine):
    mleng run env_report
    srun --ntasks-per-node=1 mleng run env_report --json     # one report per node, compare them
"""

import glob
import json
import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata

from .engine.redact import redact_data
from .engine.spec import Field, Params, Result, ToolSpec
from .shared import netstack

KEY_PACKAGES = ["torch", "deepspeed", "accelerate", "transformers", "flash-attn", "flash_attn", "megatron-core",
                "vllm", "triton", "apex", "torchtitan", "nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11",
                "nvidia-cudnn-cu12", "nvidia-cudnn-cu13", "nvidia-ml-py", "pynvml", "py-spy", "numpy", "mcp"]
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUDA_", "PYTORCH_", "NVIDIA_", "HIP_", "ROCR_", "FI_", "UCX_", "GLOO_")
ENV_EXTRA = ("OMP_NUM_THREADS", "LD_PRELOAD", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE")

# old name -> (new name, when it moved); both are honoured for a while, then the old one is ignored.
DEPRECATED_ENV = {
    "NCCL_ASYNC_ERROR_HANDLING": ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "torch 2.2"),
    "NCCL_BLOCKING_WAIT": ("TORCH_NCCL_BLOCKING_WAIT", "torch 2.2"),
    "NCCL_DESYNC_DEBUG": ("TORCH_NCCL_DESYNC_DEBUG", "torch 2.2"),
    "TORCH_NCCL_TRACE_BUFFER_SIZE": ("TORCH_FR_BUFFER_SIZE", "torch 2.9"),
    "TORCH_NCCL_DUMP_ON_TIMEOUT": ("TORCH_FR_DUMP_ON_TIMEOUT", "torch 2.9 (both still read)"),
    "PYTORCH_CUDA_ALLOC_CONF": ("PYTORCH_ALLOC_CONF", "torch 2.9 (old name still read)"),
}

# variable -> (bad values, why it hurts). A value of None means "any value".
HARMFUL_ENV = {
    "CUDA_LAUNCH_BLOCKING": ({"1"}, "every kernel launch waits for the GPU: a debugging switch that makes "
                             "training several times slower"),
    "NCCL_P2P_DISABLE": ({"1"}, "GPU-to-GPU traffic is forced through host memory instead of NVLink/PCIe P2P"),
    "NCCL_SHM_DISABLE": ({"1"}, "intra-node traffic without P2P falls back to the network stack"),
    "NCCL_IB_DISABLE": ({"1"}, "InfiniBand/RoCE is not used: inter-node traffic goes over TCP sockets"),
    "NCCL_DEBUG": ({"INFO", "TRACE"}, "verbose NCCL logging left on: fine for one debugging run, noisy and "
                   "slower at scale"),
    "TORCH_DISTRIBUTED_DEBUG": ({"DETAIL"}, "collective fingerprint checks on every call slow training down"),
    "NCCL_ALGO": (None, "forces NCCL's algorithm choice; keep only if you measured that it helps"),
    "NCCL_PROTO": (None, "forces NCCL's protocol; keep only if you measured that it helps"),
    "NCCL_NET_GDR_LEVEL": ({"0", "LOC"}, "GPUDirect RDMA is switched off: inter-node traffic bounces via the CPU"),
}

TORCH_PROBE = r"""
import json, torch
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
       "cudnn": None, "nccl": None, "cuda_available": torch.cuda.is_available(), "device_count": 0,
       "arch_list": [], "debug": torch.version.debug}
try:
    out["cudnn"] = torch.backends.cudnn.version()
except Exception:
    pass
try:
    v = torch.cuda.nccl.version()
    out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
except Exception:
    pass
if out["cuda_available"]:
    out["device_count"] = torch.cuda.device_count()
    out["arch_list"] = torch.cuda.get_arch_list()
print(json.dumps(out))
"""


class EnvReportParams(Params):
    include_all_env: bool = Field(False, description="Also LD_LIBRARY_PATH and PATH.")
    probe_torch: bool = Field(True, description="Ask torch (~2-5 s) for its CUDA/cuDNN/NCCL build.")


class EnvReportResult(Result):
    python: str | None = Field(None, description="Python version.")
    torch: str | None = Field(None, description="torch version.")
    torch_cuda: str | None = Field(None, description="CUDA version torch was built with (None: CPU or ROCm build).")
    torch_hip: str | None = Field(None, description="ROCm/HIP version torch was built with.")
    cudnn: int | None = Field(None, description="cuDNN version torch loads.")
    nccl: str | None = Field(None, description="NCCL version torch loads.")
    cuda_available: bool | None = Field(None, description="torch.cuda.is_available() in a fresh process.")
    gpu_count: int | None = Field(None, description="GPUs torch sees.")
    driver: str | None = Field(None, description="NVIDIA driver version (NVML).")
    driver_max_cuda: str | None = Field(None, description="Newest CUDA version this driver supports (NVML).")
    packages: dict[str, str] = Field(default_factory=dict, description="Versions of key ML packages present.")
    env: dict[str, str] = Field(default_factory=dict, description=(
        "NCCL_*, TORCH_*, CUDA_*, PYTORCH_* and related variables; secret ones (tokens, keys, passwords) as [REDACTED]."))
    nccl_libraries: list[str] = Field(default_factory=list, description="libnccl copies found (pip packages, LD_LIBRARY_PATH, LD_PRELOAD).")
    dev_shm_gib: float | None = Field(None, description="Size of /dev/shm, GiB (binary); None when absent.")
    nccl_net_plugin: str | None = Field(None, description="The NCCL net plugin NCCL would load (NCCL_NET_PLUGIN, then libnccl-net*.so in the loader's search order) with its sha256 prefix, or why none.")
    rdma_core: str | None = Field(None, description="MLNX_OFED version (ofed_info -s), else rdma-core from libibverbs' file name; None when absent.")
    nic_firmware: dict[str, str] = Field(default_factory=dict, description="RDMA device -> firmware version (sysfs fw_ver).")
    kernel: str | None = Field(None, description="Kernel release (uname -r).")
    gpu_vbios: str | None = Field(None, description="GPU VBIOS versions (NVML), comma-separated when they differ.")
    container: str | None = Field(None, description="The container runtime and image when inside one (None: not detected).")
    warnings: list[str] = Field(default_factory=list, description="Mismatches and harmful settings, one sentence each.")


def _packages() -> dict[str, str]:
    found = {}
    for name in KEY_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def _driver() -> tuple[str | None, str | None, str | None]:
    """(driver, newest CUDA it supports, GPU VBIOS versions) from NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return None, None, None
    try:
        drv = pynvml.nvmlSystemGetDriverVersion()
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040 -> 12.4
        return ((drv.decode() if isinstance(drv, bytes) else drv), f"{cuda // 1000}.{cuda % 1000 // 10}",
                netstack.vbios(pynvml))
    except Exception:
        return None, None, None
    finally:
        pynvml.nvmlShutdown()


def _nccl_libraries(packages: dict[str, str]) -> list[str]:
    libs = [f"pip package {p}=={v}" for p, v in packages.items() if p.startswith("nvidia-nccl")]
    for d in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(":")):
        libs += sorted(glob.glob(os.path.join(d, "libnccl.so*")))[:1]
    libs += [p for p in os.environ.get("LD_PRELOAD", "").replace(":", " ").split() if "nccl" in p]
    return libs


def _network_stack(vbios: str | None) -> dict:
    """The fields fleet_sweep compares across nodes beside the versions: what breaks NCCL between nodes."""
    cache = netstack.ld_cache()
    return {"nccl_net_plugin": netstack.net_plugin(dict(os.environ), cache), "rdma_core": netstack.rdma_core(cache),
            "nic_firmware": netstack.nic_firmware(), "kernel": netstack.kernel(), "gpu_vbios": vbios,
            "container": netstack.container()}


def _version_tuple(v: str | None) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in (v or "").split(".")[:2])
    except ValueError:
        return ()


# Below this, NCCL's shared-memory transport and DataLoader workers fail with "No space left on device"
# or bus errors; containers default to 64 MiB (docker --shm-size).
MIN_DEV_SHM_GIB = 1.0


def env_warnings(env: dict[str, str], torch_cuda: str | None, driver_max_cuda: str | None,
                 nccl_libraries: list[str], dev_shm_gib: float | None = None) -> list[str]:
    """Pure: the warnings for a set of variables and versions (tested directly)."""
    out = []
    if dev_shm_gib is not None and dev_shm_gib < MIN_DEV_SHM_GIB:
        out.append(f"/dev/shm is only {dev_shm_gib * 1024:.0f} MiB: NCCL's shared-memory transport and DataLoader "
                   "workers need more (bus errors, 'No space left on device'). In docker use --shm-size=16g or "
                   "--ipc=host.")
    for var, (bad, why) in HARMFUL_ENV.items():
        value = env.get(var)
        if value is not None and (bad is None or value.upper() in bad):
            out.append(f"{var}={value}: {why}.")
    for old, (new, when) in DEPRECATED_ENV.items():
        if old in env:
            both = f" Both are set; {new}={env[new]} wins." if new in env else ""
            out.append(f"{old} is deprecated since {when}: use {new}.{both}")
    if env.get("CUDA_VISIBLE_DEVICES") == "":
        out.append("CUDA_VISIBLE_DEVICES is set but empty: no GPU is visible to CUDA programs.")
    if torch_cuda and driver_max_cuda and _version_tuple(torch_cuda) > _version_tuple(driver_max_cuda):
        out.append(f"torch is built for CUDA {torch_cuda} but the driver supports CUDA {driver_max_cuda} at most: "
                   "CUDA init will fail ('driver too old') unless the compat package is installed. Upgrade the "
                   "driver or install a torch build for an older CUDA.")
    if len(nccl_libraries) > 1:
        out.append(f"More than one NCCL library can be loaded ({'; '.join(nccl_libraries)}): which one wins depends "
                   "on load order, and ranks may end up on different NCCL versions. Keep one.")
    return out


def run(params: EnvReportParams, progress) -> EnvReportResult:
    packages = _packages()
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_EXTRA}
    if params.include_all_env:
        env.update({k: os.environ[k] for k in ("LD_LIBRARY_PATH", "PATH") if k in os.environ})
    driver, driver_cuda, vbios = _driver()
    probe, probe_note = {}, None
    if params.probe_torch and "torch" in packages:
        try:
            out = subprocess.run([sys.executable, "-c", TORCH_PROBE], capture_output=True, text=True, timeout=120)
            if out.returncode == 0:
                probe = json.loads(out.stdout.strip().splitlines()[-1])
            else:
                probe_note = f"importing torch failed: {out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
        except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as e:
            probe_note = f"torch probe failed: {type(e).__name__}"
    libs = _nccl_libraries(packages)
    try:
        shm_gib = round(shutil.disk_usage("/dev/shm").total / 2**30, 2)
    except OSError:
        shm_gib = None
    warnings = env_warnings(env, probe.get("cuda"), driver_cuda, libs, shm_gib)
    if probe_note:
        warnings.insert(0, probe_note)
    if probe.get("cuda") and driver and not probe.get("cuda_available"):
        warnings.append("An NVIDIA driver is present and torch has CUDA, but torch.cuda.is_available() is False: "
                        "check CUDA_VISIBLE_DEVICES, the container's GPU access (/dev/nvidia*), and `nvidia-smi`.")
    result = EnvReportResult(
        python=platform.python_version(), torch=probe.get("torch") or packages.get("torch"),
        torch_cuda=probe.get("cuda"), torch_hip=probe.get("hip"), cudnn=probe.get("cudnn"), nccl=probe.get("nccl"),
        cuda_available=probe.get("cuda_available"), gpu_count=probe.get("device_count"), driver=driver,
        driver_max_cuda=driver_cuda, packages=packages, env=redact_data(env), nccl_libraries=libs, dev_shm_gib=shm_gib,
        warnings=warnings, **_network_stack(vbios))
    stack = f"torch {result.torch or 'not installed'}"
    if result.torch_cuda:
        stack += f" (CUDA {result.torch_cuda}, cuDNN {result.cudnn}, NCCL {result.nccl})"
    elif result.torch_hip:
        stack += f" (ROCm {result.torch_hip})"
    elif result.torch:
        stack += " (CPU build)"
    gpus = (f"driver {driver} (CUDA ≤ {driver_cuda}), {result.gpu_count or 0} GPU(s) visible to torch"
            if driver else "no NVIDIA driver (NVML not found)")
    result.findings = [f"Python {result.python}, {stack}; {gpus}.", f"Network stack: NCCL net plugin "
                       f"{result.nccl_net_plugin}; {result.rdma_core or 'no rdma-core / OFED'}; kernel {result.kernel}.",
                       *warnings]
    if not warnings:
        result.findings.append(f"{len(env)} relevant environment variables set; none known to hurt.")
    result.verdict = "warn" if warnings else "ok"
    result.next = (["knowledge://debugging/version-drift.md", "knowledge://network/nccl-env.md"] if warnings
                   else ["gpu_health"])
    return result


SPEC = ToolSpec(
    job_python=True,  # it reports the stack of the job's Python (engine/job_python.py)
    runs="subprocess",  # reads files / starts processes: under the runner's deadline and cancel
    name="env_report",
    summary="Python/torch/CUDA/cuDNN/NCCL/driver versions and NCCL_/TORCH_/CUDA_ env vars, with warnings.",
    description=(
        "Software stack of this machine and of the Python mleng runs in: torch and its CUDA/ROCm, cuDNN, NCCL, "
        "the driver and the "
        "newest CUDA it supports, key packages (deepspeed, transformers, flash-attn, vllm), every "
        "NCCL_/TORCH_/CUDA_/PYTORCH_ variable, /dev/shm size. Warns on mismatches (torch built for a newer "
        "CUDA than the driver, two NCCL copies) and settings that hurt (NCCL_P2P_DISABLE=1, NCCL_DEBUG=INFO "
        "left on, deprecated names). Use for 'CUDA not available', 'driver too old', 'undefined symbol' from "
        "flash_attn, 'The detected CUDA version mismatches', bus error or 'insufficient shared memory (shm)' "
        "in docker, comparing nodes. ~3-5 s. Not for GPU faults (gpu_health)."),
    Params=EnvReportParams, Result=EnvReportResult, run=run,
    doctor=lambda ctx: {}, doctor_order=10,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
