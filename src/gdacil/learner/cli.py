"""The learner's commands: ``gdacil learn / predict / calibrate / info / forget / versions /
rollback / serve``.

:func:`learner_commands` adds them to the ``gdacil`` parser (:mod:`gdacil.cli`). They are thin
layers over :class:`~gdacil.learner.Learner` and :mod:`gdacil.learner.bundle`; errors (unknown
class, wrong modality, empty folder, corrupt or missing model) reach ``gdacil``'s handler, which
prints them on one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from pathlib import Path

from .. import distributed

__all__ = ["learner_commands"]

MODEL_HELP = "the model directory (created by the first learn)"


def learner_commands(sub) -> None:
    """Add the learner's subcommands to ``sub`` (the ``gdacil`` parser's subparsers)."""
    learn = sub.add_parser(
        "learn", help="add classes to a model (created if new) from images, texts or vectors",
        description="Learn the classes of PATH and save the result as a new version of MODEL "
                    "(created when it does not exist). PATH is a folder with one sub-folder of "
                    "images per class, a CSV/TSV or JSONL file of texts with a label column, "
                    "or, for a vectors model (--backbone vectors; the default for .parquet and "
                    ".npz files), a Parquet, .npz, CSV or JSONL file of vectors and labels. "
                    "--statistics FILE learns class statistics computed elsewhere (gdacil "
                    "export-statistics, ClassGaussians.save) instead. Classes the model holds "
                    "are updated, new ones added. The options that choose parts (--backbone, "
                    "--head, --strategy, ...) apply when the model is created. Under torchrun, "
                    "each process extracts (reads) its share of the samples and rank 0 saves "
                    "one version.")
    learn.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    source = learn.add_mutually_exclusive_group(required=True)
    source.add_argument("--data", metavar="PATH", type=nonempty, help="what to learn from")
    source.add_argument("--statistics", metavar="FILE", type=nonempty,
                        help="class statistics to learn (a safetensors file of ClassGaussians)")
    learn.add_argument("--backbone", help="backbone name (gdacil list backbones); default: "
                                          "efficientnet-lite0 for images, minilm for texts, "
                                          "vectors for .parquet/.npz files")
    learn.add_argument("--backbone-option", action="append", default=[], metavar="KEY=VALUE",
                       help="a backbone option (value as JSON, else text), e.g. size=160")
    learn.add_argument("--head", help="head name (gdacil list heads); default: lr_rgda")
    learn.add_argument("--head-param", action="append", default=[], metavar="KEY=VALUE",
                       help="a head parameter, e.g. rank=32")
    learn.add_argument("--strategy", help="Stage-1 strategy that trains the backbone "
                                          "(gdacil list strategies); default: frozen")
    learn.add_argument("--strategy-option", action="append", default=[], metavar="KEY=VALUE",
                       help="an option of --strategy (dotted keys, value as JSON), e.g. "
                            "train.steps=100 or kd_weight=0.5")
    learn.add_argument("--compensator", help="drift compensator used when the strategy trains "
                                             "the backbone; default: hopdc")
    learn.add_argument("--text-column", default="text", metavar="C",
                       help="the text column of a CSV/JSONL file (default: text)")
    learn.add_argument("--label-column", default="label", metavar="L",
                       help="the label column of a CSV/JSONL/Parquet file (default: label)")
    learn.add_argument("--vector-column", default="vector", metavar="V",
                       help="the vector column of a vectors file (default: vector)")
    learn.add_argument("--max-per-class", type=positive_int, metavar="N",
                       help="learn at most N samples per class (drawn with the model's seed)")
    learn.add_argument("--seed", type=nonnegative_int, help="seed of a new model (default: 0)")
    _precision_option(learn, "the backbone's forward passes in a new model, recorded in it: "
                             "auto (default: bf16 where the CPU or GPU computes it natively, "
                             "fp32 elsewhere)")
    learn.set_defaults(func=_learn)

    predict = sub.add_parser(
        "predict", help="classify images or texts with a model",
        description="Print the top classes of each INPUT with their scores and probabilities. "
                    "For an image model an INPUT is an image file or a folder (every image "
                    "under it); for a text model it is a text. With --reject, an INPUT unlike "
                    "every known class is marked unknown; --sets prints conformal sets of "
                    "classes. Both need a calibrated model (see docs/learner.md, \"Saying I "
                    "don't know\").")
    predict.add_argument("model", metavar="MODEL", help="the model directory")
    predict.add_argument("inputs", nargs="*", metavar="INPUT",
                         help="image files or folders, texts, or vectors as JSON lists")
    predict.add_argument("--data", metavar="PATH", type=nonempty,
                         help="a vectors model: a Parquet, .npz, CSV or JSONL file of vectors "
                              "to classify (labels not needed)")
    predict.add_argument("--vector-column", default="vector", metavar="V",
                         help="the vector column of --data (default: vector)")
    predict.add_argument("--top-k", type=positive_int, default=1, metavar="K",
                         help="classes per input (default: 1)")
    predict.add_argument("--format", choices=("json", "csv"), default="json")
    predict.add_argument("--version", help="a saved version instead of the current one")
    predict.add_argument("--reject", action="store_true",
                         help="mark inputs unlike every known class as unknown (\"unknown\": "
                              "true, with their novelty score and the threshold it fell below)")
    predict.add_argument("--reject-rate", type=rate, metavar="R",
                         help="with --reject: the target share of known inputs marked unknown, "
                              "between 0 and 1 (default: the model's reject_rate, 0.05)")
    predict.add_argument("--sets", type=rate, metavar="ALPHA",
                         help="also print each input's conformal set: the classes that hold its "
                              "true class with probability at least 1 - ALPHA (0 < ALPHA < 1)")
    _precision_option(predict, _OVERRIDE)
    predict.set_defaults(func=_predict)

    calibrate = sub.add_parser(
        "calibrate", help="calibrate a model on held-out samples (as a new version)",
        description="Score the labelled samples of PATH (a folder of class sub-folders, or a "
                    "CSV/TSV or JSONL file of texts) with MODEL and make them its calibration "
                    "records: the rejection threshold, temperature and conformal sets of "
                    "predict --reject / --sets then hold for inputs like them. The samples must "
                    "be of classes MODEL holds and not ones it learned (a held-out set). Needed "
                    "after forget, which drops the records scored by a head that held the "
                    "forgotten classes.")
    calibrate.add_argument("model", metavar="MODEL", help="the model directory")
    calibrate.add_argument("--data", required=True, metavar="PATH", type=nonempty,
                           help="the held-out samples")
    calibrate.add_argument("--text-column", default="text", metavar="C",
                           help="the text column of a CSV/JSONL file (default: text)")
    calibrate.add_argument("--label-column", default="label", metavar="L",
                           help="the label column of a CSV/JSONL/Parquet file (default: label)")
    calibrate.add_argument("--vector-column", default="vector", metavar="V",
                           help="the vector column of a vectors file (default: vector)")
    calibrate.set_defaults(func=_calibrate)

    export = sub.add_parser(
        "export-statistics", help="write a model's class statistics for another site",
        description="Write the class statistics of MODEL (counts, means and scatters in "
                    "float64, with the class names and the backbone's record) to FILE, a "
                    "safetensors file that gdacil learn OTHER --statistics FILE learns exactly "
                    "as if OTHER had learned the samples.")
    export.add_argument("model", metavar="MODEL", help="the model directory")
    export.add_argument("file", metavar="FILE", type=nonempty, help="the file to write")
    export.add_argument("--version", help="a saved version instead of the current one")
    export.set_defaults(func=_export_statistics)

    info = sub.add_parser("info", help="what a model is and which classes it holds",
                          description="Describe MODEL: its parts, classes and version.")
    info.add_argument("model", metavar="MODEL", help="the model directory")
    info.add_argument("--version", help="a saved version instead of the current one")
    info.add_argument("--format", choices=("text", "json"), default="text")
    info.set_defaults(func=_info)

    forget = sub.add_parser("forget", help="remove classes from a model (as a new version)",
                            description="Remove classes from MODEL: their statistics, their "
                                        "place in the head and their kept samples. Earlier "
                                        "versions keep them (gdacil rollback restores one).")
    forget.add_argument("model", metavar="MODEL", help="the model directory")
    forget.add_argument("--class", dest="classes", action="append", required=True,
                        metavar="NAME", help="a class to remove; repeatable")
    forget.set_defaults(func=_forget)

    versions = sub.add_parser("versions", help="list a model's saved versions",
                              description="List the saved versions of MODEL, oldest first; "
                                          "* marks the current one.")
    versions.add_argument("model", metavar="MODEL", help="the model directory")
    versions.add_argument("--format", choices=("text", "json"), default="text")
    versions.set_defaults(func=_versions)

    rollback = sub.add_parser("rollback", help="make an earlier version of a model current",
                              description="Make VERSION of MODEL current again (after "
                                          "verifying its files). Later versions are kept.")
    rollback.add_argument("model", metavar="MODEL", help="the model directory")
    rollback.add_argument("version", metavar="VERSION", help="e.g. v1 (or 1)")
    rollback.set_defaults(func=_rollback)

    serve = sub.add_parser(
        "serve", help="answer predictions (and optionally learns) over HTTP",
        description="Serve MODEL as an HTTP JSON API (needs: pip install 'gdacil[serve]'): "
                    "GET /health, GET /info, POST /predict {\"inputs\": [...], \"top_k\": 1} "
                    "(texts, or base64-encoded image files; \"reject\": true marks inputs of no "
                    "known class unknown, \"sets\": ALPHA adds conformal sets), and with "
                    "--allow-learn POST /learn "
                    "{\"inputs\": [...], \"labels\": [...]}, which saves a new version and swaps "
                    "it in while predictions keep flowing. Versions written by other commands "
                    "(gdacil learn, rollback) are picked up within --poll seconds. GET / is a "
                    "console over the same endpoints (GET /versions, POST /rollback, and with "
                    "--inbox GET /inbox, POST /inbox/ID/label, /inbox/ID/discard, "
                    "/inbox/learn); GET /metrics is in the Prometheus text format. With "
                    "--token-file (or GDACIL_TOKEN) every change needs Authorization: Bearer "
                    "TOKEN. See docs/learner.md.")
    serve.add_argument("model", metavar="MODEL", help="the model directory")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default: 127.0.0.1, this machine only)")
    serve.add_argument("--port", type=port, default=8000,
                       help="port, 0 to 65535 (default: 8000; 0: any free port)")
    serve.add_argument("--allow-learn", action="store_true",
                       help="accept POST /learn, /rollback and the inbox's labels without a "
                            "token (anyone who can reach the server can then change the model; "
                            "browser pages of other origins never can)")
    serve.add_argument("--token-file", metavar="FILE", type=nonempty,
                       help="a file holding a token (at least 16 characters): changes to the "
                            "model (learn, rollback, inbox labels) and the console's data "
                            "(/inbox, /versions) then need the header Authorization: Bearer "
                            "TOKEN (default: the environment variable GDACIL_TOKEN, if set)")
    serve.add_argument("--inbox", metavar="DIR", type=nonempty,
                       help="keep the inputs answered unknown in DIR, with their answer and "
                            "model version, for a person to label on the console at / (nothing "
                            "is kept without it; see docs/learner.md on privacy)")
    serve.add_argument("--inbox-below", type=probability, metavar="P",
                       help="with --inbox: also keep inputs whose best class has a "
                            "probability below P")
    serve.add_argument("--inbox-max-items", type=positive_int, default=1000, metavar="N",
                       help="with --inbox: most items kept; the oldest unlabelled are dropped "
                            "first (default: 1000)")
    serve.add_argument("--inbox-max-mb", type=body_mb, default=100, metavar="MB",
                       help="with --inbox: most MiB of items kept (default: 100)")
    serve.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                       help="another Host name the server answers to, besides the --host "
                            "address, localhost and 127.0.0.1 (repeatable; *.example.com: "
                            "every subdomain; *: any, when a proxy in front checks Host)")
    for flag, kind, default, metavar, text in _SERVE_LIMITS:
        shown = f"{default:g}" if isinstance(default, float) else default
        serve.add_argument(flag, type=kind, default=default, metavar=metavar,
                           help=f"{text} (default: {shown})")
    serve.add_argument("--log-level", default="info",
                       choices=("critical", "error", "warning", "info", "debug"))
    _precision_option(serve, _OVERRIDE)
    serve.set_defaults(func=_serve)


_OVERRIDE = "the backbone's forward passes in this command, whatever the model records"


def _precision_option(parser, text: str) -> None:
    from ..backbones.base import PRECISIONS

    parser.add_argument("--precision", choices=("auto", *PRECISIONS), help=text)


# ---------------------------------------------------------------------- option types
# argparse ``type=`` functions: a bad value is a usage error (status 2) before any work.
def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer; got {text!r}") from None


def nonempty(text: str) -> str:
    """A non-empty text (an empty path would mean the current folder)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path; got an empty text")
    return text


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number; got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number; got {text!r}")
    return value


