"""The scripted baseline agent: no model, SKILL.md's routing, the real server, a diagnosis to grade.

It proves a scenario can be solved with the tools as they are. For each scenario: `drill start`, then
the agent reads only what a model would (the operator's message and the context `start` prints), picks
its first tool with the eval harness's BM25 router over the live tool list (the routing the tool
descriptions and SKILL.md are tuned for), fills the parameters a careful agent would (paths from the
message, the partition or job from the context), calls the tool through the real MCP server (in-memory
client), reads the structured answer like an agent reads it, and either concludes or takes the next tool
the playbook (below) or the answer's `next` points to; at most MAX_CALLS calls. Then `drill grade`
and `drill stop`. A scenario it cannot solve is a finding about the tools or SKILL.md.

The playbook is the agent's reading of each tool's answer: which field names the culprit. It knows no
scenario and never reads the scenario's truth.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field

from .faults import DrillError
from .grade import AlsoNamed, Diagnosis, grade
from .scenarios import all_scenarios, load_scenario
from .session import start, stop

MAX_CALLS = 5
FOLLOW_EVERY_S = 5.0    # how often a job handle is followed with job_status
HOSTNAME_IN_PATH = re.compile(r"(?:^|[/_-])((?:[a-z][a-z0-9]*-)?node\d+|mln\d)(?=[._/-]|$)")


@dataclass
class Call:
    tool: str
    params: dict
    seconds: float
    verdict: str | None = None
    error: str | None = None
    findings: list[str] = field(default_factory=list)   # the answer's first findings: why it settled or did not
    polls: int = 0                                      # job_status calls that followed a job handle to its end


@dataclass
class Attempt:
    scenario: str
    ranking: list[str]
    calls: list[Call] = field(default_factory=list)
    diagnosis: dict | None = None
    score: float = 0.0
    reason: str = ""
    false_drain: list[str] = field(default_factory=list)
    seconds: float = 0.0
    load_1min: list[float] = field(default_factory=list)   # the host's 1-minute load average at start and at end


# --------------------------------------------------------------------------------------------------
# How to call each tool from what the agent knows, and how to read its answer

RDZV_ID = re.compile(r"--rdzv[-_]id[= ]([A-Za-z0-9][A-Za-z0-9_.:-]*[A-Za-z0-9])")   # torchrun's run id in the message


def paths_in(message: str) -> list[str]:
    return [p.rstrip(".,;:)") for p in re.findall(r"(/[^\s'\"]+)", message)]


def params_for(tool: str, message: str, context: dict) -> dict | None:
    """A careful agent's parameters for `tool`, or None when the message and context give none."""
    paths = paths_in(message)
    partition = context.get("partition")
    job = context.get("job_id")
    nodes = context.get("nodes") or []
    hosts = context.get("hosts")    # no SLURM: host names reached over ssh
    if tool in ("log_triage", "nccl_log_analyze"):
        return {"paths": paths[:1]} if paths else None
    if tool == "flight_recorder_analyze":
        return {"path": paths[0]} if paths else None
    if tool == "fleet_sweep":
        if hosts:
            return {"hosts": hosts, "checks": ["env_report", "cpu_probe"]}
        if job:
            return {"job_id": str(job), "checks": ["env_report", "cpu_probe"]}
        return {"partition": partition, "checks": ["env_report", "cpu_probe"]} if partition else None
    run_id = RDZV_ID.search(message)
    if tool == "hang_stack_dump":
        if paths:
            return {"dump_paths": paths[:1]}       # saved py-spy dumps the message points at
        if not job and run_id and nodes:           # torchrun launched over ssh, no SLURM: its hosts and run id
            return {"hosts": nodes, "run_id": run_id.group(1)}
        return {"slurm_job_id": str(job), "all_nodes": True} if job else None
    if tool == "straggler_find":
        if not job and run_id and nodes:
            return {"hosts": nodes, "run_id": run_id.group(1)}
        return {"slurm_job_id": str(job)} if job else None
    if tool == "collective_bench":
        # Which node or link: the pairwise pattern (SKILL.md: "one node is slow / which pair" -> pairwise).
        if hosts:
            return {"pattern": "pairwise", "backend": "gloo", "hosts": hosts}   # the tool reaches them over ssh
        return ({"pattern": "pairwise", "backend": "gloo"} if len(nodes) >= 2 and not job and partition
                else None)                         # pairwise runs in a SLURM allocation of the nodes
    if tool in ("gpu_health", "matmul_bench"):
        return {} if context.get("place") == "gpu" else None
    return None


