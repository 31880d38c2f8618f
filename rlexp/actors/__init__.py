"""Monarch actors that make up an rlexp run (one module per service)."""
