"""A small GPU load kept running while links are sampled: idle GPUs lower their PCIe generation to save
power, and a link judged idle would be reported as downtrained when it is only asleep."""

import threading


class SmallLoad:
    """Back-to-back 2048^3 bf16 matmuls on each listed GPU until stopped (about 17 GFLOP each: busy enough
    for the GPU to leave its idle power state, small enough to share the GPU with a running job)."""

    def __init__(self, devices: list[int]):
        self.devices, self.stop, self.threads, self.note = devices, threading.Event(), [], ""

    def __enter__(self):
        try:
            import torch
        except ImportError:
            self.note = "torch not installed: links sampled without a load (PCIe generation not judged)"
            return self
        if not torch.cuda.is_available():
            self.note = "CUDA not usable from torch: links sampled without a load (PCIe generation not judged)"
            return self
        for d in self.devices:
            t = threading.Thread(target=self._spin, args=(torch, d), daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def _spin(self, torch, device: int) -> None:
        with torch.cuda.device(device):
            a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
            while not self.stop.is_set():
                for _ in range(20):
                    a @ a
                torch.cuda.synchronize()

    @property
    def running(self) -> bool:
        return bool(self.threads)

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=10)
        return False
