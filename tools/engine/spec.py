"""The tool contract: what a tool declares (ToolSpec) and the models its inputs and outputs build on.

A tool is a module `tools/<name>.py`, or a package `tools/<name>/` when it owns helpers, that defines
`SPEC = ToolSpec(...)`: its name, a description written for an agent, a `Params` model, a `Result`
model and a `run()` function. The engine owns everything else: discovery (registry.py), argument
parsing (cli.py), the child process protocol (child.py, runner.py), deadlines, cancellation, GPU
locks, the results store, MCP wiring (mcp_server.py). A tool never parses argv, spawns its own
child, formats tables or talks MCP. docs/architecture.md draws the whole picture.

Tool modules are imported by the server at start, so they must import quickly: heavy imports
(torch, matplotlib) go inside `run()`.
"""

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

__all__ = ["Field", "Params", "SELF_TEST", "SELF_EVIDENT", "present", "needs", "not_both", "Record", "Result",
           "JobRef", "ToolSpec", "Progress", "ToolFailure", "Verdict", "worst", "VERDICT_ORDER", "takes_node"]

Verdict = Literal["ok", "warn", "fail", "info"]
IN_PROCESS_MAX_S = 60.0
# A subprocess tool's deadline unless its spec sets one (the server instructions state it; schemas show others).
SUBPROCESS_TIMEOUT_S = 300.0
STR_MAX_CHARS = 4096   # longest free string argument unless a field says otherwise
RunsIn = Literal["in_process", "subprocess"]

# Verdicts from least to most severe: `worst` of several is the one furthest along.
VERDICT_ORDER: tuple[str, ...] = ("info", "ok", "warn", "fail")


def takes_node(spec: "ToolSpec") -> bool:
    """Whether the `node` call option applies: a subprocess tool that stays on the node it runs on."""
    return spec.runs == "subprocess" and not spec.spans_nodes


def worst(verdicts: Iterable[str], default: str = "ok") -> str:
    """The most severe of `verdicts` (info < ok < warn < fail); `default` when there are none."""
    return max(verdicts, key=VERDICT_ORDER.index, default=default)

# progress(fraction_done_0_to_1, message). Cheap to call; the harness rate-limits nothing, so call it
# at natural boundaries (per shape, per size, per rank), not in inner loops.
Progress = Callable[[float, str], None]


class ToolFailure(Exception):
    """A run that could not produce a result: bad environment, missing prerequisite, crashed child.

    The message is shown to the agent as is: say what happened, what was expected, what to do.
    """


class Params(BaseModel):
    """Base for every tool's parameters (its input): unknown fields are refused, values validated on
    construction. Output sub-records derive from Record, not from this class."""

    # str_max_length: every free string has a bound, stated in the schema as maxLength (a field's own
    # max_length wins): no argument can carry megabytes into a tool that never asked for them.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, str_max_length=STR_MAX_CHARS)


# A self-test switch (fault injection that proves a tool names a culprit): Field(..., json_schema_extra=SELF_TEST).
# Accepted like any field, but left out of the published schema (engine/schemas.py): agents never need it.
SELF_TEST: dict[str, Any] = {"x-self-test": True}
# A field whose name, type and bounds say all an agent needs ('layers', 'iters'): Field(..., json_schema_extra=
# SELF_EVIDENT). Its description stays for the CLI's --help and is left out of the published schema.
SELF_EVIDENT: dict[str, Any] = {"x-self-evident": True}


# Cross-field rules as JSON Schema, for a Params model's `json_schema_extra`: the schema an agent reads
# then states what the validator will refuse (draft-07 and 2020-12 alike: only anyOf / oneOf / not).

def present(field: str, **constraints) -> dict:
    """`field` is given and not null (and its value meets `constraints`, e.g. minItems=1)."""
    return {"required": [field], "properties": {field: {"not": {"type": "null"}, **constraints}}}


def needs(field: str, other: str) -> dict:
    """Giving `field` requires giving `other` as well."""
    return {"anyOf": [{"not": present(field)}, present(other)]}


def not_both(a: str, b: str) -> dict:
    return {"not": {"allOf": [present(a), present(b)]}}


class _ModelView:
    """What the model-facing answer leaves out of a record (rendering.answer_record / answer_text).

    `detail_fields` are fields a finding already says, or bulk nobody names a culprit from (a scan's seconds,
    every signature a finding lists): the answer leaves them out and says how to get them (results_history
    result_id=N returns the stored record whole). `whole_fields` are shown as they are, never cut (results_history's
    stored record). Both name fields of the class, and a detail field has a default: else it fails at import."""

    detail_fields: ClassVar[tuple[str, ...]] = ()
    whole_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs):
        super().__pydantic_init_subclass__(**kwargs)
        unknown = [n for n in (*cls.detail_fields, *cls.whole_fields) if n not in cls.model_fields]
        if unknown:
            raise TypeError(f"{cls.__name__}: detail_fields / whole_fields name no field: {unknown}")
        required = [n for n in cls.detail_fields if cls.model_fields[n].is_required()]
        if required:   # clients validate the answer against the output schema, where a required field must be
            raise TypeError(f"{cls.__name__}: detail fields need a default (answers leave them out): {required}")


class Record(_ModelView, BaseModel):
    """Base for the rows and sub-records a Result carries (per GPU, per size, per rank...)."""


