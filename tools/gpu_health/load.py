"""A small GPU load kept running while links are sampled: idle GPUs lower their PCIe generation to save
power, and a link judged idle would be reported as downtrained when it is only asleep."""

import threading

STARTUP_S = 60.0     # torch import and one CUDA context per GPU


class SmallLoad:
    """Back-to-back 2048^3 bf16 matmuls on each listed GPU until stopped (about 17 GFLOP each: busy enough
    for the GPU to leave its idle power state, small enough to share the GPU with a running job)."""

    def __init__(self, devices: list[int]):
        self.devices, self.stop, self.threads, self.note = devices, threading.Event(), [], ""
        self.failed: list[str] = []
        self.ready, self._lock, self._up = threading.Event(), threading.Lock(), 0

    def __enter__(self):
        try:
            import torch
        except ImportError:
            self.note = "torch not installed: links sampled without a load (PCIe generation not judged)"
            return self
        if not torch.cuda.is_available():
            self.note = "CUDA not usable from torch: links sampled without a load (PCIe generation not judged)"
            return self
        # Every GPU torch sees (its numbering may differ from NVML's); which GPUs were busy is read back from
        # NVML's utilisation at the end of the window.
        self.devices = list(range(torch.cuda.device_count()))
        for d in self.devices:
            t = threading.Thread(target=self._spin, args=(torch, d), daemon=True)
            t.start()
            self.threads.append(t)
        # Readings start once every GPU runs its load (creating the CUDA contexts takes seconds): a reading
        # taken before would see an idle link and then a busy one, which looks like flapping.
        if not self.ready.wait(timeout=STARTUP_S):
            self.failed.append(f"the load did not start within {STARTUP_S:g} s")
        return self

    def _started(self) -> None:
        with self._lock:
            self._up += 1
            if self._up + len(self.failed) >= len(self.devices):
                self.ready.set()

    def _spin(self, torch, device: int) -> None:
        try:
            with torch.cuda.device(device):
                a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
                a @ a
                torch.cuda.synchronize()
                self._started()
                while not self.stop.is_set():
                    for _ in range(20):
                        a @ a
                    torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001  (a full GPU, exclusive compute mode, MIG: no load there)
            self.failed.append(f"GPU {device}: {type(e).__name__}: {str(e)[:120]}")
            with self._lock:
                if self._up + len(self.failed) >= len(self.devices):
                    self.ready.set()

    @property
    def running(self) -> bool:
        """Whether every GPU got its load (a GPU without one is not judged on PCIe generation)."""
        return bool(self.threads) and not self.failed

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)
        return False
