"""The RL algorithm: the GRPO loop (`loop`), multi-turn rollouts (`rollouts`), losses and advantages (`grpo`).
It calls actors only through `rlexp.core.services`, so the same loop runs over an actor graph or in one
process."""
