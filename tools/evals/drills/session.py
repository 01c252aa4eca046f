"""A drill's life: start (set up, inject, say where things are) and stop (undo every recorded step)."""

from __future__ import annotations

import shutil
from pathlib import Path

from .cluster import CLUSTER_DIR, DrillError, cluster_script, hold_released
from .faults import DrillState, apply, bring_up_cluster, drill_dir, state_file, undo
from .scenarios import Scenario, load_scenario


def context_for(scenario: Scenario, state: DrillState) -> dict:
    """What the agent is told besides the message: where things are, never what is wrong."""
    context = {"scenario": scenario.id, "place": scenario.place,
               "message": scenario.message.replace("{dir}", state.work_dir),
               "server": ["mleng", "serve"]}
    if scenario.place == "cluster":
        context["env"] = {"SLURM_CONF": f"{CLUSTER_DIR}/etc/slurm.conf"}
        context["nodes"] = scenario.node_names
        context["partition"] = "debug"
    context.update(state.context)
    return context


def start(scenario_id: str, wait_s: float) -> dict:
    existing = DrillState.load()
    if existing is not None:
        raise DrillError(f"drill {existing.scenario!r} is still set up; `mleng drill stop` first")
    scenario = load_scenario(scenario_id)
    if scenario.place == "gpu" and not shutil.which("nvidia-smi"):
        raise DrillError(f"scenario {scenario.id!r} needs an NVIDIA GPU machine; this one has no nvidia-smi")
    state = DrillState(scenario=scenario.id, work_dir=str(drill_dir() / "work"))
    state.save()                                  # from here on, `stop` can clean up whatever happens
    Path(state.work_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        if scenario.place == "cluster":
            bring_up_cluster(state, scenario, wait_s)
        for fault in scenario.fault:
            apply(fault, state, scenario)
    except BaseException as e:
        problems = stop()
        why = e if isinstance(e, DrillError) else f"{type(e).__name__}: {e}"
        raise DrillError(f"could not start drill {scenario.id!r}: {why}; cleaned up"
                         + (f" except: {'; '.join(problems)}" if problems else "")) from None
    return context_for(scenario, state)


def stop() -> list[str]:
    """Undo the running drill, if any. Returns what could not be undone."""
    state = DrillState.load()
    if state is None:
        return []
    problems: list[str] = []
    for step in reversed(state.steps):
        problems += undo(step, state)
    if state.started_cluster:
        proc = cluster_script("stop", check=False)
        if proc.returncode:
            problems.append(f"cluster-local.sh stop -> {proc.returncode}: {proc.stderr.strip()[-300:]}")
        shutil.rmtree(CLUSTER_DIR, ignore_errors=True)
        Path(CLUSTER_DIR + ".op.lock").unlink(missing_ok=True)
    hold_released(state.holder_pid)
    if state.work_dir:
        shutil.rmtree(state.work_dir, ignore_errors=True)
    if not problems:
        state_file().unlink(missing_ok=True)
    return problems
