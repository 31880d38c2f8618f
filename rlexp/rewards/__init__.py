"""Rewards: rule, annotated (gold oracle), single_rm and weaver. Build one with
`rlexp.rewards.registry.build_reward(cfg.reward, env)`; the interface is in rlexp/rewards/base.py."""