class JobRef(BaseModel):
    """Set on a result whose run outlived the caller's wait budget: follow it with job_status."""

    job_id: str = Field(description="Pass to job_status / job_cancel.")
    state: str = Field(description="running | done | failed | cancelled")
    elapsed_s: float = Field(description="Seconds since the run started.")


class Result(_ModelView, BaseModel):
    """Base for every tool's result. Subclasses add their measured data; every field needs a default
    (a result that is still running, or returned as a job handle, carries only the base fields)."""

    verdict: Verdict = Field("info", description="ok | warn | fail | info (info: nothing to judge).")
    findings: list[str] = Field(
        default_factory=list, description="Plain sentences with numbers and units, most important first."
    )
    next: list[str] = Field(
        default_factory=list, description="Suggested next tools (catalog names) or knowledge:// pages."
    )
    job: JobRef | None = Field(None, description="Present when the run continues in the background.")
    result_id: int | None = Field(None, description="Row id of this result in the results store.")
    not_shown: str | None = Field(None, description=(
        "What this answer does not show of the stored result, and the call that returns it whole."))

    # Fields that hold the path of a PNG the tool drew: the MCP server attaches those images to its answer.
    image_fields: ClassVar[tuple[str, ...]] = ()
    # field -> the PNG's bytes, as the run wrote them (engine/attachments.py); never in JSON or the store.
    _images: dict[str, bytes] = PrivateAttr(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """Everything the server, the CLI and the runner need to know about one tool."""

    name: str
    summary: str
    description: str
    Params: type[Params]
    Result: type[Result]
    run: Callable[[Any, Progress], Result]
    runs: RunsIn = "in_process"
    read_only: bool = True
    destructive: bool = False
    idempotent: bool = True
    open_world: bool = False
    # Deadline of one call. Default: 30 s in-process (they must be short), 300 s in a subprocess.
    timeout_s: float | None = None
    # GPUs (local indices) the run occupies; the runner holds a per-GPU lock on each while it runs.
    gpu_devices: Callable[[Any], list[int]] | None = None
    # Name of the Result field that is the headline figure, for results_history outliers/regressions.
    metric: str | None = None
    higher_is_better: bool = True
    # Whether results are worth keeping in the store (pure look-ups are not).
    store: bool = True
    # Part of `mleng doctor`? Called with {"gpu_count": int, "gpu_names": [str]}; returns the params
    # for a quick, safe run on this machine, or None to sit this machine out. Order: doctor_order.
    doctor: Callable[[dict], dict | None] | None = None
    doctor_order: int = 50
    # The figures it contributes to a fleet sweep, read from its own Result (engine/figures.py).
    sweep: Any = None
    # The tool reaches other nodes or the cluster itself (srun, torchrun across nodes, slurmctld): the
    # `node` call option, which runs a one-node subprocess tool on a named SLURM node (engine/on_node.py),
    # is not offered.
    spans_nodes: bool = False
    # It measures or reports the job's stack: its child runs in the job's Python (engine/job_python.py),
    # and its answer says that Python's torch, CUDA and NCCL. needs_torch: refused at once, naming what to
    # set, when that Python has no torch.
    job_python: bool = False
    needs_torch: bool = False

    def __post_init__(self):
        if not self.name.isidentifier() or self.name != self.name.lower():
            raise ValueError(f"tool name {self.name!r}: use lower_snake_case")
        if not issubclass(self.Params, Params) or not issubclass(self.Result, Result):
            raise TypeError(f"{self.name}: Params/Result must subclass harness Params/Result")
        missing = [n for n, f in self.Result.model_fields.items() if f.is_required()]
        if missing:
            raise TypeError(f"{self.name}: Result fields need defaults: {missing}")
        undocumented = [n for n, f in self.Params.model_fields.items() if not f.description]
        if undocumented:
            raise TypeError(f"{self.name}: Params fields need a description: {undocumented}")
        # The call's own options (the server's CallOptions, the CLI's --timeout-s / --wait-s) share the arguments'
        # names: timeout_s is every tool's; wait_s a subprocess tool's (an in-process call is always waited for).
        taken = {"timeout_s"} | ({"wait_s"} if self.runs == "subprocess" else set())
        if taken & set(self.Params.model_fields):
            raise ValueError(f"{self.name}: Params fields {sorted(taken & set(self.Params.model_fields))} are the "
                             "call's execution options")
        if self.metric and self.metric not in self.Result.model_fields:
            raise ValueError(f"{self.name}: metric {self.metric!r} is not a Result field")
        if (self.job_python or self.needs_torch) and self.runs != "subprocess":
            raise ValueError(f"{self.name}: job_python / needs_torch need runs='subprocess'")
        if self.needs_torch:
            object.__setattr__(self, "job_python", True)
        if self.timeout_s is None:
            object.__setattr__(self, "timeout_s", 30.0 if self.runs == "in_process" else SUBPROCESS_TIMEOUT_S)
        if self.runs == "in_process" and self.timeout_s > IN_PROCESS_MAX_S:
            raise ValueError(f"{self.name}: an in-process tool cannot be killed, so it must be short "
                             f"(timeout_s <= {IN_PROCESS_MAX_S:g}); run it as a subprocess instead")