NEEDS_ALLOCATION = ("collective_bench",)   # pairwise/bisect run inside a SLURM allocation (hosts=: over ssh)


def read_answer(tool: str, answer: dict, context: dict) -> Diagnosis | str | None:
    """A diagnosis, the name of the next tool to call, or None (this answer settles nothing)."""
    verdict = answer.get("verdict")
    if tool == "log_triage":
        first = answer.get("first_failure")
        if not first:
            if verdict == "info" and answer.get("next"):
                return answer["next"][0]             # not a log it reads (saved stacks): the tool it names
            return Diagnosis(culprit_kind="none", evidence="no failure signature") if verdict == "ok" else None
        named = named_culprit(answer)
        if named:
            return named
        if first.get("signature") == "xid" or first.get("action") in ("drain_node", "replace"):
            host = first.get("host") or _host_in_path(first.get("location", ""))
            return Diagnosis(culprit_kind="gpu", culprit=[host] if host else [], drain=[host] if host else [],
                             evidence=first.get("text", ""))
        if first.get("role") == "cause" and first.get("rank") is not None:
            return Diagnosis(culprit_kind="rank", culprit=[str(first["rank"])], evidence=first.get("text", ""))
        suspects = answer.get("suspect_ranks") or []
        if suspects:
            return Diagnosis(culprit_kind="rank", culprit=[str(r) for r in suspects],
                             evidence="ranks the others waited for")
        return "flight_recorder_analyze"
    if tool == "nccl_log_analyze":
        problems = set(answer.get("problems") or [])
        odd = answer.get("odd_hosts") or []
        if odd and problems & {"net_plugin_mismatch", "transport_mismatch", "gid_mismatch"}:
            return Diagnosis(culprit_kind="node", culprit=odd, evidence="set up differently from the other hosts")
        if "roce_gid" in problems:
            return Diagnosis(culprit_kind="setting", culprit=["NCCL_IB_GID_INDEX"], evidence="RoCE error 12, GID index")
        stuck = [str(r["rank"]) for r in answer.get("ranks") or [] if r.get("init_complete") is False]
        if stuck:
            return Diagnosis(culprit_kind="rank", culprit=stuck, evidence="never printed Init COMPLETE")
        env = answer.get("env") or {}
        if "socket_fallback" in problems and "NCCL_IB_DISABLE" in env:
            return Diagnosis(culprit_kind="setting", culprit=["NCCL_IB_DISABLE"], evidence="sockets instead of IB")
        if verdict == "ok":
            return Diagnosis(culprit_kind="none")
        return None
    if tool == "flight_recorder_analyze":
        ranks = answer.get("culprit_ranks") or []
        if ranks:
            return Diagnosis(culprit_kind="rank", culprit=[str(r) for r in ranks], evidence="missing from the collective")
        return Diagnosis(culprit_kind="none") if verdict == "ok" else None
    if tool == "fleet_sweep":
        drain = [d["node"] for d in answer.get("drain") or []]
        drain += [m["node"] for m in answer.get("not_answering") or [] if m["node"] not in drain]
        if drain:
            return Diagnosis(culprit_kind="node", culprit=drain, drain=drain, evidence="fleet_sweep drain list")
        if verdict == "ok" or fleet_judged_clean(answer):
            return Diagnosis(culprit_kind="none", evidence="every node judged, none outside the fleet's rule")
        return Diagnosis(culprit_kind="inconclusive", evidence=" ".join(answer.get("findings", [])[:3]))
    if tool == "hang_stack_dump":
        named = named_culprit(answer)
        if named:
            return named
        ranks = answer.get("odd_ranks") or []
        if ranks:
            return Diagnosis(culprit_kind="rank", culprit=[str(r) for r in ranks], evidence="odd stacks")
        return "straggler_find" if verdict == "ok" else None
    if tool == "straggler_find":
        ranks = [s["rank"] for s in answer.get("stragglers") or [] if s.get("rank") is not None]
        if ranks:
            return Diagnosis(culprit_kind="rank", culprit=[str(r) for r in ranks],
                             evidence="; ".join(s.get("reason", "") for s in answer["stragglers"]))
        return Diagnosis(culprit_kind="none") if verdict == "ok" else None
    if tool == "collective_bench":
        isolation = answer.get("isolation") or {}
        suspects = [s for s in isolation.get("suspects") or [] if s.get("kind") in ("node", "link")]
        if suspects:
            nodes = [n for s in suspects if s["kind"] == "node" for n in s["nodes"]]
            links = ["-".join(s["nodes"]) for s in suspects if s["kind"] == "link"]
            evidence = "; ".join(s.get("evidence", "") for s in suspects)[:2000]
            if not nodes:
                return Diagnosis(culprit_kind="link", culprit=links, evidence=evidence)
            # slow nodes are drained; a slow link between two healthy nodes is named beside them, not drained
            return Diagnosis(culprit_kind="node", culprit=nodes, drain=nodes, evidence=evidence,
                             also=[AlsoNamed(culprit_kind="link", culprit=links)] if links else [])
        if isolation and verdict == "ok":
            return Diagnosis(culprit_kind="none", evidence="every pair within the rule")
        if isolation:
            return Diagnosis(culprit_kind="inconclusive", evidence=" ".join(answer.get("findings", [])[:3]))
        return None
    if tool in ("gpu_health", "matmul_bench"):
        if verdict in ("ok", "info") or "busy" in json.dumps(answer.get("findings", [])).lower():
            return Diagnosis(culprit_kind="none", evidence="healthy or busy with another process")
        return None
    return None