def _checked(parse, accept, expected: str):
    """An argparse ``type``: ``parse(text)``, refused unless ``accept(value)``."""
    def check(text: str):
        value = parse(text)
        if not accept(value):
            raise argparse.ArgumentTypeError(f"expected {expected}; got {text!r}")
        return value

    check.__doc__ = expected[0].upper() + expected[1:] + "."
    return check


positive_int = _checked(_integer, lambda v: v >= 1, "an integer >= 1")
nonnegative_int = _checked(_integer, lambda v: v >= 0, "an integer >= 0")
port = _checked(_integer, lambda v: 0 <= v <= 65535, "a port from 0 (any free one) to 65535")
positive_seconds = _checked(_number, lambda v: v > 0, "a number of seconds > 0")
nonnegative_seconds = _checked(_number, lambda v: v >= 0, "a number of seconds >= 0")
body_mb = _checked(_number, lambda v: v * (1 << 20) >= 1, "a size in MiB of at least one byte")
rate = _checked(_number, lambda v: 0 < v < 1, "a number strictly between 0 and 1")
probability = _checked(_number, lambda v: 0 < v <= 1, "a probability above 0, at most 1")

#: ``gdacil serve``'s limits: flag, type, default, metavar and help (the default is appended)
_SERVE_LIMITS = (
    ("--max-batch", positive_int, 64, "N", "most inputs of concurrent requests answered together"),
    ("--max-inputs", positive_int, 256, "N", "most inputs in one request"),
    ("--max-body-mb", body_mb, 32, "MB", "largest request body in MiB"),
    ("--max-pixels", positive_int, 40_000_000, "N",
     "largest image in pixels, checked before decoding"),
    ("--max-queue", positive_int, 1024, "N",
     "most inputs waiting; a request beyond is answered 503"),
    ("--timeout", positive_seconds, 60.0, "S",
     "seconds a request may wait for its answer, else 503"),
    ("--batch-seconds", positive_seconds, 0.3, "S",
     "about how long one shared forward pass may take"),
    ("--max-connections", positive_int, 256, "N", "connections beyond are answered 503"),
    ("--poll", nonnegative_seconds, 1.0, "S",
     "seconds between checks for versions saved by other commands; 0: never"),
)


