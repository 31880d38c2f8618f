"""A researcher's own RL loop against rlexp's services: here, train only on the groups whose rewards
disagree (dynamic sampling), and print held-out accuracy every few steps.

    .venv/bin/python examples/custom_loop.py steps=40 algorithm.prompts_per_step=32
"""
import os
import random
import sys

from hydra import compose, initialize_config_dir

from rlexp.algorithm import loop
from rlexp.config.paths import CONF_DIR
from rlexp.config.schema import register_configs
from rlexp.models.tokenizer import load_tokenizer
from rlexp.run.launcher import build_graph, release_weights
from rlexp.run.prepare import prepare
from rlexp.types import TrainBatch

if __name__ == "__main__":
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("train", overrides=sys.argv[1:])
    p = prepare(cfg)  # validates everything before a process is spawned
    run_name = f"custom-loop-{os.getpid()}"
    graph = build_graph(p, run_name)
    svc, c, env = graph.services, p.cfg, p.env
    tok = load_tokenizer(p.model_dir)
    data_rng, version = random.Random(p.seeds["data"]), 0
    try:
        for step in range(c.steps):
            samples = env.sample_batch(c.algorithm.prompts_per_step, data_rng)
            groups = loop.generate_groups(svc, samples, tok.encode, c, step).get()
            scored, metrics, _ = loop.score_groups(svc, samples, groups, c)
            informative = [g for g in scored if len({e.reward for e in g}) > 1]  # the custom part
            if informative:
                metrics.update(
                    svc.trainer.train_step.call(TrainBatch.of([e for g in informative for e in g]))
                )
                version += 1
                loop.push_weights(svc, version)
            if step % 10 == 9:
                held = env.eval_samples()
                outs = svc.generators.generate.route(
                    [tok.encode(s.problem.prompt) for s in held], 1, c.algorithm.max_tokens, 0.0, 0
                ).get()
                acc = sum(env.check(s, o.text).correct for s, o in zip(held, outs)) / len(held)
                print(
                    f"step {step + 1}: reward {metrics['reward/mean']:.3f}, {len(informative)} "
                    f"informative groups, held-out accuracy {acc:.3f}",
                    flush=True,
                )
    finally:
        graph.stop()
        release_weights(p.cfg.cluster, run_name)
