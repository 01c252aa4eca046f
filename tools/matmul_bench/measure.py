"""Timing one matmul shape on a GPU (CUDA or ROCm) or, for tests, on the CPU. Imports torch: call
only from inside a tool's run(), in the child process.

How a shape is timed (the careful way; each point changes the answer if skipped):
- inputs are normally distributed (all-zero or constant inputs draw less power and run faster);
- before every timed iteration the output is re-randomised and the L2 cache is flushed by writing a
  buffer twice its size, so no iteration reads its operands from cache or skips the output write;
- each iteration is timed alone with a pair of CUDA/HIP events around the matmul only, all queued
  back to back and read after one synchronize (no host round-trip between iterations);
- the card is warmed until its throughput is stable (see warm_until_stable), not for a fixed time.
"""

import statistics
import time

from .search import Shape, Timing, Warmup, warm_until_stable
from ..shared.timing import iteration_times

DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8")
FP8_ALIGN = 16  # torch._scaled_mm needs every dimension divisible by 16


class Unsupported(Exception):
    """The dtype or device cannot run here; the message says why and what to do instead."""


class MatmulTimer:
    """measure(shape, iterations, warmup) -> Timing | None (None: the shape does not fit in memory)."""

    def __init__(self, device: int | str, dtype: str):
        import torch

        self.torch = torch
        self.dtype_name = dtype
        self.is_cpu = device == "cpu"
        self.device = torch.device("cpu") if self.is_cpu else torch.device("cuda", int(device))
        self.is_rocm = bool(getattr(torch.version, "hip", None))
        if not self.is_cpu:
            torch.cuda.set_device(self.device)
        self._setup_dtype(dtype)
        self.errors: list[str] = []  # shapes that raised (not out-of-memory), with the first line of the error
        self.flush = None
        self.compute_units = 0  # SMs (NVIDIA) or CUs (AMD)
        if not self.is_cpu:
            props = torch.cuda.get_device_properties(self.device)
            self.compute_units = int(props.multi_processor_count)
            l2 = int(getattr(props, "L2_cache_size", 0) or 0) or 64 << 20
            self.flush = torch.empty(2 * l2, dtype=torch.int8, device=self.device)

    def _setup_dtype(self, dtype: str) -> None:
        torch = self.torch
        self.fp8 = dtype == "fp8"
        if dtype not in DTYPES:
            raise Unsupported(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        if self.fp8:
            self.fp8_dtype = self._fp8_dtype()
            self.in_dtype, self.out_dtype = self.fp8_dtype, torch.bfloat16
            self.scale = torch.ones((), dtype=torch.float32, device=self.device)
        else:
            self.in_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16,
                             "tf32": torch.float32, "fp32": torch.float32}[dtype]
            self.out_dtype = self.in_dtype
        if not self.is_cpu:
            # tf32 and fp32 differ only in this switch; set it every time, someone may have changed it.
            # torch >= 2.9 has fp32_precision and warns about allow_tf32; never mix the two APIs.
            matmul = torch.backends.cuda.matmul
            if hasattr(matmul, "fp32_precision"):
                matmul.fp32_precision = "tf32" if dtype == "tf32" else "ieee"
            else:
                matmul.allow_tf32 = dtype == "tf32"

    def _fp8_dtype(self):
        torch = self.torch
        if self.is_cpu:
            raise Unsupported("fp8 needs a GPU with fp8 tensor cores (NVIDIA compute capability 8.9 or newer: "
                              "L4, L40S, H100, H200, B200...; AMD MI300 series or newer); device='cpu' cannot run it. "
                              "Use dtype='bf16' on the CPU.")
        if not hasattr(torch, "_scaled_mm"):
            raise Unsupported(f"torch {torch.__version__} has no torch._scaled_mm: upgrade torch (2.4 or newer) for fp8")
        if self.is_rocm:
            arch = getattr(torch.cuda.get_device_properties(self.device), "gcnArchName", "")
            if "gfx94" in arch:
                return torch.float8_e4m3fnuz  # MI300 series: the fnuz variant
            if "gfx95" in arch:
                return torch.float8_e4m3fn     # MI350 series: OCP fp8
            raise Unsupported(f"this AMD GPU ({arch or 'unknown arch'}) has no fp8 matrix cores (MI300 or newer needed)")
        cc = torch.cuda.get_device_capability(self.device)
        if cc < (8, 9):
            raise Unsupported(f"{torch.cuda.get_device_name(self.device)} is compute capability {cc[0]}.{cc[1]}; "
                              "fp8 matmul needs 8.9 or newer (Ada, Hopper, Blackwell). Use bf16 on this GPU.")
        return torch.float8_e4m3fn

    # ------------------------------------------------------------------------------------------
    def _operands(self, shape: Shape):
        torch = self.torch
        m, n, k = shape
        gen_dtype = torch.bfloat16 if self.fp8 else self.in_dtype
        a = torch.randn(m, k, device=self.device, dtype=gen_dtype)
        if self.fp8:
            a = a.to(self.fp8_dtype)
            b = torch.randn(n, k, device=self.device, dtype=gen_dtype).to(self.fp8_dtype).t()  # column-major
        else:
            b = torch.randn(k, n, device=self.device, dtype=gen_dtype)
        c = torch.empty(m, n, device=self.device, dtype=self.out_dtype)
        return a, b, c

    def _bytes_needed(self, shape: Shape) -> int:
        m, n, k = shape
        in_size = 1 if self.fp8 else self.torch.empty((), dtype=self.in_dtype).element_size()
        out_size = self.torch.empty((), dtype=self.out_dtype).element_size()
        extra = 2 * max(m * k, n * k) if self.fp8 else 0  # bf16 staging before the fp8 cast
        return (m * k + k * n) * in_size + 2 * m * n * out_size + extra

    def fits(self, shape: Shape) -> bool:
        if self.is_cpu:
            return True
        free, _total = self.torch.cuda.mem_get_info(self.device)
        return self._bytes_needed(shape) < 0.9 * free

    def _op(self, a, b, c):
        torch = self.torch
        if self.fp8:
            return lambda: torch._scaled_mm(a, b, self.scale, self.scale, out_dtype=self.out_dtype)
        return lambda: torch.mm(a, b, out=c)

    def measure(self, shape: Shape, iterations: int, warmup: int) -> Timing | None:
        if self.fp8 and any(d % FP8_ALIGN for d in shape):
            raise Unsupported(f"fp8 shapes need every dimension divisible by {FP8_ALIGN} (got {shape})")
        if not self.fits(shape):
            return None
        torch = self.torch
        try:
            a, b, c = self._operands(shape)
            op = self._op(a, b, c)
            for _ in range(warmup):
                op()
            times = tuple(iteration_times(op, iterations, self.device, before=lambda: self._refresh(c)))
        except torch.OutOfMemoryError:
            times = None
            torch.cuda.empty_cache()
        except RuntimeError as e:  # a BLAS error on one shape should not end the whole search
            self.errors.append(f"{shape[0]}x{shape[1]}x{shape[2]}: {str(e).splitlines()[0][:200]}")
            if len(self.errors) >= 10:
                raise Unsupported(f"{len(self.errors)} shapes failed, the last with {self.errors[-1]}") from e
            times = None
        finally:
            a = b = c = op = None  # release before the next shape allocates
        return Timing(shape, times) if times else None

    def _refresh(self, c) -> None:
        """Outside the timed region: fresh output values (the card really writes), and on a GPU an L2 flush."""
        c.normal_()
        if self.flush is not None:
            self.flush.zero_()

    def cool_down(self, seconds: float) -> None:
        """Run a light load for `seconds` so a power-capped card's clock climbs back to its maximum.

        Light: 2048^3 matmuls with the cache flush between them draw well under an H200's 700 W, and
        its clock returns to 1980 MHz (bench/clock_settle.py). A load, not an idle pause, because an
        idle card may drop to its idle clocks. No-op on the CPU (no power controller to wait for)."""
        if not self.is_cpu:
            self.run_for((2048, 2048, 2048), seconds)

    def run_for(self, shape: Shape, seconds: float) -> None:
        """Run `shape` as measure() does (cache flush between iterations) for about `seconds`, untimed."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:  # measure() synchronizes, so the host clock follows the GPU's work
            self.measure(shape, 50, 0)

    # ------------------------------------------------------------------------------------------
    def warm_up(self, *, min_s: float, max_s: float, shape: Shape | None = None, batch_s: float = 0.5,
                tolerance: float = 0.01) -> Warmup:
        """Run one large shape in batches of about batch_s seconds until the throughput of the last three
        batches agrees within `tolerance`. Batches this long see clocks fall as the card heats; short ones would not."""
        if shape is None:
            shape = (256, 256, 256) if self.is_cpu else (8192, 8192, 8192)
        probe = self.measure(shape, 5, 2)
        per_iteration = statistics.fmean(probe.times_s) if probe else 0.01
        batch = max(5, min(2000, round(batch_s / max(per_iteration, 1e-6))))

        def run_batch() -> float:
            t = self.measure(shape, batch, 1)
            return t.mean_tflops if t else 0.0

        return warm_until_stable(run_batch, min_s=min_s, max_s=max_s, tolerance=tolerance)

    def close(self) -> None:
        self.flush = None
        if not self.is_cpu:
            self.torch.cuda.synchronize(self.device)
            self.torch.cuda.empty_cache()
