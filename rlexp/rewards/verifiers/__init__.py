"""Verifiers: label-free scorers of (problem, response) that `single_rm` and `weaver` combine."""
from rlexp.rewards.verifiers.base import Verifier, build_verifier, register_rule, rule_names

__all__ = ["Verifier", "build_verifier", "register_rule", "rule_names"]
