"""Helpers used by several tools. They import the engine, never a tool."""
