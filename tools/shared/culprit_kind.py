"""What kind of thing a culprit is, and the name that finds it: the typed answer every post-mortem tool gives.

GPU hardware is named by its host, and its PCI bus id / serial when the log prints them (the GPU index is what
nvidia-smi shows on that host); host resources (memory, a NIC port) by the node; one process's software by the
rank; configuration by the setting. knowledge://debugging/logs.md says the same for the reader.
"""

from typing import Literal

from ..engine.spec import Field, Record

CulpritKind = Literal["gpu", "node", "link", "rank", "setting"]
CULPRIT_KIND_FIELD = ("What the culprit is: gpu (named by host + PCI bus id / serial), node (host memory, a NIC "
                      "port: the host), link, rank (one process's software), setting (configuration); empty when "
                      "no culprit is named.")


class Culprit(Record):
    kind: CulpritKind = Field(description="gpu | node | link | rank | setting.")
    name: str = Field(description="How to name it: 'node7 GPU 0000:3b:00 (serial 1652923018111)', 'node7', "
                      "'rank 3', 'NCCL_IB_GID_INDEX'.")
    node: str = Field("", description="Host, when known.")
    gpu_bus: str = Field("", description="PCI bus id of the GPU, as the log prints it.")
    gpu_serial: str = Field("", description="GPU board serial (or UUID), when the log prints it.")
    rank: int | None = Field(None, description="Global rank, for a rank culprit.")


def gpu_culprit(node: str | None, bus: str, serial: str = "", uuid: str = "") -> Culprit:
    ident = f" (serial {serial})" if serial else f" ({uuid})" if uuid else ""
    name = f"{node} GPU {bus}{ident}" if node else f"GPU {bus}{ident} (the log does not name its host)"
    return Culprit(kind="gpu", name=name, node=node or "", gpu_bus=bus,
                   gpu_serial=serial or uuid)


def node_culprit(node: str) -> Culprit:
    return Culprit(kind="node", name=node, node=node)


def rank_culprit(rank: int, node: str | None = None) -> Culprit:
    return Culprit(kind="rank", name=f"rank {rank}" + (f" on {node}" if node else ""), node=node or "", rank=rank)