def named_culprit(answer: dict) -> Diagnosis | None:
    """The culprit the headline names, by its kind: a GPU as its node and bus id (that node may be drained), a
    node, a rank."""
    culprit = answer.get("culprit") or {}
    kind = answer.get("culprit_kind")
    if not culprit or kind not in ("gpu", "node", "rank"):
        return None
    evidence = (answer.get("findings") or [""])[0]
    if kind == "gpu" and culprit.get("node"):
        name = f"{culprit['node']} {culprit.get('gpu_bus', '')}".strip()
        return Diagnosis(culprit_kind="gpu", culprit=[name], drain=[culprit["node"]], evidence=evidence)
    if kind == "rank" and culprit.get("rank") is not None:
        return Diagnosis(culprit_kind="rank", culprit=[str(culprit["rank"])], evidence=evidence)
    if kind == "node" and culprit.get("node"):
        return Diagnosis(culprit_kind="node", culprit=[n.strip() for n in culprit["node"].split(",")], evidence=evidence)
    return None


def fleet_judged_clean(answer: dict) -> bool:
    """A fleet_sweep 'warn' that still clears every node: each was judged (nothing busy, no group too noisy,
    every node answered, no drift) and every outlier was measured again and came back within the rule."""
    outliers = answer.get("outliers") or []
    return (not any(answer.get(k) for k in ("busy", "not_answering", "not_judged", "drift", "inventory_drift",
                                              "below_expected", "drain"))
            and not any(m.get("inconclusive") for m in answer.get("medians") or [])
            and all(o.get("status") == "not repeated" for o in outliers) and bool(answer.get("rows")))


def nodes_judged_alone(tool: str, answer: dict, reading) -> bool:
    """A fleet_sweep answer about nodes that all answered, a drain list or a clean bill: each node was judged on
    its own, so a slow link between two of them is in neither (cl-slow-link: fleet_sweep "ok", answered "none").
    The answer points on to collective_bench (its `next`); the agent measures the pairs before it answers."""
    return (tool == "fleet_sweep" and isinstance(reading, Diagnosis) and reading.culprit_kind in ("node", "none")
            and not answer.get("not_answering") and "collective_bench" in (answer.get("next") or []))


def with_pairs(alone: Diagnosis, pairs) -> Diagnosis:
    """fleet_sweep's answer with what pairwise named beside it (its nodes and links); pairwise finding nothing
    or nothing sure leaves fleet_sweep's answer as it was."""
    if not isinstance(pairs, Diagnosis) or pairs.culprit_kind not in ("node", "link"):
        return alone
    if alone.culprit_kind == "none":
        return pairs
    nodes = list(dict.fromkeys(alone.culprit + (pairs.culprit if pairs.culprit_kind == "node" else [])))
    links = (pairs.culprit if pairs.culprit_kind == "link" else
             [n for a in pairs.also if a.culprit_kind == "link" for n in a.culprit])
    return Diagnosis(culprit_kind="node", culprit=nodes, drain=list(dict.fromkeys(alone.drain + pairs.drain)),
                     evidence=f"{alone.evidence}; pairwise: {pairs.evidence}"[:2000],
                     also=[AlsoNamed(culprit_kind="link", culprit=links)] if links else [])


