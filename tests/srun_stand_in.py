"""A stand-in `srun` for unit tests of a tool's job step on a machine without SLURM: an executable named srun,
first on PATH, that records its argv and prints what SLURM 22.05's srun -v --label prints (its own words on
stderr, each task's lines labelled). The real srun runs in the cluster tests (tests/test_transport_srun.py,
tests/test_straggler_find_cluster.py, tests/test_hang_stack_dump.py, tests/test_dist_across_nodes.py)."""

from __future__ import annotations

import shlex
from pathlib import Path


def stand_in_srun(folder: Path, monkeypatch, stdout: list[str], stderr: list[str], code: int = 0) -> Path:
    """Put `srun` on PATH in `folder`; it prints `stdout` and `stderr` (lines, as srun would) and exits with `code`.
    Returns the file its argv is written to (one argument a line)."""
    bin_dir = folder / "srun-bin"
    bin_dir.mkdir()
    argv_file = folder / "srun-argv"
    lines = ['#!/bin/sh', f'printf "%s\\n" "$@" > {shlex.quote(str(argv_file))}']
    lines += [f"printf '%s\\n' {shlex.quote(line)} >&2" for line in stderr]
    lines += [f"printf '%s\\n' {shlex.quote(line)}" for line in stdout]
    lines.append(f"exit {code}")
    srun = bin_dir / "srun"
    srun.write_text("\n".join(lines) + "\n")
    srun.chmod(0o700)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return argv_file
