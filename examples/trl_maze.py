"""The maze study through SERA inside TRL: one method and seed of a maze config, written as the suite's run folder.

    # CPU check (tests/test_trl.py runs it): the smoke scale on a pool of 6 mazes read in epochs, one process, seconds
    python -m experiments.maze.train scale=maze/smoke method=maxrl run.base_only=true    # the base model first
    python -m examples.trl_maze scale=maze/smoke task.pool_size=6 task.pool_order=epoch method=sera --cpu
    # the paper's maze on 8 GPUs (make reproduce-maze SCALE=paper launches this; not run here)
    accelerate launch --num_processes 8 -m examples.trl_maze scale=maze/paper method=sera seed=0

The leading arguments are the study's Hydra overrides (configs/maze.yaml); the flags after them are this script's.
The run starts from the study's base model (its SFT weights, trained by the suite's loop on one process), trains on
the config's fixed pool of training mazes (TRL's sampler reads the pool in its own seeded epochs), scores a completion
with the study's reward (the moves reach the goal), and writes runs/maze-<scale>/<run name>_trl/: the config with
trainer: trl, base.json, metrics, the per-question records of the held-out mazes every eval.every steps (sampled as
sera.trl.policy_engine says), DONE. The settings come from the config: n0, B, the method's allocation settings, the
optimizer (AdamW: lr, betas, weight decay, warm-up then constant, clip), response limit, temperature, steps, checkpoint
interval and evaluation; TRL's allocation settings are checked against the config's before training. A finished run is
skipped, an interrupted one resumes from TRL's checkpoint in the folder.
"""

from __future__ import annotations

import argparse

from examples.trl_math import SUITE_TRL_SETTINGS, check_same_method, compose, device_rows, suite_folder
from sera.compat import activation_checkpointing
from sera.trl import SERAGRPOConfig, SERAGRPOTrainer

LOSS_TYPES = {"token-mean": "dapo", "seqnorm": "dr_grpo"}  # the suite's aggregation -> TRL's loss type


def arguments(argv: list[str]) -> tuple[list[str], argparse.Namespace]:
    """(Hydra overrides, this script's flags): the overrides are the arguments before the first flag."""
    own = next((i for i, x in enumerate(argv) if x.startswith("--")), len(argv))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", default="auto", help="the run folder (auto: the one the study would use, plus _trl)")
    p.add_argument("--output-dir", default=None, help="TRL's checkpoints (default: <run folder>/trainer)")
    p.add_argument("--grad-accum", type=int, default=1, help="micro-batches a step on each process")
    p.add_argument("--micro-rows", type=int, default=None, help="rows of a device micro-batch: sets --grad-accum to "
                   "B x n0 / (processes x N)")  # fmt: skip
    p.add_argument("--vllm", default=None, choices=["none", "server", "colocate"], help="default: colocate where "
                   "the config says engine: vllm, else none")  # fmt: skip
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--report-to", default="none", help="none, or TRL's integrations, comma-separated (e.g. wandb)")
    return argv[:own], p.parse_args(argv[own:])


def main(argv=None) -> SERAGRPOTrainer | None:
    import sys

    from datasets import Dataset

    from experiments.maze import task as maze
    from experiments.maze.model import build_model, build_tokenizer
    from experiments.maze.train import base_run_config, make_task, validate
    from sera.lm_loop import refuse_sink_settings
    from sera.lm_study import study_root
    from sera.trl import RecordsCallback, RunFolderCallback

    overrides, a = arguments(list(sys.argv[1:] if argv is None else argv))
    cfg = compose(overrides, "maze")
    settings, loop = validate(cfg)
    refuse_sink_settings(loop, "the TRL route")
    if cfg.task.pool_size is None:
        raise ValueError("TRL trains on a dataset: the maze needs a fixed pool (task.pool_size=N, a multiple of B)")
    a.vllm = a.vllm or ("colocate" if cfg.engine == "vllm" else "none")
    suite = suite_folder(cfg, overrides, a, "maze", study_root(cfg), base_run_config, settings, weights=True)
    if suite.finished:
        print(f"{suite.path} holds this finished run: skipped")
        return None

    _, rows = device_rows(cfg.train.batch_size * cfg.n0, a, cfg)  # the maze models have no plan entry yet
    task, tokenizer = make_task(cfg), build_tokenizer()
    model = str(suite.base) if a.vllm != "none" else build_model(cfg.model.name, str(suite.base))  # vLLM loads by path
    pool = range(cfg.task.pool_size)
    prompts = [" ".join(maze.VOCAB[t] for t in maze.encode_prompt(task.train_grid(i))) for i in pool]
    dataset = Dataset.from_dict({"prompt": prompts, "prompt_id": list(pool)})

    def maze_reward(completions, prompt_id, completion_ids, **kwargs):
        return [maze.reward(task.train_grid(int(i)), ids) for i, ids in zip(prompt_id, completion_ids, strict=True)]

    optim = cfg.optim
    alloc = {}
    if settings.sampler.unequal_counts:  # the allocation's settings as the study resolves them
        alloc = dict(estimator=settings.estimator, n_min=settings.n_min, n_max=settings.n_max,
                     active_threshold=settings.threshold, pilot_m=settings.pilot_m if settings.estimator == "pilot"
                     else None)  # fmt: skip
    args = SERAGRPOConfig(
        output_dir=suite.output_dir, method=cfg.method.name, num_generations=cfg.n0, per_device_train_batch_size=rows,
        gradient_accumulation_steps=a.grad_accum, loss_type=LOSS_TYPES[settings.aggregation], learning_rate=optim.lr,
        lr_scheduler_type="constant_with_warmup", warmup_steps=optim.warmup_steps, weight_decay=optim.weight_decay,
        adam_beta1=optim.betas[0], adam_beta2=optim.betas[1], adam_epsilon=optim.eps, max_grad_norm=optim.grad_clip,
        max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
        max_steps=cfg.train.steps, beta=0.0, use_vllm=a.vllm != "none",
        vllm_mode=a.vllm if a.vllm != "none" else "colocate", bf16=cfg.model.get("dtype") == "bfloat16",
        use_cpu=a.cpu, seed=cfg.seed, report_to=[] if a.report_to == "none" else a.report_to.split(","),
        logging_steps=1, remove_unused_columns=False, save_strategy="steps", save_steps=cfg.run.checkpoint_every,
        **activation_checkpointing(not a.cpu), **alloc, **SUITE_TRL_SETTINGS,
    )  # fmt: skip
    check_same_method(args.sera_settings(), settings)
    folder = RunFolderCallback(suite.path, suite.config, suite.base)
    records = RecordsCallback(suite.path, task, every=cfg.eval.every, samples=loop.eval_samples, ks=loop.eval_ks,
                              max_new_tokens=cfg.max_new_tokens, temperature=loop.eval_temperature,
                              top_p=loop.eval_top_p, seed=cfg.seed,
                              max_rollouts_per_call=loop.eval_max_rollouts_per_call, folder=folder)  # fmt: skip
    trainer = SERAGRPOTrainer(model=model, reward_funcs=maze_reward, args=args, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[folder, records])  # fmt: skip
    trainer.train(resume_from_checkpoint=True if suite.resume else None)
    return trainer


if __name__ == "__main__":
    main()