def _progress() -> bool:
    """Progress bars on a terminal, unless ``gdacil --quiet`` silenced INFO messages."""
    import importlib.util
    import logging

    return (sys.stderr.isatty() and importlib.util.find_spec("tqdm") is not None
            and logging.getLogger("gdacil").isEnabledFor(logging.INFO))


def _options(items: list[str], flag: str) -> dict:
    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {item!r}: expected KEY=VALUE")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
        except RecursionError:
            raise ValueError(f"{flag} {key}=...: the value is nested too deeply") from None
    return out


def _strategy(args) -> dict | None:
    """``--strategy`` with its ``--strategy-option`` overrides (dotted keys nest): what the user
    chose, without the defaults of a new model (:func:`_new_model_strategy`)."""
    options = _options(args.strategy_option, "--strategy-option")
    if options and not args.strategy:
        raise ValueError("--strategy-option needs --strategy")
    if not args.strategy:
        return None
    spec: dict = {"name": args.strategy}
    for key, value in options.items():
        *parents, leaf = key.split(".")
        node = spec
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):  # e.g. train=... then train.steps=...
                raise ValueError(f"--strategy-option {key}=...: {part} is not a section")
        node[leaf] = value
    return spec


def _new_model_strategy(spec: dict) -> dict:
    """A new model's strategy: images train with the paper's augmentation unless
    ``train.augment`` says otherwise (``"auto"``: none for texts)."""
    train = spec.get("train", {})
    if not isinstance(train, dict) or "augment" in train:
        return spec
    return {**spec, "train": {**train, "augment": "auto"}}


