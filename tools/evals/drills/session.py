"""A drill's life: start (set up, inject, say where things are) and stop (undo every recorded step)."""

from __future__ import annotations

import shutil
from pathlib import Path

from ...engine.home import private_dir
from ...engine.transport import SSH_CONFIG_ENV, TRANSPORT_ENV
from .cluster import CLUSTER_DIR, INSTANCE, DrillError, cluster_script
from .faults import apply, bring_up_cluster, bring_up_sshd, undo
from .scenarios import Scenario, load_scenario
from .state import DrillState, state_file, work_dir


def context_for(scenario: Scenario, state: DrillState) -> dict:
    """What the agent is told besides the message: where things are, never what is wrong."""
    context = {"scenario": scenario.id, "place": scenario.place,
               "message": scenario.message.replace("{dir}", state.work_dir),
               "server": ["mleng", "serve"]}
    if scenario.place == "cluster" and scenario.transport == "ssh":   # host names and ssh, no SLURM
        context["env"] = {TRANSPORT_ENV: "ssh", SSH_CONFIG_ENV: f"{CLUSTER_DIR}/ssh/config"}
        context["nodes"] = context["hosts"] = scenario.node_names
    elif scenario.place == "cluster":
        context["env"] = {"SLURM_CONF": f"{CLUSTER_DIR}/etc/slurm.conf"}
        context["nodes"] = scenario.node_names
        context["partition"] = "debug"
    if state.job_id:
        context["job_id"] = state.job_id
    if any(getattr(f, "launcher", "") == "ssh" for f in scenario.fault):
        # A fleet without SLURM, as the message says: no partition, no SLURM_CONF; the hosts' own ssh_config.
        context["env"] = {SSH_CONFIG_ENV: f"{CLUSTER_DIR}/ssh/config", TRANSPORT_ENV: "ssh"}
        context.pop("partition")
    return context


def start(scenario_id: str, wait_s: float) -> dict:
    existing = DrillState.load()
    if existing is not None:
        raise DrillError(f"drill {existing.scenario!r} is still set up; `mleng drill stop` first")
    scenario = load_scenario(scenario_id)
    if scenario.place == "gpu" and not shutil.which("nvidia-smi"):
        raise DrillError(f"scenario {scenario.id!r} needs an NVIDIA GPU machine; this one has no nvidia-smi")
    state = DrillState(scenario=scenario.id, work_dir=str(work_dir()))
    state.save()                                  # from here on, `stop` can clean up whatever happens
    private_dir("drill", "work")
    try:
        if scenario.place == "cluster":
            bring_up_cluster(state, scenario, wait_s)
            bring_up_sshd(scenario)
        for fault in scenario.fault:
            apply(fault, state, scenario)
    except BaseException as e:
        problems = stop()
        why = e if isinstance(e, DrillError) else f"{type(e).__name__}: {e}"
        raise DrillError(f"could not start drill {scenario.id!r}: {why}; cleaned up"
                         + (f" except: {'; '.join(problems)}" if problems else "")) from None
    return context_for(scenario, state)


def stop() -> list[str]:
    """Undo the running drill, if any (a state that is not one `start` wrote is refused: DrillError).
    Returns what could not be undone."""
    state = DrillState.load()
    if state is None:
        return []
    if state.instance != INSTANCE:   # its faults and daemons are on that cluster: undoing them here would miss them
        raise DrillError(f"drill {state.scenario!r} was started on namespace cluster instance {state.instance} and "
                         f"this is instance {INSTANCE}; run `MLN_CLUSTER_INSTANCE={state.instance} mleng drill stop`. "
                         "Nothing was undone.")
    problems: list[str] = []
    for step in reversed(state.steps):
        problems += undo(step, state)
    if state.started_cluster:
        proc = cluster_script("stop", check=False)
        if proc.returncode:
            problems.append(f"cluster-local.sh stop -> {proc.returncode}: {proc.stderr.strip()[-300:]}")
        shutil.rmtree(CLUSTER_DIR, ignore_errors=True)
        Path(CLUSTER_DIR + ".op.lock").unlink(missing_ok=True)
    if state.holder:
        state.holder.end()
    shutil.rmtree(work_dir(), ignore_errors=True)   # validated on load: the drill's own folder, never a link
    if not problems:
        state_file().unlink(missing_ok=True)
    return problems
