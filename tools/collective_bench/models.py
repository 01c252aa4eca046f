"""collective_bench's result rows: one per op and size (like nccl-tests -J JSON), one summary per op."""

from ..engine.spec import Field, Record


class BenchRow(Record):
    op: str = Field(description="Collective.")
    bytes: int = Field(description="Size in bytes (nccl-tests 'size': the larger buffer).")
    count: int = Field(description="Elements in that buffer.")
    dtype: str = Field(description="Element type.")
    time_us: float = Field(description="Microseconds per call, slowest rank.")
    algbw_gbps: float = Field(description="bytes / time, GB/s decimal.")
    busbw_gbps: float = Field(description="algbw x op factor, GB/s decimal.")
    wrong: int = Field(description="Wrong elements in the checked call, summed over ranks.")


class OpSummary(Record):
    op: str = Field(description="Collective.")
    avg_busbw_gbps: float = Field(description="Mean busbw over all sizes (nccl-tests 'Avg bus bandwidth').")
    peak_busbw_gbps: float = Field(description="busbw at the largest size measured.")
    peak_bytes: int = Field(description="That size, bytes.")
    expected_busbw_gbps: float | None = Field(None, description="Expected large-message busbw for this hardware.")
    ratio: float | None = Field(None, description="peak / expected.")