def _same_strategy(stored: dict, given: dict) -> bool:
    """Whether ``--strategy`` and its options, laid over a model's own strategy, leave it as it
    is (so repeating the flag a model was created with, options or not, is accepted)."""
    from ..adapt import build_strategy
    from ..cil.config import StrategySpec

    own = StrategySpec.from_dict(stored, where="strategy").build().config
    overrides = {k: v for k, v in given.items() if k != "name"}
    return given["name"] == own.name and build_strategy(own, **overrides).config == own


# ---------------------------------------------------------------------- commands
def _learn(args) -> int:
    model = Path(args.model)
    chosen = {"backbone": args.backbone,
              "backbone_options": _options(args.backbone_option, "--backbone-option") or None,
              "head": args.head, "head_params": _options(args.head_param, "--head-param") or None,
              "strategy": _strategy(args),
              "compensator": args.compensator and {"name": args.compensator},
              "seed": args.seed, "precision": args.precision}
    chosen = {k: v for k, v in chosen.items() if v is not None}
    before = _current(model)
    try:
        with distributed.process_group():  # under torchrun; else a no-op
            return _learn_into(args, model, chosen)
    except KeyboardInterrupt:
        _interrupted(model, before)
        return 130


def _current(model: Path) -> str | None:
    """The current version of ``model`` (None: no model, or none readable)."""
    from .bundle import current_version

    try:
        return current_version(model)
    except (OSError, ValueError):
        return None


