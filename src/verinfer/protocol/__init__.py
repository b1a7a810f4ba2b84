"""The protocol layer: rules every side of a dispute must apply identically.

Bottom of the dependency graph: nothing here imports the engine, torch, web3 or the
services. Each rule has exactly one home here (see docs/architecture.md).
"""
