"""`floe chaos`: list the built-in scenarios, run one. The `floe` command hands its
`chaos` arguments to this module's own command, in a process of its own:

    floe chaos list                 (python -m floering.chaos.chaos_cli list)
    floe chaos run SCENARIO [--seed N] [--out DIR] [--no-plots] [--insecure]
"""

from __future__ import annotations

import argparse
import os
import sys

from floering.wire.errors import FloeError


def cmd_list(args) -> int:
    from floering.chaos.scenarios import BUILTIN
    width = max(len(name) for name in BUILTIN)
    for name, s in BUILTIN.items():
        size = "ci  " if s.ci else "long"
        print(f"{name.ljust(width)}  {size}  n={s.nodes} r={s.replicas} "
              f"rounds={len(s.rounds)}  {s.description}")
    return 0


def cmd_run(args) -> int:
    from floering.chaos.harness import run_scenario, summary_table
    from floering.chaos.scenarios import load_scenario, with_overrides
    scenario = with_overrides(load_scenario(args.scenario),
                              tls=False if args.insecure else None)
    result = run_scenario(scenario, args.seed, args.out, plots=not args.no_plots)
    print(summary_table(result))
    if result.get("plots"):
        print("plots: " + ", ".join(result["plots"]))
    return 0 if result["ok"] or result.get("skipped") else 1


def add_chaos_command(sub) -> None:
    """Register `chaos` on the `floe` parser's subcommands."""
    chaos = sub.add_parser("chaos", help="kill nodes under load, measure recovery, "
                                         "check nothing is lost")
    verbs = chaos.add_subparsers(dest="chaos_command", required=True)
    verbs.add_parser("list", help="the built-in scenarios").set_defaults(func=cmd_list)
    run = verbs.add_parser("run", help="run a scenario; exit 1 if anything was lost or "
                                       "doubled", formatter_class=chaos.formatter_class)
    run.add_argument("scenario", help="a built-in name (floe chaos list) or a .json/.toml file")
    run.add_argument("--seed", type=int, default=1, help="same seed, same faults and load")
    run.add_argument("--out", help="output directory (default chaos-results/NAME-seedN-TIME)")
    run.add_argument("--no-plots", action="store_true", help="write no PNG plots")
    run.add_argument("--insecure", action="store_true",
                     help="run the cluster in the clear (default: mutual TLS on every call)")
    run.set_defaults(func=cmd_run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="floe",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_chaos_command(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["chaos", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("floe chaos: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:     # `floe chaos list | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (FloeError, OSError, RuntimeError, ValueError, KeyError) as exc:
        print(f"floe chaos: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
