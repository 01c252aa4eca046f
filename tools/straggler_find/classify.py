"""Where a rank is, from one sampled Python stack: waiting on peers, loading data, copying, computing.

A stack is a list of (function, file) frames, innermost first, as py-spy reads them. The classes:
- `collective`: inside torch.distributed (a collective, a barrier, a wait on a work handle) or in
  torch.cuda.synchronize (NCCL kernels return at once; the wait shows up at the next synchronize);
- `data`: inside torch.utils.data, or in a user function whose name says it loads data
  (load_batch, next_batch, __getitem__, collate_fn...);
- `h2d`: pinning or moving a batch to the device (pin_memory, to_device...);
- `compute`: everything else with Python frames (the forward/backward/optimizer, on CPU or GPU);
- `idle`: no Python frame at all (the main thread sits in C code outside any Python call).
The first matching class from the innermost frame outwards wins: a `load_batch` that calls
`all_reduce` is waiting on peers, a `train_step` that calls `next(loader)` is loading data.
"""

import re

from ..shared.pyspy import LAUNCHER_FILES

CLASSES = ("collective", "data", "h2d", "compute", "idle")
WAITING = "collective"

# User functions that read data. Names only: the file a loader lives in says nothing. state_dict and
# checkpoint loads are not batches, so they stay compute.
DATA_NAME = re.compile(r"(?i)(^|_)(load|loader|loading|fetch|collate|batch|dataset|prefetch|read_batch)(_|$)"
                       r"|^__getitem__$|^__next__$|^__getitems__$")
NOT_DATA = re.compile(r"(?i)state_dict|checkpoint|load_model|from_pretrained")
H2D_NAME = re.compile(r"(?i)(^|_)(to_device|to_cuda|h2d|pin_memory|move_to_device|copy_to_device|non_blocking)(_|$)")


def frame_class(function: str, filename: str) -> str | None:
    """The class one frame decides, or None when it says nothing."""
    path = filename.replace("\\", "/")
    if "torch/distributed/" in path and not any(x in path for x in LAUNCHER_FILES):
        return "collective"
    if "torch/cuda/" in path and function == "synchronize":
        return "collective"
    if "torch/utils/data/" in path:
        return "h2d" if "pin_memory" in path else "data"
    if H2D_NAME.search(function):
        return "h2d"
    if DATA_NAME.search(function) and not NOT_DATA.search(function):
        return "data"
    return None


def stack_class(frames: list[tuple[str, str]]) -> str:
    """The class of one sampled stack (innermost frame first)."""
    if not frames:
        return "idle"
    for function, filename in frames:
        found = frame_class(function, filename)
        if found:
            return found
    return "compute"
