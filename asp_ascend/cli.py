"""The `asp` command: argument parsing and dispatch only.

Each subcommand imports its implementation lazily, after the arguments are parsed,
so ``asp --help``, ``asp schedule`` and ``asp simulate`` never import torch/ray/vllm.
"""
from __future__ import annotations

import argparse
import sys

from .errors import AspError

COMMANDS = {
    "schedule": "the offline ASP pass: dataset + length history -> schedule.parquet",
    "simulate": "discrete-event what-if: system policies x instance counts",
    "train": "async multi-instance RL on Ray (schedules first if needed)",
    "report": "plots and tables from a finished run or simulation",
    "doctor": "platform, versions, which backends are usable and why not",
    "config": "list every config key with its default and help",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="asp", description="asp_ascend: Adaptive Scheduling Pipeline for RL post-training")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in ("schedule", "simulate", "train"):
        sp = sub.add_parser(name, help=COMMANDS[name], description=COMMANDS[name])
        sp.add_argument("config", help="YAML config file (e.g. configs/cpu_tiny_grpo.yaml)")
        sp.add_argument("overrides", nargs="*", default=[], metavar="key=value",
                        help="optional dotted overrides, e.g. rollout.num_instances=4")
        if name == "simulate":
            sp.add_argument("--calibrate", metavar="RUN_DIR",
                            help="fit the cost model from RUN_DIR/timeline.jsonl, then simulate that setup")
    rp = sub.add_parser("report", help=COMMANDS["report"], description=COMMANDS["report"])
    rp.add_argument("run_dir", help="a run or simulation directory")
    rp.add_argument("--sim", metavar="SIM_DIR",
                    help="a training run only: put the simulation in SIM_DIR beside it (same system-policy key)")
    dp = sub.add_parser("doctor", help=COMMANDS["doctor"], description=COMMANDS["doctor"])
    dp.add_argument("--mindspeed-src", metavar="PATH",
                    help="statically check a MindSpeed-RL source tree for everything the adapter relies on")
    dp.add_argument("--verl", action="store_true",
                    help="check the installed verl for every class, method, signature and config key the verl adapter uses")
    dp.add_argument("--vllm-ascend-src", metavar="PATH",
                    help="with --mindspeed-src: also check a vllm-ascend checkout (the instances' entry points)")
    dp.add_argument("--vllm-src", metavar="PATH",
                    help="with --mindspeed-src: check this vLLM tree instead of the installed vllm")
    dp.add_argument("--verbose", action="store_true", help="list every check, not only mismatches and notes")
    dp.add_argument("--json", action="store_true", help="print machine-readable JSON")
    sub.add_parser("config", help=COMMANDS["config"], description=COMMANDS["config"])
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 2
    try:
        return int(_dispatch(args) or 0)
    except AspError as exc:
        print(f"asp {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        msg = "interrupted"
        if args.command == "train" and getattr(args, "output_dir", None):
            from .pipeline.rundir import interrupted_message

            msg = interrupted_message(args.config, list(args.overrides), args.output_dir)
        print(f"asp {args.command}: {msg}", file=sys.stderr)
        return 130


def _dispatch(args) -> int | None:
    if args.command == "config":
        from .config import describe

        for key, default, help_ in describe():
            print(f"{key:38s} {default!r:24s} {help_}")
        return 0
    if args.command == "doctor":
        return _doctor(args)
    if args.command == "report":
        from .report.run import run_report

        return run_report(args.run_dir, args.sim)
    from .config import load_config

    overrides = list(args.overrides)
    if getattr(args, "calibrate", None):
        overrides.append(f"sim.calibrate={args.calibrate}")
    ours = [o[4:] if o.startswith("asp.") else o for o in overrides]   # a framework YAML's asp.* keys
    framework = True
    tokens = {}   # where the run's tokenizer is set, and how the framework renders chat prompts
    if _has_group(args.config, "megatron_training"):
        # A MindSpeed-RL YAML with an asp: group: the Ascend path (docs/ascend.md).
        from pathlib import Path

        if args.command == "train":
            from .integrations.mindspeed_rl.entry import run as run_mindspeed

            p = Path(args.config)
            return run_mindspeed(str(p.parent), p.stem, overrides)
        from .integrations.mindspeed_rl.config_bridge import TRANSLATION, missing_prompts_problem, translate_file

        cfg, msrl = translate_file(args.config, ours)
        problem = missing_prompts_problem(msrl, cfg)   # never plan the built-in task for MindSpeed-RL's run
        if problem:
            from .errors import ConfigError

            raise ConfigError([problem], args.config)
        tokens = {"model_key": TRANSLATION["model.path"]}   # where MindSpeed-RL's YAML sets the tokenizer
    elif _has_group(args.config, "actor_rollout_ref"):
        # A verl YAML: the prompts of its data.train_files, as the verl run reads them (docs/verl.md).
        if args.command == "train":
            from .errors import ConfigError

            raise ConfigError([f"{args.config} is a verl config: start it with python -m "
                               f"asp_ascend.integrations.verl.main_ppo --config-path DIR --config-name NAME "
                               f"(docs/verl.md); asp schedule and asp simulate read it here"])
        from .integrations.verl.offline import template_settings, translate_offline

        cfg = translate_offline(args.config, ours)
        tokens = template_settings(args.config)
    else:
        cfg, framework = load_config(args.config, overrides), False
    if framework and args.command == "schedule":
        # what the framework's run plans at its start (adaptive: epoch 0), then reads from output_dir
        from .integrations.verl.plan import first_plan_config

        cfg = first_plan_config(cfg)
    from .io import check_output_dir

    check_output_dir(cfg.output_dir)  # a file, or not writable: said before any work
    args.output_dir = cfg.output_dir  # (for the Ctrl-C message)
    if args.command in ("schedule", "simulate"):   # data.path's prompts in the run's tokens (or the words opt-in)
        from .integrations.prompt_tokens import counter_for

        count = counter_for(cfg, **tokens)
    if args.command == "schedule":
        from .scheduler.run import run_schedule

        return run_schedule(cfg, count)
    if args.command == "simulate":
        from .sim.run import run_simulate

        return run_simulate(cfg, count)
    if args.command == "train":
        from .pipeline.run import run_train

        return run_train(cfg, overrides)
    raise AssertionError(args.command)


def _doctor(args) -> int:
    """The platform report, then the adapter contract checks asked for (their exit status wins)."""
    if (args.vllm_ascend_src or args.vllm_src) and not args.mindspeed_src:
        print("asp doctor: --vllm-ascend-src and --vllm-src go with --mindspeed-src PATH", file=sys.stderr)
        return 2
    if args.verl:
        from .integrations.verl.contract import run_check as run_verl_check
        from .platforms.doctor import collect, render

        status, text = run_verl_check(as_json=args.json, verbose=args.verbose)
        if args.json:
            import json

            print(json.dumps({**collect(), "verl_check": json.loads(text)}, indent=2))
        else:
            print(render(collect()) + "\n\n" + text)
        return status
    if not args.mindspeed_src:
        from .platforms.doctor import run_doctor

        return run_doctor(as_json=args.json)
    from .integrations.mindspeed_rl.checker import run_check
    from .platforms.doctor import collect, render

    status, text = run_check(args.mindspeed_src, args.vllm_ascend_src, args.vllm_src, as_json=args.json,
                             verbose=args.verbose)
    if args.json:
        import json

        print(json.dumps({**collect(), "mindspeed_check": json.loads(text)}, indent=2))
    else:
        print(render(collect()) + "\n\n" + text)
    return status


def _has_group(path: str, group: str) -> bool:
    """Does the YAML at ``path`` have a top-level ``group``? ``megatron_training``: a MindSpeed-RL config,
    ``actor_rollout_ref``: a verl one (ours has neither)."""
    try:
        with open(path, encoding="utf-8") as f:
            return any(line.startswith(f"{group}:") for line in f)
    except OSError:
        return False


if __name__ == "__main__":
    sys.exit(main())
