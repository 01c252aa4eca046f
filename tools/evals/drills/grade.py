"""Grade an agent's diagnosis against a scenario's truth. The grader never looks at mleng's output.

The diagnosis is a small JSON object:

    {"culprit_kind": "node", "culprit": ["mln3"], "drain": ["mln3"], "action": "drain mln3", "evidence": "..."}

culprit_kind: node | link | rank | gpu | setting | none | inconclusive. Scoring, in this order:
1. A drain of any node the truth does not allow (`drain_ok`) scores 0 and counts as a false drain,
   whatever else is right: that is the mistake a user pays for.
2. Truth "none" (a control): "none" scores 1, "inconclusive" 0.5, any culprit 0.
3. "inconclusive" on a real fault scores 0 (no harm done, nothing found).
4. The right kind and exactly the right culprits: 1. The right kind, every culprit named plus others
   (not drained): 0.5. The right kind, some but not all of several culprits: 0.5. Otherwise 0.
Names compare case-insensitively; a link is the same in either direction ("mln2-mln1" = "mln1-mln2");
a rank may be written "3" or "rank 3"; a setting by its variable name.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .scenarios import Scenario


class Diagnosis(BaseModel):
    model_config = ConfigDict(extra="ignore")
    culprit_kind: Literal["node", "link", "rank", "gpu", "setting", "none", "inconclusive"]
    culprit: list[str] = Field(default=[], max_length=64)
    drain: list[str] = Field(default=[], max_length=64)
    action: str = Field(default="", max_length=2000)
    evidence: str = Field(default="", max_length=20000)


def diagnosis_format() -> str:
    """The diagnosis JSON, from the model that reads it: the kinds are Diagnosis's own."""
    kinds = "|".join(get_args(Diagnosis.model_fields["culprit_kind"].annotation))
    return (f'{{"culprit_kind": "{kinds}", "culprit": ["..."], "drain": ["node to take out of service"], '
            '"action": "...", "evidence": "..."}')


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


def grade(scenario: Scenario, diagnosis: Diagnosis) -> Grade:
    truth = scenario.truth
    allowed = {n.lower() for n in truth.drain_ok}
    wrong_drains = sorted({n.strip().lower() for n in diagnosis.drain} - allowed)
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
