"""Grade an agent's diagnosis against a scenario's truth. The grader never looks at mleng's output.

The diagnosis is a small JSON object:

    {"culprit_kind": "node", "culprit": ["mln3"], "drain": ["mln3"], "action": "drain mln3", "evidence": "..."}

culprit_kind: node | link | rank | gpu | setting | none | inconclusive. Scoring, in this order:
1. A drain of any node the truth does not allow (`drain_ok`) scores 0 and counts as a false drain,
   whatever else is right: that is the mistake a user pays for. A drain is a name in `drain`, or a
   node a clause of `action` (or of any text field the schema does not know) drains: the names after a
   drain word (`drain mln1 mln2`), or before the clause's first one (`nodename=mln[1-4] state=drain`),
   but not after a negated one ("don't drain mln1, drain mln2" drains mln2): an operator runs the action,
   not the list (review 2026-12-02, R11).
   `evidence` is not read for drains: it quotes what the tools saw.
2. Truth "none" (a control): "none" scores 1, "inconclusive" 0.5, any culprit 0.
3. "inconclusive" on a real fault scores 0 (no harm done, nothing found).
4. The right kind and exactly the right culprits: 1. The right kind, every culprit named plus others
   (not drained): 0.5. The right kind, some but not all of several culprits: 0.5. Otherwise 0.
   Two faults of different kinds (the truth's `also`, the diagnosis' `also`: [{"culprit_kind", "culprit"}]):
   the same rule over (kind, name) pairs.
Names compare case-insensitively; a link is the same in either direction ("mln2-mln1" = "mln1-mln2");
a rank may be written "3" or "rank 3"; a setting by its variable name, or, where the truth's `same_as` gives a
setting by a node's name (a shaper on that node's link), by the node it is set on and a shaper word (tc, tbf,
qdisc, ...). A GPU is named by its node, and its PCI bus id or serial where the truth gives one ("node4 GPU
0000:00:08", "node4:00:08.0"): the node alone names it when the truth names only the node, and a node answer
(kind "node") naming the GPU's host is that GPU too.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ...shared.slurm import expand_hostlist
from .cluster import NODE_NAME
from .scenarios import Scenario

MAX_DIAGNOSIS_BYTES = 1 << 20
# Clauses of an action, and in one clause: a drain, a negation, the names (a SLURM hostlist allowed).
# Linear patterns over text cut to MAX_ACTION_CHARS.
MAX_ACTION_CHARS = 2000
CLAUSE_END = re.compile(r"[;\n]|\.\s|&&|\|\||\bthen\b|\bbut\b", re.IGNORECASE)
PIECE = re.compile(r"(?P<negated>\b(?:no|not|never|without|avoid|don't|dont)\b(?:\s+\w+){0,2}?\s+drain\w*)"
                   r"|(?P<drain>\bdrain(?:s|ed|ing)?\b|\bstate\s*=\s*(?:drain|down|fail)\b)"
                   r"|(?P<host>[A-Za-z][A-Za-z0-9_.-]{0,62}(?:\[[0-9,-]{1,64}\])?)", re.IGNORECASE)


class AlsoNamed(BaseModel):
    model_config = ConfigDict(extra="forbid")
    culprit_kind: Literal["node", "link", "rank", "gpu", "setting"]
    culprit: list[str] = Field(default=[], max_length=64)


class Diagnosis(BaseModel):
    model_config = ConfigDict(extra="allow")     # read for drains (drains_named), otherwise ignored
    culprit_kind: Literal["node", "link", "rank", "gpu", "setting", "none", "inconclusive"]
    culprit: list[str] = Field(default=[], max_length=64)
    also: list[AlsoNamed] = Field(default=[], max_length=4)   # culprits of other kinds (two faults at once)
    drain: list[str] = Field(default=[], max_length=64)
    action: str = Field(default="", max_length=2000)
    evidence: str = Field(default="", max_length=20000)


def diagnosis_format() -> str:
    """The diagnosis JSON, from the model that reads it: the kinds are Diagnosis's own."""
    kinds = "|".join(get_args(Diagnosis.model_fields["culprit_kind"].annotation))
    return (f'{{"culprit_kind": "{kinds}", "culprit": ["..."], "drain": ["node to take out of service"], '
            '"action": "...", "evidence": "...", "also": []}')


FORMAT_NOTES = ('a link is one name, its two ends joined: "mln1-mln2"; a rank its number: "3"; a fault of a second kind '
                'goes in also: [{"culprit_kind": "node", "culprit": ["mln4"]}]')


@dataclass
class Grade:
    scenario: str
    score: float
    culprit_right: bool
    false_drain: list[str] = field(default_factory=list)
    reason: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


