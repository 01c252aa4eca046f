"""mleng: the engine (engine/), helpers shared by several tools (shared/), and one module or package
per tool. docs/architecture.md describes the parts; tools/README.md says how to add a tool."""
