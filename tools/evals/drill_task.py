"""inspect-ai task: can a real model, with SKILL.md and mleng's MCP tools, name an injected culprit?

    pip install 'mleng[evals]'
    inspect eval tools/evals/drill_task.py --model anthropic/claude-sonnet-4-5 --max-samples 1
    inspect eval tools/evals/drill_task.py --model openai/gpt-4.1 --max-samples 1 -T place=local
    inspect eval tools/evals/drill_task.py ... -T scenarios=cl-slow-node,cl-healthy-which-node
    inspect view

Each sample is one scenario of evals/scenarios/: the setup runs `mleng drill start` (the namespace cluster
for `cluster` scenarios: root and this checkout needed), the model gets the operator's message and the
real server's tools (tool calls run for real), and must finish with a JSON diagnosis in its last reply
({"culprit_kind": ..., "culprit": [...], "drain": [...], "evidence": "..."}); the scorer grades it with the
drills' grader (which never reads mleng's output) and the cleanup runs `mleng drill stop`. One drill runs
at a time (the cluster is one per machine): samples wait for each other, so use --max-samples 1.

Task options (-T): scenarios=ID,ID (default: all that fit place), place=local|cluster|gpu|local,cluster
(default local,cluster), skill=true|false, turns=N (model turns per sample, default 30).
Metrics: culprit_accuracy (mean score), exact (share scored 1), false_drain_rate (share that drained a
node the truth does not allow), tool_calls (mean calls per sample).
"""

import asyncio
import importlib
import json
import re
import sys
from pathlib import Path

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.scorer import Metric, SampleScore, Score, Target, metric, scorer
from inspect_ai.solver import Generate, TaskState, generate, solver, use_tools
from inspect_ai.tool import mcp_server_stdio, mcp_tools

_PACKAGE_DIR = Path(__file__).resolve().parent.parent
if str(_PACKAGE_DIR.parent) not in sys.path:
    sys.path.insert(0, str(_PACKAGE_DIR.parent))
_pkg = _PACKAGE_DIR.name
_selection = importlib.import_module(f"{_pkg}.evals.inspect_task")
_scenarios = importlib.import_module(f"{_pkg}.evals.drills.scenarios")
_grade = importlib.import_module(f"{_pkg}.evals.drills.grade")
_session = importlib.import_module(f"{_pkg}.evals.drills.session")
_cluster = importlib.import_module(f"{_pkg}.evals.drills.cluster")

INSTRUCTIONS = (
    "You are a coding agent helping an ML infrastructure engineer. Use the mleng tools to find out what is "
    "wrong; run real diagnostics rather than guessing. Never drain a node you have not shown to be faulty. "
    "Finish with one JSON object as the last thing in your reply: {\"culprit_kind\": \"node|link|rank|gpu|"
    "setting|none|inconclusive\", \"culprit\": [names], \"drain\": [nodes to drain, if any], \"evidence\": "
    "\"...\", \"also\": [{\"culprit_kind\": ..., \"culprit\": [names]}] only for culprits of another kind}. "
    "Name nodes as SLURM names them, a link as \"nodeA-nodeB\", a rank by its number, a setting by its variable name.")
_one_at_a_time = asyncio.Lock()


def samples(ids: list[str], places: set[str]) -> list[Sample]:
    chosen = [s for s in _scenarios.all_scenarios() if (s.id in ids if ids else s.place in places)]
    return [Sample(id=s.id, input=s.message, metadata={"topic": s.topic, "place": s.place}) for s in chosen]


@solver
def drill_setup():
    """Start the scenario's drill (waiting for any other sample's drill to end) and tell the model where."""

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        await _one_at_a_time.acquire()
        context = await asyncio.to_thread(_session.start, str(state.sample_id), 600)
        where = {k: context[k] for k in ("nodes", "partition", "env", "job_id") if k in context}
        state.messages[-1].content = context["message"] + (
            f"\n\n(Where things are: {json.dumps(where)})" if where else "")
        return state

    return solve


async def drill_cleanup(state: TaskState) -> None:
    try:
        await asyncio.to_thread(_session.stop)
    finally:
        if _one_at_a_time.locked():
            _one_at_a_time.release()


def last_json_object(text: str) -> str:
    """The last {...} in the reply that parses as JSON ("" when there is none)."""
    for match in reversed(list(re.finditer(r"\{", text))):
        candidate = text[match.start():]
        try:
            obj, end = json.JSONDecoder().raw_decode(candidate)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            return candidate[:end]
    return ""


def _mean(key: str):
    def compute(scores: list[SampleScore]) -> float:
        values = [s.score.value[key] for s in scores]
        return sum(values) / len(values) if values else 0.0
    return compute


@metric
def culprit_accuracy() -> Metric:
    return _mean("score")


@metric
def exact() -> Metric:
    return _mean("exact")


@metric
def false_drain_rate() -> Metric:
    return _mean("false_drain")


@metric
def tool_calls() -> Metric:
    return _mean("tool_calls")


@scorer(metrics=[culprit_accuracy(), exact(), false_drain_rate(), tool_calls()])
def diagnosis_scorer():
    async def score(state: TaskState, target: Target) -> Score:
        scenario = _scenarios.load_scenario(str(state.sample_id))
        calls = sum(len(m.tool_calls or []) for m in state.messages if m.role == "assistant")
        reply = state.output.completion if state.output else ""
        try:
            diagnosis = _grade.parse_diagnosis(last_json_object(reply) or reply)
        except ValueError as e:
            return Score(value={"score": 0.0, "exact": 0.0, "false_drain": 0.0, "tool_calls": float(calls)},
                         answer=reply[-500:], explanation=f"no usable diagnosis: {e}")
        graded = _grade.grade(scenario, diagnosis)
        return Score(value={"score": graded.score, "exact": float(graded.score == 1.0),
                            "false_drain": float(bool(graded.false_drain)), "tool_calls": float(calls)},
                     answer=diagnosis.model_dump_json(), explanation=graded.reason)

    return score


@task
def fault_drills(scenarios: str = "", place: str = "local,cluster", skill: bool = True, turns: int = 30) -> Task:
    command, args = _selection.server_command()
    server = mcp_server_stdio(name="mleng", command=command, args=args, cwd=str(_selection._data.IMPORT_ROOT),
                              env={"SLURM_CONF": f"{_cluster.CLUSTER_DIR}/etc/slurm.conf"})
    prompt = INSTRUCTIONS + ("\n\n" + _selection.skill_body() if skill and _selection.skill_body() else "")
    ids = [i for i in scenarios.split(",") if i]
    return Task(
        dataset=MemoryDataset(samples(ids, set(place.split(","))), name="mleng-fault-drills"),
        setup=drill_setup(),
        solver=[_selection.system_prompt(prompt), use_tools(mcp_tools(server)), generate()],
        cleanup=drill_cleanup,
        scorer=diagnosis_scorer(),
        message_limit=2 * turns + 2,
    )
