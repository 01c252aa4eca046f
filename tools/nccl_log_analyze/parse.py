"""NCCL_DEBUG=INFO output, from files or pasted text, into per-process records (Proc) and what the whole
log says (Parsed): communicators, transports, graphs, TUNING, warnings. Lines may carry launcher labels and
come from many processes interleaved."""

import re
from collections import Counter
from dataclasses import dataclass, field

from ..shared.logscan import MAX_MATCH_CHARS, iter_text_blocks, iter_text_chunks_of_string, read_each, resolve_paths
from .messages import HANDLERS, HINTS, MSG
from .roce import note_completion_error
from ..engine.redact import redact
from ..engine.spec import Progress

# `host:pid:tid [cudaDev] (file.cc:123 )?NCCL INFO|WARN message`, anywhere in the line (labels before it).
# The host starts only where a host name can start (after a blank, ':' or a bracket): retried at every
# character of one long word, the match was quadratic (60 KB line: 31 s).
_HEAD = re.compile(r"(?<![^\s:\[\]])(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:(?P<src>[\w./-]+:\d+) )?"
                   r"NCCL (?P<level>INFO|WARN|TRACE|ABORT) ?(?P<msg>.*)$")
_BARE = re.compile(r"(?:\[(?P<dev>\d+)\] )?NCCL (?P<level>INFO|WARN) ?(?P<msg>.*)$")
_VERSION = re.compile(r"NCCL version (?P<v>\d+\.\d+\.\d+)(?:[-+]\w*?cuda(?P<cuda>[\d.]+))?")


@dataclass
class Proc:
    host: str
    pid: str
    devs: set = field(default_factory=set)
    version: str | None = None
    env: dict = field(default_factory=dict)
    networks: set = field(default_factory=set)
    plugin: str | None = None                        # a loaded plugin's name, or "internal" (NCCL fell back)
    plugin_version: str | None = None                # aws-ofi-nccl's version, else the plugin API ("v8")
    plugin_path: str | None = None                   # "Plugin Path : ..." (nccl-rdma-sharp-plugins)
    cuda_driver: int | None = None                   # cudaDriverVersion 12040 = CUDA 12.4
    gids: dict = field(default_factory=dict)         # GID index NCCL set up a RoCE QP with -> link-local | ipv4 | global
    ib_nics: dict = field(default_factory=dict)       # index -> (name, port, link layer)
    socket_ifaces: list = field(default_factory=list)
    bootstrap: str | None = None
    gdr_enabled: int = 0
    gdr_disabled: list = field(default_factory=list)
    net_devs_used: Counter = field(default_factory=Counter)
    ib_edges: int = 0
    ib_gdr_edges: int = 0
    nvls: bool | None = None
    ib_none: bool = False


@dataclass
class Parsed:
    procs: dict = field(default_factory=dict)
    comms: dict = field(default_factory=dict)          # commId/comm -> {"nranks", "ranks": {rank: info}}
    loose_versions: set = field(default_factory=set)
    transports: Counter = field(default_factory=Counter)
    shm_pairs: set = field(default_factory=set)
    p2p_off_pairs: set = field(default_factory=set)
    channels: list = field(default_factory=list)
    rings: list = field(default_factory=list)
    trees: list = field(default_factory=list)
    graphs: list = field(default_factory=list)
    nic_speeds: dict = field(default_factory=dict)     # (host, idx) -> GB/s
    nnodes: int | None = None
    tuning_pairs: list = field(default_factory=list)
    tuning: dict = field(default_factory=dict)
    algo_choices: Counter = field(default_factory=Counter)
    warnings: Counter = field(default_factory=Counter)
    completion_errors: list = field(default_factory=list)   # CompletionError, first 200
    lines: int = 0
    nccl_lines: int = 0


def _proc(parsed: Parsed, host: str, pid: str) -> Proc:
    key = (host, pid)
    if key not in parsed.procs:
        parsed.procs[key] = Proc(host, pid)
    return parsed.procs[key]


def parse_line(parsed: Parsed, line: str) -> None:
    """Fold one log line into `parsed` (lines without 'NCCL' are skipped by the caller)."""
    m = _HEAD.search(line)
    if m:
        proc = _proc(parsed, m["host"], m["pid"])
        proc.devs.add(int(m["dev"]))
        level, msg = m["level"], m["msg"].strip()
    else:
        v = _VERSION.search(line)
        if v:  # the bare "NCCL version 2.x.y+cudaX" line rank 0 prints
            parsed.loose_versions.add(v["v"])
            parsed.nccl_lines += 1
            return
        m = _BARE.search(line)
        if not m:
            return
        proc = _proc(parsed, "?", "?")
        level, msg = m["level"], m["msg"].strip()
    parsed.nccl_lines += 1
    if level == "WARN":
        note_completion_error(parsed, proc.host, msg)
        parsed.warnings[redact(re.sub(r"\b\d+\b|0x[0-9a-f]+", "N", msg)[:200])] += 1
        return
    _parse_info(parsed, proc, msg)


def _parse_info(parsed: Parsed, proc: Proc, msg: str) -> None:
    v = _VERSION.search(msg)
    if v:
        proc.version = v["v"]
        return
    for name, rx in MSG.items():
        if HINTS[name] not in msg:
            continue
        m = rx.search(msg)
        if m:
            HANDLERS[name](parsed, proc, m)
            return


def parse_paths(paths: list[str], max_files: int, progress: Progress | None = None) -> tuple[Parsed, list, list]:
    """Parse files / directories / globs. Returns (parsed, files read, files skipped with the reason)."""
    files, skipped = resolve_paths(paths, max_files)
    parsed = Parsed()

    def parse_file(path):
        for block in iter_text_blocks(path):
            _parse_block(parsed, block)

    refuse = "Give the text output of a run with NCCL_DEBUG=INFO" if len(files) == 1 else None
    read = read_each(files, skipped, parse_file, progress, refuse)
    return parsed, read, skipped


def parse_text(text: str) -> Parsed:
    parsed = Parsed()
    for block in iter_text_chunks_of_string(text):
        _parse_block(parsed, block)
    return parsed


def _parse_block(parsed: Parsed, block: str) -> None:
    lines = block.splitlines()
    parsed.lines += len(lines)
    for line in lines:
        if "NCCL" in line:
            parse_line(parsed, line[:MAX_MATCH_CHARS])