def _interrupted(model: Path, before: str | None) -> None:
    """Say, on one line, what an interrupted learn, calibrate or forget left of ``model``."""
    now = _current(model)
    if now != before:
        print(f"gdacil: interrupted; {model}: {now} had been saved (version {before or 'none'} "
              "before)", file=sys.stderr)
    else:
        kept = f"{model} is as before (version {before})" if before else "no model was created"
        print(f"gdacil: interrupted; nothing was saved: {kept}", file=sys.stderr)


def _learn_into(args, model: Path, chosen: dict) -> int:
    from .bundle import CURRENT, check_new_model_dir
    from .learner import Learner

    if (model / CURRENT).exists():
        learner = Learner.load(model)
        config = learner.config.to_dict()
        for key, value in chosen.items():
            if not (_same_strategy(config[key], value) if key == "strategy"
                    else config[key] == value):
                flag = "--" + key.replace("_options", "-option").replace("_params", "-param")
                raise ValueError(f"{model} already exists with {key.replace('_', ' ')} "
                                 f"{config[key]!r}; {flag} applies only when a model is created")
    else:
        check_new_model_dir(model)  # before any work
        if "backbone" not in chosen:
            chosen["backbone"] = _default_backbone(args)
        if "strategy" in chosen:
            chosen["strategy"] = _new_model_strategy(chosen["strategy"])
        learner = Learner(**chosen)
    if args.statistics is not None:
        if args.max_per_class is not None:
            raise ValueError("--max-per-class applies to --data only (statistics hold no "
                             "samples to draw from)")
        report = learner.learn_statistics(args.statistics)
    else:
        report = learner.learn(args.data, text_column=args.text_column,
                               label_column=args.label_column, vector_column=args.vector_column,
                               max_per_class=args.max_per_class, progress=_progress())
    if not distributed.is_main_process():  # under torchrun: every rank learned, rank 0 saves
        return 0
    version = learner.save(model)
    print(f"{model}: {version}: {report}; {len(learner.classes)} classes in all")
    return 0


def _default_backbone(args) -> str:
    """The backbone of a new model: what its data needs."""
    from .learner import read_statistics
    from .vectors import VECTOR_SUFFIXES

    if args.statistics is not None:
        record = read_statistics(args.statistics)[2]
        return record["name"] if record and isinstance(record.get("name"), str) else "vectors"
    if Path(args.data).is_dir():
        return "efficientnet-lite0"
    if Path(args.data).suffix.lower() in VECTOR_SUFFIXES or args.vector_column != "vector":
        return "vectors"
    return "minilm"


def _inputs(learner, model: Path, items: list[str]) -> list[str]:
    """The inputs of ``gdacil predict``: image files (folders expanded) or texts."""
    from ..data.images import IMAGE_EXTENSIONS

    if learner.modality == "text":
        image = next((i for i in items if i.lower().endswith(IMAGE_EXTENSIONS)
                      and Path(i).is_file()), None)
        if image is not None:
            raise ValueError(f"{model} classifies texts, but {image} is an image file")
        return items
    out = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            found = sorted(str(p) for p in path.rglob("*")
                           if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file())
            if not found:
                raise ValueError(f"{path} holds no image files")
            out += found
        elif path.is_file():
            out.append(item)
        else:
            raise FileNotFoundError(f"no such image file or folder: {item!r} ({model} "
                                    "classifies images)")
    return out


