"""A job launched without SLURM (torchrun over ssh), found on this host (private to the process_targets door).

The caller names the job by torchrun's rendezvous id (--rdzv-id, which torchrun hands every worker as
TORCHELASTIC_RUN_ID) or by a piece of its launcher's command line. Either is a claim: a process is taken only
when it is the caller's (its real uid the caller's, unless root asked for every user's), and it is of this host
only when it shares this process's network namespace (a rank is reached at its host's address; namespace nodes
that share one kernel, and containers with a network of their own, are other hosts here). Another user's
process that makes the claim is named in a refusal, never read.
"""

import os
import re

from ..logscan import MAX_MATCH_CHARS
from .kernel import LOCAL_RANK_VARS, RANK_VARS, env_int, is_ours, is_python_proc, ourselves, user_words

RUN_ENV = "TORCHELASTIC_RUN_ID"
RUN_ID_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}")
LAUNCHER_TEXT = re.compile(r"[A-Za-z0-9_.:=/,+@\- ]{3,200}")
RUN_ID_RULE = "1-128 characters: letters, digits, _ . : - (not starting with a punctuation mark)"
LAUNCHER_RULE = "3-200 characters: letters, digits, spaces and _ . : = / , + @ - (a literal piece, not a regex)"


def check_run_id(text: str) -> str:
    """The run id, or ValueError saying what a run id may hold."""
    if not RUN_ID_TEXT.fullmatch(text):
        raise ValueError(f"run_id {text[:60]!r} is not a torchrun rendezvous id this tool accepts: {RUN_ID_RULE}")
    if text == "none":
        raise ValueError("run_id 'none' is torchrun's default --rdzv-id, shared by every run started without one: "
                         "give the job's own --rdzv-id, or launcher_match")
    return text


def check_launcher_match(text: str) -> str:
    """The launcher's command-line piece, or ValueError saying what it may hold."""
    if not LAUNCHER_TEXT.fullmatch(text) or not text.strip():
        raise ValueError(f"launcher_match {text[:60]!r} is not accepted: {LAUNCHER_RULE}")
    return text


def check_job_name(params, hosts_given: bool) -> None:
    """A params model's run_id / launcher_match: exactly one of them with hosts, each within its characters;
    ValueError saying what is accepted."""
    given = [n for n in ("run_id", "launcher_match") if getattr(params, n)]
    if hosts_given and len(given) != 1:
        raise ValueError("hosts needs exactly one way to name the job on them: run_id (torchrun's --rdzv-id, "
                         f"{RUN_ID_RULE}) or launcher_match (a piece of the launcher's command line, {LAUNCHER_RULE}); "
                         f"got {' and '.join(given) or 'neither'}")
    if params.run_id:
        check_run_id(params.run_id)
    if params.launcher_match:
        check_launcher_match(params.launcher_match)


def _net_namespace(pid: int | str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"/proc/{pid}/ns/net")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _claim(pid: int, env: dict, how: str) -> str:
    rank = env_int(env, RANK_VARS)
    return f"pid {pid} claims {'rank ' + str(rank) if rank is not None else 'to be a process'} of {how}"


def run_processes(run_id: str, launcher_match: str, scope: int | None) -> tuple[list[int], list[str]]:
    """(this host's processes of the run, one line per process that claims it and is not the caller's).

    run_id: Python processes whose TORCHELASTIC_RUN_ID is it. launcher_match: Python processes whose command line
    holds the piece (its first MAX_MATCH_CHARS), with their descendants that carry a rank (torchrun's workers)."""
    import psutil

    here, ours = _net_namespace("self"), ourselves()
    how = f"torchrun run {run_id}" if run_id else f"the launcher matching {launcher_match!r}"
    matched: list[tuple] = []
    for p in psutil.process_iter():
        if p.pid in ours:
            continue
        try:
            cmdline = p.cmdline()
            if not is_python_proc(p) or is_ours(cmdline):
                continue
            if run_id:
                env = p.environ()
                if env.get(RUN_ENV) != run_id:
                    continue
            elif launcher_match not in " ".join(cmdline)[:MAX_MATCH_CHARS]:
                continue
            else:
                env = _environ(p)
            where = _net_namespace(p.pid)
            if where is not None and here is not None and where != here:
                continue                        # another host sharing this kernel, or a container's own network
            matched.append((p, p.uids().real, env))
        except (psutil.Error, OSError):
            continue
    kept, refused = [], []
    for p, uid, env in matched:
        if scope is not None and uid != scope:
            refused.append(f"{_claim(p.pid, env, how)} but belongs to {user_words(uid)}, not to you, "
                           f"{user_words(scope)}: left out (root may pass allow_other_users)")
        elif run_id or env_int(env, RANK_VARS + LOCAL_RANK_VARS) is not None:
            kept.append(p.pid)
        else:
            kept += _ranked_descendants(p, scope)
    return list(dict.fromkeys(kept)), refused


def _environ(p) -> dict:
    import psutil

    try:
        return p.environ()
    except (psutil.Error, OSError):
        return {}


def _ranked_descendants(launcher, scope: int | None) -> list[int]:
    """A launcher's descendants that carry a rank in their environment and are the caller's."""
    import psutil

    try:
        kids = launcher.children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for k in kids:
        try:
            if (scope is None or k.uids().real == scope) and is_python_proc(k) and \
                    env_int(k.environ(), RANK_VARS + LOCAL_RANK_VARS) is not None:
                out.append(k.pid)
        except (psutil.Error, OSError):
            continue
    return out
