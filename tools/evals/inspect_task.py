"""inspect-ai task: does a real model, given SKILL.md and mleng's MCP tools, call the right tool first?

    pip install 'mleng[evals]'            # inspect-ai (optional extra)
    inspect eval tools/evals/inspect_task.py --model anthropic/claude-sonnet-4-5
    inspect eval tools/evals/inspect_task.py --model openai/gpt-4.1 -T split=heldout -T skill=false
    inspect eval "$(python -c 'import mleng.evals.inspect_task as t; print(t.__file__)')" ...   # from the wheel
    inspect view                          # browse the transcripts

The task starts the real server (`python -m tools serve`, stdio), offers every tool it lists to the
model, and asks for one turn per case (about 1 s of overhead per case on 2 CPU cores). The first tool call is scored and never executed: a benchmark
must not run on the machine that runs the eval. A reply without a tool call counts as "(none)".

Task options (-T): cases=FILE (default evals/cases.jsonl), split=tune|heldout|all (default heldout),
skill=true|false (SKILL.md body as the system prompt, as an agent that loaded the skill would have it).
Metrics, as `mleng eval` names them: top1 (first call == expected), top1_acceptable (in expected +
acceptable), abstain_accuracy and false_call_rate (over the cases that expect no tool).
"""

import importlib
import sys
from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ChatMessageSystem
from inspect_ai.scorer import Metric, SampleScore, Score, Target, metric, scorer
from inspect_ai.solver import Generate, TaskState, generate, solver, use_tools
from inspect_ai.tool import mcp_server_stdio, mcp_tools

# inspect loads this file by path, outside its package: import the package it belongs to ("tools" in a
# checkout, "mleng" when installed) by the name of the folder it sits in.
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
if str(_PACKAGE_DIR.parent) not in sys.path:
    sys.path.insert(0, str(_PACKAGE_DIR.parent))
_data = importlib.import_module(f"{_PACKAGE_DIR.name}.engine.data")
_metrics = importlib.import_module(f"{_PACKAGE_DIR.name}.evals.metrics")
NONE, load_cases = _metrics.NONE, _metrics.load_cases
SKILL_FILE = _data.SKILL_FILE
PREAMBLE = ("You are a coding agent helping an ML infrastructure engineer on their GPU cluster. You have the "
            "mleng tools. If one of them is the right first step for the user's message, call it; if the "
            "request is outside what these tools do, answer without calling a tool.")


def skill_body() -> str:
    """SKILL.md without its frontmatter (what an agent reads after the skill triggers)."""
    text = SKILL_FILE.read_text(encoding="utf-8") if SKILL_FILE.is_file() else ""
    if text.startswith("---"):
        text = text.split("---", 2)[2]
    return text.strip()


def samples(cases_file: str | Path, split: str) -> list[Sample]:
    return [Sample(id=c["id"], input=c["symptom"], target=c["expected"][0],
                   metadata={"expected": c["expected"], "acceptable": c["acceptable"], "category": c["category"],
                             "difficulty": c["difficulty"], "split": c["split"]})
            for c in load_cases(cases_file, split)]


def first_tool_call(state: TaskState) -> str:
    """Name of the first tool the model called in this sample, or "(none)"."""
    for message in state.messages:
        if message.role == "assistant":
            return message.tool_calls[0].function if message.tool_calls else NONE
    return NONE


def _rate(key: str, only_none: bool | None = None, invert: bool = False):
    """A metric: the mean of score value[key] over the samples (only (none) cases, only tool cases, or all)."""

    def compute(scores: list[SampleScore]) -> float:
        picked = [s.score.value[key] for s in scores
                  if only_none is None or (s.score.metadata or {}).get("expected_none") == only_none]
        mean = sum(picked) / len(picked) if picked else 0.0
        return 1.0 - mean if invert and picked else mean

    return compute


@metric
def top1() -> Metric:
    return _rate("top1")


@metric
def top1_acceptable() -> Metric:
    return _rate("top1_acceptable")


@metric
def abstain_accuracy() -> Metric:
    """Over cases that expect no tool: the share answered without one."""
    return _rate("called_tool", only_none=True, invert=True)


@metric
def false_call_rate() -> Metric:
    """Over cases that expect no tool: the share where a tool was called anyway."""
    return _rate("called_tool", only_none=True)


@scorer(metrics=[top1(), top1_acceptable(), abstain_accuracy(), false_call_rate()])
def first_call_scorer():
    """The same headline figures as `mleng eval`, for the model's first tool call."""

    async def score(state: TaskState, target: Target) -> Score:
        called = first_tool_call(state)
        expected = set(state.metadata.get("expected") or [target.text])
        ok = expected | set(state.metadata.get("acceptable", []))
        return Score(value={"top1": float(called in expected), "top1_acceptable": float(called in ok),
                            "called_tool": float(called != NONE)},
                     answer=called, metadata={"expected_none": target.text == NONE},
                     explanation=f"expected {sorted(expected)}, acceptable {sorted(ok - expected)}, called {called}")

    return score


@solver
def system_prompt(text: str):
    """Put `text` first as the system message, verbatim (inspect's system_message() would treat the
    braces in SKILL.md's examples as template fields)."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        state.messages.insert(0, ChatMessageSystem(content=text))
        return state

    return solve


def server_command() -> tuple[str, list[str]]:
    return sys.executable, ["-m", _data.PACKAGE, "serve"]


@task
def tool_selection(cases: str = str(_data.EVAL_CASES_DIR / "cases.jsonl"), split: str = "heldout",
                   skill: bool = True) -> Task:
    command, args = server_command()
    server = mcp_server_stdio(name="mleng", command=command, args=args, cwd=str(_data.IMPORT_ROOT))
    prompt = PREAMBLE + ("\n\n" + skill_body() if skill and skill_body() else "")
    return Task(
        dataset=MemoryDataset(samples(cases, split), name=f"mleng-tool-selection-{split}"),
        solver=[system_prompt(prompt), use_tools(mcp_tools(server)), generate(tool_calls="none")],
        scorer=first_call_scorer(),
    )