def parse_diagnosis(text: str) -> Diagnosis:
    """A Diagnosis from JSON text; ValueError saying what is wrong and what is accepted."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"the diagnosis is not JSON ({e.msg} at line {e.lineno}); expected an object like "
                         '{"culprit_kind": "node", "culprit": ["mln3"], "drain": []}') from None
    except RecursionError:
        raise ValueError("the diagnosis nests too deeply to be a diagnosis; expected a flat object like "
                         '{"culprit_kind": "node", "culprit": ["mln3"], "drain": []}') from None
    if not isinstance(data, dict):
        raise ValueError("the diagnosis must be a JSON object with culprit_kind, culprit, drain")
    try:
        return Diagnosis(**data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "diagnosis"
        raise ValueError(f"diagnosis field {where}: {first['msg']} (culprit_kind is one of node, link, rank, gpu, "
                         "setting, none, inconclusive; culprit and drain are lists of names)") from None


def normal_name(kind: str, name: str) -> str:
    name = name.strip().lower()
    if kind == "link":
        ends = [p.strip() for p in re.split(r"\s*(?:<->|->|-|,|/|\s)\s*", name) if p.strip()]
        return "-".join(sorted(ends))
    if kind == "rank":
        return name.removeprefix("rank").strip().lstrip("#")
    if kind == "setting":
        return name.split("=", 1)[0].strip().upper()
    return name


def drains_named(diagnosis: Diagnosis, known: set[str]) -> set[str]:
    """Every node the diagnosis drains: its `drain` list, and the known names (the cluster's, the truth's,
    the culprits) that a clause of `action` or of an unknown text field drains (see the module doc)."""
    drained = {n.strip().lower() for n in diagnosis.drain}
    texts = [diagnosis.action]
    for value in (diagnosis.model_extra or {}).values():    # {"commands": "..."} or {"commands": ["...", ...]}
        texts += value if isinstance(value, list) else [value]
    for text in texts:
        if isinstance(text, str):
            for clause in CLAUSE_END.split(text[:MAX_ACTION_CHARS]):
                drained |= _clause_drains(clause, known)
    return drained


def _clause_drains(clause: str, known: set[str]) -> set[str]:
    drains: bool | None = None          # None until the clause's first drain word
    before, drained = [], set()
    for piece in PIECE.finditer(clause):
        if piece["negated"]:
            drains, before = False, []
        elif piece["drain"]:
            drained |= set(before) if drains is None else set()
            drains, before = True, []
        elif drains is None:
            before.append(piece["host"])
        elif drains:
            drained.add(piece["host"])
    names = set()
    for token in drained:
        try:
            names |= {n.lower() for n in (expand_hostlist(token, limit=64) if "[" in token else [token])}
        except ValueError:
            continue
    return {n for n in names if NODE_NAME.fullmatch(n) or n in known}

_BUS = re.compile(r"(?:[0-9a-f]{4,8}:)?([0-9a-f]{2}:[0-9a-f]{2})(?:\.[0-7])?\b")


def gpu_name(name: str) -> tuple[str, str]:
    """'node4 GPU 0000:00:08 (serial 1652)' / 'node4:00:08.0' -> ('node4', '00:08'); the bus is '' when not given."""
    low = name.strip().lower()
    host = re.split(r"[\s:,(]", low, maxsplit=1)[0]
    bus = _BUS.search(low, len(host))
    return host, bus.group(1) if bus else ""


def _same_gpus(want: list[str], got: list[str]) -> bool:
    """Every GPU the truth names is named (host equal, bus equal where the truth gives one), and nothing else."""
    wanted = [gpu_name(n) for n in want]
    named = [gpu_name(n) for n in got]
    hit = lambda w, g: w[0] == g[0] and (not w[1] or w[1] == g[1])   # noqa: E731
    return all(any(hit(w, g) for g in named) for w in wanted) and all(any(hit(w, g) for w in wanted) for g in named)


def _canonical(diagnosis: Diagnosis, aliases: dict[str, list[str]]) -> Diagnosis:
    """The diagnosis with every alias the truth lists replaced by its culprit's name (culprits, drains, action)."""
    if not aliases:
        return diagnosis
    names = {alias.lower(): canon for canon, alts in aliases.items() for alias in alts}
    swap = lambda items: [names.get(n.strip().lower(), n) for n in items]   # noqa: E731
    action = diagnosis.action
    for alias, canon in names.items():
        action = re.sub(rf"(?i)(?<![\w.-]){re.escape(alias)}(?![\w-])", canon, action)
    return diagnosis.model_copy(update={"culprit": swap(diagnosis.culprit), "drain": swap(diagnosis.drain),
                                        "action": action})


