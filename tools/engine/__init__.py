"""The engine: the tool contract, discovery, execution, the store, the CLI and the MCP wiring.

It imports no tool and nothing from shared/: see docs/architecture.md."""