def is_inconclusive(reading) -> bool:
    return isinstance(reading, Diagnosis) and reading.culprit_kind == "inconclusive"


def is_none(reading) -> bool:
    return isinstance(reading, Diagnosis) and reading.culprit_kind == "none"


def _host_in_path(location: str) -> str | None:
    match = HOSTNAME_IN_PATH.search(location.rsplit(":", 1)[0].lower())
    return match.group(1) if match else None


PLAYBOOK = ("log_triage", "nccl_log_analyze", "flight_recorder_analyze", "fleet_sweep", "collective_bench",
            "hang_stack_dump", "straggler_find", "gpu_health", "matmul_bench")


# --------------------------------------------------------------------------------------------------
# Driving the real server

def solve(message: str, context: dict) -> Attempt:
    """Route, call, read: the agent's whole investigation of one scenario (the drill is already set up)."""
    import logging

    import contextlib

    import anyio
    from mcp import Client, StdioServerParameters

    from ...engine.data import IMPORT_ROOT, PACKAGE
    from ...engine.mcp_server import build_server
    from ..routers import ToolText, make_router, rankings

    attempt = Attempt(scenario=context.get("scenario", ""), ranking=[])
    logging.getLogger("mcp").setLevel(logging.CRITICAL)   # a tool error is read from its answer, not logged

    def allocation_server() -> Client:
        """The same server started inside a SLURM allocation of the context's nodes, as a user would start
        it (`salloc ... mleng serve`) for the tools that run inside one."""
        nodes = context.get("nodes") or []
        argv = [f"-N{len(nodes)}", f"--nodelist={','.join(nodes)}", "--no-kill", "--immediate=120", "--time=30",
                sys.executable, "-m", PACKAGE, "serve"]
        return Client(StdioServerParameters(command="salloc", args=argv, cwd=str(IMPORT_ROOT), env=dict(os.environ)))

    async def investigate() -> Diagnosis:
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(Client(build_server()))
            in_allocation = None
            tools = (await client.list_tools()).tools
            router = make_router("bm25", [ToolText(t.name, t.description or "", t.title or "") for t in tools])
            ranking = rankings(router.scores([message]), router.tools)[0]
            attempt.ranking = ranking[:5]
            queue = [t for t in ranking if t in PLAYBOOK]
            tried: set[str] = set()
            undecided: list[tuple[str, Diagnosis]] = []   # (tool, "inconclusive"): said if nothing settles it

            last: dict = {}                                # the latest answer, as the agent read it

            async def call(tool: str, params: dict):
                nonlocal in_allocation
                last.clear()
                caller = client
                if tool in NEEDS_ALLOCATION and not context.get("hosts"):
                    in_allocation = in_allocation or await stack.enter_async_context(allocation_server())
                    caller = in_allocation
                t0 = time.monotonic()
                result = await caller.call_tool(tool, params)
                record = Call(tool, params, 0.0)
                attempt.calls.append(record)
                answer = result.structured_content or {}
                # A run longer than the call's wait comes back as a job handle: follow it to its end, as the
                # answer and SKILL.md say (job_status), on the same server that runs it.
                while not result.is_error and (answer.get("job") or {}).get("job_id"):
                    await anyio.sleep(FOLLOW_EVERY_S)
                    record.polls += 1
                    result = await caller.call_tool("job_status", {"job_id": answer["job"]["job_id"]})
                    status = result.structured_content or {}
                    if status.get("jobs") and status["jobs"][0].get("state") == "running":
                        continue
                    answer = status.get("result") or status
                    if status.get("error"):
                        record.error = str(status["error"])[:300]
                        return None
                record.seconds = round(time.monotonic() - t0, 1)
                if result.is_error:
                    record.error = " ".join(getattr(c, "text", "") for c in result.content)[:300]
                    return None
                last.update(answer)
                record.verdict = answer.get("verdict")
                record.findings = [str(f)[:400] for f in (answer.get("findings") or [])[:4]]
                return read_answer(tool, answer, context)

            while queue and len(attempt.calls) < MAX_CALLS:
                tool = queue.pop(0)
                if tool in tried:
                    continue
                tried.add(tool)
                params = params_for(tool, message, context)
                if params is None:
                    continue
                reading = await call(tool, params)
                if is_inconclusive(reading) and len(attempt.calls) < MAX_CALLS:
                    # The operator's move on "too noisy to judge, run again": once, the same call. Its answer
                    # replaces the first one.
                    undecided.append((tool, reading))
                    reading = await call(tool, params)
                    if not is_inconclusive(reading):
                        undecided = [(t, d) for t, d in undecided if t != tool]
                if is_inconclusive(reading) or (undecided and is_none(reading)):
                    # Another route may still name a culprit; but "nothing wrong" from one check does not
                    # answer a question another check found too noisy to judge: that stays inconclusive.
                    undecided.append((tool, reading))
                    continue
                pairs_params = params_for("collective_bench", message, context)
                if (nodes_judged_alone(tool, last, reading) and pairs_params and "collective_bench" not in tried
                        and len(attempt.calls) < MAX_CALLS):
                    tried.add("collective_bench")
                    reading = with_pairs(reading, await call("collective_bench", pairs_params))
                if isinstance(reading, Diagnosis):
                    return reading
                if isinstance(reading, str):
                    queue.insert(0, reading)
            if undecided:
                return Diagnosis(culprit_kind="inconclusive",
                                 evidence=" | ".join(d.evidence for _, d in undecided if d.evidence)[:2000])
            return Diagnosis(culprit_kind="inconclusive", evidence="no tool answer named a culprit")

    t0 = time.monotonic()
    attempt.load_1min.append(os.getloadavg()[0])
    saved = {k: os.environ.get(k) for k in context.get("env", {})}
    os.environ.update(context.get("env", {}))      # the server starts with the env `drill start` printed
    try:
        diagnosis = anyio.run(investigate)
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)
    attempt.seconds = round(time.monotonic() - t0, 1)
    attempt.load_1min.append(os.getloadavg()[0])
    attempt.diagnosis = diagnosis.model_dump()
    return attempt


