"""Orchestration: one run from a composed config to a stopped actor graph (checks, wiring, spawn, the
controller around the loop, checkpoints and resume, the run-folder lock). Imports components, never an entry
point."""