def _predict_inputs(learner, args) -> tuple:
    """``(inputs, what the output calls each)`` of ``gdacil predict``: a vectors file's rows
    (called by their row number, from 1), vectors given as JSON lists, texts or images."""
    model = Path(args.model)
    if learner.modality != "vector":
        if args.data is not None:
            raise ValueError(f"--data is for vectors models; {model} classifies "
                             f"{learner.modality}s: give them as INPUTs")
        if not args.inputs:
            raise ValueError("give the INPUTs to classify")
        inputs = _inputs(learner, model, args.inputs)
        return inputs, inputs
    if (args.data is None) == (not args.inputs):
        raise ValueError(f"{model} classifies vectors: give either --data FILE or vectors as "
                         "INPUTs (JSON lists), not both")
    if args.data is not None:
        table = learner._vector_table(args.data, None, args.vector_column, "label",
                                      need_labels=False)
        return table.array(), list(range(1, table.n + 1))
    vectors = []
    for i, text in enumerate(args.inputs):
        try:
            vectors.append(json.loads(text))
        except (ValueError, RecursionError):
            raise ValueError(f"INPUT {i + 1} ({text[:40]!r}): not a JSON list of numbers (a "
                             "vectors model takes vectors such as [0.1, 2.5, -1])") from None
    return vectors, list(args.inputs)


def _predict(args) -> int:
    from .learner import Learner

    if args.reject_rate is not None and not args.reject:
        raise ValueError("--reject-rate applies with --reject only")
    learner = Learner.load(args.model, args.version, precision=args.precision)
    inputs, shown = _predict_inputs(learner, args)
    predictions = learner.predict(inputs, top_k=args.top_k, reject=args.reject,
                                  reject_rate=args.reject_rate, sets=args.sets,
                                  progress=_progress())
    if args.format == "json":
        print(json.dumps([{"input": x, **p.to_dict()} for x, p in zip(shown, predictions)],
                         indent=2))
        return 0
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(["input", "rank", "class", "score", "probability"]
                    + (["unknown", "novelty", "threshold"] if args.reject else [])
                    + (["set"] if args.sets is not None else []))
    for x, p in zip(shown, predictions):
        extra = ([str(p.unknown).lower(), repr(p.novelty), repr(p.threshold)] if args.reject
                 else [])
        if args.sets is not None:
            extra.append(json.dumps(list(p.prediction_set or ()), ensure_ascii=False))
        for rank, row in enumerate(p.to_list(), 1):  # probabilities: asked for, never None
            writer.writerow([x, rank, row["class"], repr(row["score"]),
                             repr(row.get("probability")), *extra])
    return 0


def _info(args) -> int:
    from .bundle import version_names
    from .learner import Learner

    learner = Learner.load(args.model, args.version)
    info = {"model": str(args.model), **learner.info(),
            "versions": len(version_names(args.model))}
    if args.format == "json":
        print(json.dumps(info, indent=2))
        return 0
    bb, head = info["backbone"], info["head"]
    classes = info["classes"]
    listing = ", ".join(f"{c} ({n})" for c, n in classes.items())
    lines = [
        ("model", f"{info['model']} (version {info['version']} of {info['versions']})"),
        ("backbone", f"{bb['name']} {json.dumps(bb['options'])} ({bb.get('modality', '?')}, "
                     f"{bb.get('dim', '?')}-d)"),
        ("head", f"{head['name']} {json.dumps(head['params'])}"),
        ("strategy", json.dumps(info["strategy"])),
        ("compensator", json.dumps(info["compensator"]) if info["compensator"] else "-"),
        ("statistics", info["statistics"]),
        ("precision", f"{info['precision']['model']} (runs {info['precision']['runs']} here)"),
        ("anchors", f"{info['anchors']['kept']} kept (at most {info['anchors']['size']})"),
        ("calibration", _calibration_line(info["calibration"])),
        ("learned", f"{info['samples']} samples in {info['learns']} learns"),
        ("classes", f"{len(classes)}: {listing}" if classes else "none"),
    ]
    for key, value in lines:
        print(f"{key:<12} {value}")
    return 0