def grade(scenario: Scenario, diagnosis: Diagnosis) -> Grade:
    truth = scenario.truth
    diagnosis = _canonical(diagnosis, truth.aliases)
    allowed = {n.lower() for n in truth.drain_ok}
    known = {n.lower() for n in [*scenario.node_names, *truth.identity, *truth.drain_ok, *diagnosis.culprit]}
    wrong_drains = sorted(drains_named(diagnosis, known) - allowed)
    if wrong_drains:
        return Grade(scenario.id, 0.0, False, wrong_drains, f"drains {', '.join(wrong_drains)}, which the truth does not allow")
    if truth.kind == "none":
        if diagnosis.culprit_kind == "none":
            return Grade(scenario.id, 1.0, True, reason="nothing is wrong, and the answer says so")
        if diagnosis.culprit_kind == "inconclusive":
            return Grade(scenario.id, 0.5, False, reason="nothing is wrong; 'inconclusive' does no harm but is not the answer")
        return Grade(scenario.id, 0.0, False, reason=f"nothing is wrong, but the answer names a {diagnosis.culprit_kind}")
    if diagnosis.culprit_kind == "inconclusive":
        return Grade(scenario.id, 0.0, False, reason="a fault was injected; the answer is inconclusive")
    if truth.also:
        return _grade_several(scenario.id, truth, diagnosis)
    if truth.kind == "gpu" and diagnosis.culprit_kind in ("gpu", "node") and diagnosis.culprit:
        if _same_gpus(truth.identity, diagnosis.culprit) and (diagnosis.culprit_kind == "gpu" or
                                                              not any(gpu_name(n)[1] for n in truth.identity)):
            return Grade(scenario.id, 1.0, True, reason="the right GPU (by its node" + (
                " and bus id)" if any(gpu_name(n)[1] for n in truth.identity) else ")"))
    for same in truth.same_as:
        if diagnosis.culprit_kind == same.kind and _same_culprit(same.kind, diagnosis.culprit, same.identity):
            return Grade(scenario.id, 1.0, True, reason=f"the right culprit, named by its {same.kind}")
    if diagnosis.culprit_kind != truth.kind:
        return Grade(scenario.id, 0.0, False, reason=f"the culprit is a {truth.kind}; the answer names a {diagnosis.culprit_kind}")
    want = {normal_name(truth.kind, n) for n in truth.identity}
    got = {normal_name(truth.kind, n) for n in diagnosis.culprit}
    if got == want:
        return Grade(scenario.id, 1.0, True, reason="the right culprit")
    if want < got:
        return Grade(scenario.id, 0.5, False, reason=f"names the culprit and also {', '.join(sorted(got - want))}")
    if got and got < want:
        return Grade(scenario.id, 0.5, False, reason=f"names some culprits; misses {', '.join(sorted(want - got))}")
    return Grade(scenario.id, 0.0, False, reason=f"names {', '.join(sorted(got)) or 'nothing'}; the culprit is {', '.join(sorted(want))}")


SHAPER_WORD = re.compile(r"(?i)\b(?:tc|tbf|htb|qdisc|netem|shap\w{0,6}|rate[- ]?limit\w{0,3})\b")


def _same_culprit(kind: str, named: list[str], identity: list[str]) -> bool:
    """Whether the answer's names are the identity's. A setting whose identity is a node is a setting of that node
    (a tc shaper on its link): the answer names it by the nodes it places it on ("mln3: tc tbf qdisc on eth0")."""
    if kind == "setting" and identity and all(NODE_NAME.fullmatch(n.lower()) for n in identity):
        # ...and says what it is: a bare node name, or another setting that mentions the node, is not the shaper.
        return (all(SHAPER_WORD.search(n) for n in named)
                and {m for n in named for m in NODE_NAME.findall(n.lower())} == {n.lower() for n in identity})
    return {normal_name(kind, n) for n in named} == {normal_name(kind, n) for n in identity}


def _grade_several(scenario_id: str, truth, diagnosis: Diagnosis) -> Grade:
    """Culprits of several kinds (truth.also): every (kind, name) named and nothing else scores 1; all of them
    plus others, or some of them, 0.5; none of them 0. Compared as in rule 4, kind by kind."""
    def named(pairs) -> set[tuple[str, str]]:
        return {(kind, normal_name(kind, n)) for kind, names in pairs for n in names}

    want = named([(truth.kind, truth.identity), *((c.kind, c.identity) for c in truth.also)])
    got = named([(diagnosis.culprit_kind, diagnosis.culprit), *((a.culprit_kind, a.culprit) for a in diagnosis.also)])
    show = lambda pairs: ", ".join(f"{k} {n}" for k, n in sorted(pairs)) or "nothing"   # noqa: E731
    if got == want:
        return Grade(scenario_id, 1.0, True, reason=f"every culprit: {show(want)}")
    if want < got:
        return Grade(scenario_id, 0.5, False, reason=f"names every culprit and also {show(got - want)}")
    if got & want:
        return Grade(scenario_id, 0.5, False, reason=f"names {show(got & want)}; misses {show(want - got)}")
    return Grade(scenario_id, 0.0, False, reason=f"names {show(got)}; the culprits are {show(want)}")