def run_scenario(scenario_id: str, wait_s: float = 600) -> Attempt:
    """One drill: start (waiting up to wait_s for the namespace cluster), solve, stop, grade."""
    scenario = load_scenario(scenario_id)
    context = start(scenario.id, wait_s=wait_s)
    try:
        attempt = solve(context["message"], context)
    finally:
        problems = stop()
    attempt.scenario = scenario.id
    graded = grade(scenario, Diagnosis(**attempt.diagnosis))
    attempt.score, attempt.reason, attempt.false_drain = graded.score, graded.reason, graded.false_drain
    if problems:
        attempt.reason += f" (stop left: {'; '.join(problems)})"
    return attempt


def main(ids: list[str], ci_only: bool = False, as_json: bool = False, wait_s: float = 600) -> int:
    scenarios = [load_scenario(i) for i in ids] if ids else [s for s in all_scenarios() if s.ci or not ci_only]
    attempts = []
    for scenario in scenarios:
        try:
            attempt = run_scenario(scenario.id, wait_s)
        except DrillError as e:           # the place could not be set up: say so, go on with the others
            attempt = Attempt(scenario=scenario.id, ranking=[], reason=f"not run: {e}")
        attempts.append(attempt)
        if not as_json:
            tools = " -> ".join(c.tool for c in attempt.calls) or "(no call)"
            load = "-".join(f"{x:.1f}" for x in attempt.load_1min)
            print(f"{scenario.id:<28} score {attempt.score:<4g} {attempt.seconds:6.1f} s  load {load}  {tools}: "
                  f"{attempt.reason}", flush=True)
    solved = sum(a.score == 1.0 for a in attempts)
    false_drains = sum(bool(a.false_drain) for a in attempts)
    if as_json:
        print(json.dumps({"solved": solved, "n": len(attempts), "false_drains": false_drains,
                          "attempts": [asdict(a) for a in attempts]}, indent=1))
    else:
        print(f"\nsolved {solved}/{len(attempts)}, false drains {false_drains}, "
              f"calls {sum(len(a.calls) for a in attempts)}, {sum(a.seconds for a in attempts):.0f} s")
    return 0 if solved == len(attempts) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