def _calibration_line(calibration: dict | None) -> str:
    if calibration is None:
        return "none (predict --reject and --sets need one)"
    threshold = calibration["threshold"]
    at = (f"threshold {threshold:.4g} at reject rate {calibration['reject_rate']:g}"
          if threshold is not None else
          f"too few records for reject rate {calibration['reject_rate']:g}")
    at += f" ({calibration['novelty']})"  # the score the threshold is on
    return (f"{calibration['records']} records, temperature "
            f"{calibration['temperature']:.4g}, {at}")


def _forget(args) -> int:
    return _change(args.model, lambda learner: learner.forget(args.classes),
                   lambda learner, removed: f"forgot {', '.join(removed)}; "
                                            f"{len(learner.classes)} classes left")


def _calibrate(args) -> int:
    return _change(args.model, lambda learner: learner.calibrate(
        args.data, text_column=args.text_column, label_column=args.label_column,
        vector_column=args.vector_column, progress=_progress()),
        lambda _, records: f"calibrated on {records} samples of {args.data}")


def _export_statistics(args) -> int:
    from .learner import Learner

    learner = Learner.load(args.model, args.version)
    path = learner.export_statistics(args.file)
    print(f"{path}: the statistics of {len(learner.classes)} classes "
          f"({sum(learner.class_counts().values())} samples) of {args.model} "
          f"(version {learner.version})")
    return 0


def _change(model: str, change, said) -> int:
    """Load ``model``, ``change`` it, save it as a new version and print ``said(learner,
    result)`` after the version's name; on Ctrl-C, say what was left."""
    from .learner import Learner

    before = _current(Path(model))
    try:
        learner = Learner.load(model)
        result = change(learner)
        version = learner.save(model)
    except KeyboardInterrupt:
        _interrupted(Path(model), before)
        return 130
    print(f"{model}: {version}: {said(learner, result)}")
    return 0


def _describe(event: dict) -> str:
    if event.get("action") == "learn":
        return (f"learned {event['samples']} samples from {event['source']} "
                f"({len(event['new'])} new classes, {len(event['updated'])} updated)")
    if event.get("action") == "forget":
        if "classes" in event:  # versions saved before forgetting dropped the names
            return f"forgot {', '.join(event['classes'])}"
        count = event.get("count", 0)
        return f"forgot {count} class{'' if count == 1 else 'es'}"
    if event.get("action") == "calibrate":
        return f"calibrated on {event.get('samples', '?')} samples from {event.get('source', '?')}"
    return str(event.get("action", "?"))


def _versions(args) -> int:
    from .bundle import versions

    listed = versions(args.model)
    if args.format == "json":
        print(json.dumps([v.to_dict() for v in listed], indent=2))
        return 0
    for v in listed:
        mark = "*" if v.current else " "
        if v.problem:
            print(f"{mark} {v.name:<5} damaged: {v.problem}")
            continue
        what = "; ".join(map(_describe, v.summary.get("events", []))) or "saved"
        print(f"{mark} {v.name:<5} {v.created}  {v.summary.get('classes', '?')} classes, "
              f"{v.summary.get('samples', '?')} samples  {what}")
    return 0


def _rollback(args) -> int:
    from .bundle import rollback

    info = rollback(args.model, args.version)
    print(f"{args.model}: {info.name} is current again ({info.summary.get('classes', '?')} "
          "classes)")
    return 0


def _serve(args) -> int:
    from .access import read_token
    from .inbox import Inbox
    from .serve import serve

    if args.inbox is None and args.inbox_below is not None:
        raise ValueError("--inbox-below applies with --inbox DIR only")
    inbox = None if args.inbox is None else Inbox(
        args.inbox, max_items=args.inbox_max_items,
        max_bytes=int(args.inbox_max_mb * (1 << 20)), below=args.inbox_below)
    serve(args.model, host=args.host, port=args.port, log_level=args.log_level,
          token=read_token(args.token_file), inbox=inbox,
          allow_learn=args.allow_learn, max_batch=args.max_batch, max_inputs=args.max_inputs,
          max_body=int(args.max_body_mb * (1 << 20)), max_pixels=args.max_pixels,
          max_pending=args.max_queue, timeout=args.timeout, batch_seconds=args.batch_seconds,
          max_connections=args.max_connections, poll=args.poll,
          allowed_hosts=args.allowed_host, precision=args.precision)
    return 0
