"""Records gpu_health's modules share (kept apart so that they import no package module)."""

from ..engine.spec import Field, Record


class XidSeen(Record):
    code: int = Field(description="Xid (or SXid) number.")
    text: str = Field("", description="The rest of the last such line, cut at 160 characters.")
    count: int = Field(1, description="Times it appears in the kernel log.")
    previous: int | None = Field(None, description="Xid 45: the Xid it names as its cause.")
