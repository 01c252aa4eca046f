"""nic_health's records: one RDMA port, one network interface, one GPU's nearest NIC, one presence row."""

from ..engine.spec import Field, Record
from ..shared.actions import ACTION_FIELD, Action, HealthFinding


class Judged(Record):
    verdict: str = Field("ok", description="ok | warn | fail for this port or interface.")
    action: Action = Field("none", description="The strongest action its problems call for. " + ACTION_FIELD)
    problems: list[HealthFinding] = Field(default_factory=list, description="What is wrong, with an action each.")
    window: dict[str, int] = Field(default_factory=dict, description="Change of each counter over the sampling window (counters that moved only).")
    resets: list[str] = Field(default_factory=list, description="Counters that went back during the window (cleared, driver reloaded, or wrapped): their change is not judged.")


class PortReading(Judged):
    device: str = Field(description="RDMA device (mlx5_0).")
    port: int = Field(description="Port number (from 1).")
    state: str | None = Field(None, description="Logical state: ACTIVE, INIT, ARMED, DOWN (sysfs `state`).")
    phys_state: str | None = Field(None, description="Physical state: LinkUp, Polling, Disabled, ... (sysfs `phys_state`).")
    rate: str | None = Field(None, description="Rate as the kernel writes it, e.g. '400 Gb/sec (4X NDR)'.")
    rate_gbits: float | None = Field(None, description="Link rate, Gb/s.")
    link_layer: str | None = Field(None, description="InfiniBand or Ethernet (RoCE).")
    gids: int | None = Field(0, description="Non-zero entries in the port's GID table (RoCE needs one to be used at all); None: not read (pasted text).")
    pci: str = Field("", description="PCI address of the device.")
    fw_ver: str | None = Field(None, description="Firmware version of the device (sysfs fw_ver).")
    counters: dict[str, int] = Field(default_factory=dict, description="Error counters at the end of the window (totals since they were last cleared).")
    saturated: list[str] = Field(default_factory=list, description="Counters stuck at their maximum (IB counters stop, they do not wrap): the true count is at least that.")

    @property
    def subject(self) -> str:
        return f"{self.device} port {self.port}"


class NetdevReading(Judged):
    name: str = Field(description="Interface name (eth0, ens1f0np0, ib0).")
    kind: str = Field(description="physical, or the virtual kind (veth, bridge, ...; 'virtual' when sysfs cannot say).")
    pci: str = Field("", description="PCI address ('' for virtual interfaces).")
    source: str = Field(description="sysfs, or netlink when this process's /sys shows another network namespace.")
    admin_up: bool | None = Field(None, description="Administratively up (IFF_UP).")
    operstate: str | None = Field(None, description="Operational state: up, down, lowerlayerdown, ...")
    carrier: bool | None = Field(None, description="Link detected.")
    carrier_changes: int | None = Field(None, description="Carrier up and down transitions since the interface was created.")
    speed_mbps: int | None = Field(None, description="Link speed, Mb/s (None where the driver does not say).")
    mtu: int | None = Field(None, description="MTU, bytes.")
    counters: dict[str, int] = Field(default_factory=dict, description="Error counters at the end of the window (kernel statistics, and `ethtool -S` error counters as ethtool:<name>).")
    driver: str | None = Field(None, description="Kernel driver (sysfs device/driver).")
    firmware: str | None = Field(None, description="Firmware version (`ethtool -i`), where ethtool exists.")
    root_qdisc: str | None = Field(None, description=(
        "The tc qdisc kind at its root (noqueue, pfifo_fast, fq_codel: queueing only; tbf, htb, netem, ...: a "
        "shaper, said in problems); None where tc is not here."))

    @property
    def subject(self) -> str:
        return self.name


class NicAffinity(Record):
    gpu: int = Field(description="GPU index (NVML).")
    gpu_pci: str = Field(description="GPU PCI address.")
    nic: str = Field(description="The closest NIC (RDMA device when there is one, else a physical interface).")
    path: str = Field(description="PCIe path GPU -> NIC: PIX, PXB, PHB, NODE or SYS (closest first).")


class Presence(Record):
    component: str = Field(description="rdma_devices | ethtool | perftest.")
    present: bool = Field(description="Found on this node.")
    detail: str = Field(description="What was found, or 'not present' and where it was looked for.")
