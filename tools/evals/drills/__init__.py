"""Fault drills: does an agent, using mleng, name the culprit of a fault injected from outside?

A scenario (evals/scenarios/*.toml) is an operator's message, the place it needs (this machine, the
namespace SLURM cluster of scripts/cluster-local.sh, or a GPU machine), the faults to inject and the
ground truth. `mleng drill start ID` sets it up and prints the message; the agent investigates with the
MCP server; `mleng drill grade ID --diagnosis FILE` scores its answer; `mleng drill stop` undoes
everything. The grader reads only the scenario's truth and the agent's diagnosis, never mleng's output.
"""
