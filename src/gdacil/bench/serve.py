"""``gdacil bench serve``: the continual classifier's throughput, in process and over HTTP.

For each model (MiniLM on WordNet glosses, EfficientNet-Lite0 on openclipart drawings; a tiny
random ViT with ``--quick``), a :class:`gdacil.Learner` learns ``classes`` classes and is saved.

* **predict against the bare model.** :meth:`Learner.predict` on a batch of in-memory inputs
  (decoded images, texts) against the bare model on the same batch: ``Backbone.forward`` on the
  already preprocessed tensors plus the head's ``decision_function``. The fraction is bare time
  over predict time (1.0: no overhead); the second fraction counts the backbone's own
  preprocessing (resizing, tokenising) in the bare model, leaving gdacil's overhead alone. Best
  of ``repeats`` interleaved rounds.
* **serve.** ``gdacil serve``'s application (uvicorn, in this process) on a local port; clients
  are threads with keep-alive connections sending ``POST /predict``. Scenarios: one input per
  request from 1 and from 8 concurrent clients, and batches of ``batch`` inputs from 1 and 4
  clients. Each client sends ``requests`` requests after one warm-up; reported: requests and
  inputs per second over the scenario's wall time, and p50/p99 request latency.
* **a heavy client.** ``light`` clients send one-input requests in a loop for ``seconds``,
  alone and then beside one heavy client that sends maximal requests the whole time: one 10 MiB
  text or ``max_inputs`` texts at the backbone's length bound (text models), one image of
  ``megapixels`` (the server's limit) or ``max_inputs`` images (image models); then hostile
  bodies, refused with 400, that once cost without bound: ``reject_rate`` at the floor
  (``MIN_REJECT_RATE``) and at 1e-300, and a body of nested lists at the separator limit
  (``MAX_JSON_SEPARATORS``: parsed, then refused). Reported: the light clients' p50, p99 and
  slowest latency with and without the heavy client, and what the heavy client got through.
* **fp32 and bf16.** The model as it is made by default (``precision: auto``: bf16 where the
  machine computes bfloat16 natively, fp32 elsewhere) runs every part above; the same model made
  at each other precision of ``precisions`` learns the same samples and runs the predict and
  serve parts on the same inputs, side by side: predict in the same interleaved rounds, and
  each serve scenario against every precision's server in turn, ``serve_rounds`` times (the
  round with the most requests per second is kept), so that a shared machine's load falls on
  both. Reported per precision: Learner.predict's time, every serve scenario's throughput and
  p99, and the top-1 answers' agreement with fp32 and their accuracy on the held-out inputs.

Everything runs with ``--threads`` torch threads. Regenerate with
``python -m gdacil bench serve --out benchmarks --overwrite`` (writes ``serve.json`` and
``serve.md``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import io
import json
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from .common import (
    machine_info,
    markdown_table,
    output_arguments,
    refuse_to_overwrite,
    write_report,
)
from .pipeline import TINY_VIT, PipelineBenchConfig, _rounds, _samples, write_images

__all__ = ["FULL", "QUICK", "ServeBenchConfig", "ServeModel", "main", "render", "run"]


@dataclass
class ServeModel:
    backbone: str
    options: dict
    modality: str
    batch: int            # inputs per batch (predict against bare; batched requests)
    about: str = ""


@dataclass
class ServeBenchConfig:
    models: dict
    classes: int = 20
    per_class: int = 8
    requests: int = 40            # per client and scenario
    repeats: int = 3
    threads: int = 1
    seed: int = 0
    light: int = 15               # light clients beside the heavy one (16 clients in all)
    seconds: float = 20.0         # per heavy-client scenario
    megapixels: float = 40.0      # the heavy client's large image
    precisions: tuple = ("fp32", "bf16")  # besides the default ("auto"), on the same inputs
    serve_rounds: int = 2         # interleaved rounds of each serve scenario per precision


FULL = ServeBenchConfig(models={
    "minilm": ServeModel("minilm", {}, "text", 32, "all-MiniLM-L6-v2 on WordNet glosses"),
    "efficientnet-lite0": ServeModel("efficientnet-lite0", {}, "image", 16,
                                     "EfficientNet-Lite0 (224 px) on openclipart drawings"),
})
QUICK = ServeBenchConfig(
    models={"tiny-vit": ServeModel("vit", {"config": TINY_VIT}, "image", 8,
                                   "randomly initialised 2-layer ViT, 32 px")},
    classes=4, per_class=4, requests=5, repeats=1, light=3, seconds=2.0,
    megapixels=2.0, serve_rounds=1)

#: (scenario name, clients, inputs per request; 0 means the model's batch)
SCENARIOS = (("single", 1, 1), ("single x8 clients", 8, 1), ("batch", 1, 0),
             ("batch x4 clients", 4, 0))


def _raw_samples(spec: ServeModel, cfg: ServeBenchConfig, folder: Path):
    """Labelled raw inputs (decoded images or texts), round-robin over ``cfg.classes``."""
    images = PipelineBenchConfig(models={}, overhead={}, image_classes=cfg.classes,
                                 images_per_class=cfg.per_class * 2, seed=cfg.seed)
    if spec.modality == "image":
        source = write_images(folder, images)
    ids, labels, load, about = _samples(spec.modality, folder, images, 20_000)
    keep = [k for k, y in enumerate(labels) if int(y) < cfg.classes]
    ids, labels = [ids[k] for k in keep], np.asarray(labels)[keep]
    raws = load(ids)
    if spec.modality == "image":
        raws = [im.convert("RGB") for im in raws]
        about = source
    return raws, [f"class{int(y):03d}" for y in labels], about


def _payload(raws: list, modality: str) -> list[str]:
    if modality == "text":
        return list(raws)
    out = []
    for im in raws:
        buffer = io.BytesIO()
        im.save(buffer, format="JPEG", quality=90)
        out.append(base64.b64encode(buffer.getvalue()).decode())
    return out


def measure_predict(learners: dict, raws: list, batch: int, repeats: int) -> dict:
    """For each learner (by precision): Learner.predict on a batch against the bare model,
    every function of every learner timed in the same interleaved rounds."""
    inputs = raws[:batch]
    fns = {}
    for key, learner in learners.items():
        bb, head = learner.backbone, learner.head
        ready = bb.prepare(inputs, batch_size=batch).batches[0]

        def bare(bb=bb, head=head, ready=ready):
            with torch.no_grad(), bb.autocast():  # the backbone's precision, as predict runs
                return head.decision_function(bb.forward(ready))

        def preprocess_and_bare(bb=bb, head=head):
            with torch.no_grad(), bb.autocast():
                prepared = bb.prepare(inputs, batch_size=batch).batches[0]
                return head.decision_function(bb.forward(prepared))

        fns.update({(key, "bare"): bare, (key, "preprocess_and_bare"): preprocess_and_bare,
                    (key, "predict"): lambda learner=learner: learner.predict(inputs)})
    for fn in fns.values():  # warm-up
        fn()
    timed = _rounds(fns, repeats, long_pass_s=60)
    out = {}
    for key in learners:
        bare_s, with_pre_s, predict_s = (timed[key, k][0] for k in
                                         ("bare", "preprocess_and_bare", "predict"))
        out[key] = {"batch": len(inputs), "bare_s": bare_s, "preprocess_and_bare_s": with_pre_s,
                    "predict_s": predict_s, "fraction": bare_s / predict_s,
                    "fraction_with_preprocessing": with_pre_s / predict_s}
    return out


def _hostile_bodies(payload: list[str]) -> dict[str, bytes]:
    """Bodies a hostile client may choose, by name: the smallest ``reject_rate`` a request may
    ask and one far below it (refused in closed form; 1e-300 once pinned a thread for ever),
    and the most nested lists a body may hold (parsed, then refused)."""
    from ..learner.serve import MAX_JSON_SEPARATORS, MIN_REJECT_RATE

    nested = b'{"inputs": [' + b",".join([b"[[1],[2]]"] * (MAX_JSON_SEPARATORS // 5)) + b"]}"
    return {f"reject_rate {rate:g}": json.dumps(
                {"inputs": payload[:1], "reject": True, "reject_rate": rate}).encode()
            for rate in (MIN_REJECT_RATE, 1e-300)} | {"2**18 separators of nested lists": nested}


def _heavy_bodies(modality: str, payload: list[str], max_chars: int | None, max_inputs: int,
                  megapixels: float) -> dict[str, bytes]:
    """The heavy client's request bodies, by name: one maximal input, ``max_inputs`` maximal
    inputs (texts at the length bound; images), and :func:`_hostile_bodies`."""
    return _maximal_bodies(modality, payload, max_chars, max_inputs, megapixels) \
        | _hostile_bodies(payload)


def _maximal_bodies(modality: str, payload: list[str], max_chars: int | None, max_inputs: int,
                    megapixels: float) -> dict[str, bytes]:
    if modality == "text":
        bound = max_chars or 25_600
        unit = "the customer asked about a refund for the last invoice "
        return {"one 10 MiB text": json.dumps(
                    {"inputs": [unit * (10 * 2**20 // len(unit))]}).encode(),
                f"{max_inputs} texts at the length bound": json.dumps(
                    {"inputs": [(unit * (bound // len(unit) + 1))[:bound]] * max_inputs}
                ).encode()}
    from PIL import Image

    width = round((megapixels * 1e6 * 1.6) ** 0.5)
    height = int(megapixels * 1e6) // width
    ramp = np.linspace(0, 255, width, dtype=np.float32)  # smooth: the PNG stays small
    pixels = np.stack([np.broadcast_to(ramp, (height, width)),
                       np.broadcast_to(ramp[::-1], (height, width)),
                       np.full((height, width), 128, np.float32)], -1).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG", compress_level=1)
    big = base64.b64encode(buffer.getvalue()).decode()
    return {f"one {width * height / 1e6:.0f}-megapixel image": json.dumps(
                {"inputs": [big]}).encode(),
            f"{max_inputs} images": json.dumps(
                {"inputs": [payload[i % len(payload)] for i in range(max_inputs)]}).encode()}


def _loop(port: int, bodies: list[bytes], until: float | None, latencies: list, errors: list,
          warm_up: bool = True) -> None:
    """POST ``bodies``: each once (``until`` None), or in turn until the time ``until``. With
    ``warm_up``, the first request's latency is not recorded (it opens the connection)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        k = 0
        while k < len(bodies) if until is None else (k == 0 or time.perf_counter() < until):
            start = time.perf_counter()
            connection.request("POST", "/predict", body=bodies[k % len(bodies)],
                               headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                errors.append(response.status)
            if k or not warm_up:
                latencies.append(time.perf_counter() - start)
            k += 1
    finally:
        connection.close()


def measure_heavy(port: int, payload: list[str], heavy: dict[str, bytes],
                  cfg: ServeBenchConfig, log) -> list[dict]:
    """The light clients' latencies alone and beside each heavy client."""
    light = [[json.dumps({"inputs": [payload[(c * 5 + r) % len(payload)]]}).encode()
              for r in range(8)] for c in range(cfg.light)]
    rows = []
    for kind in ["none", *heavy]:
        until = time.perf_counter() + cfg.seconds
        latencies: list[float] = []
        errors: list[int] = []
        heavy_latencies: list[float] = []
        heavy_errors: list[int] = []
        workers = [threading.Thread(target=_loop, args=(port, b, until, latencies, errors))
                   for b in light]
        if kind != "none":
            workers.append(threading.Thread(target=_loop, args=(
                port, [heavy[kind]], until, heavy_latencies, heavy_errors, False)))
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        row = {"heavy": kind, "light_clients": cfg.light, "light_requests": len(latencies),
               "light_errors": len(errors),
               "light_p50_ms": 1e3 * float(np.percentile(latencies, 50)),
               "light_p99_ms": 1e3 * float(np.percentile(latencies, 99)),
               "light_max_ms": 1e3 * max(latencies),
               "heavy_requests": len(heavy_latencies),
               "heavy_errors": sorted(set(heavy_errors)),
               "heavy_p50_ms": (1e3 * float(np.percentile(heavy_latencies, 50))
                                if heavy_latencies else None)}
        log(f"  heavy client {kind}: light p50 {row['light_p50_ms']:.0f} ms, p99 "
            f"{row['light_p99_ms']:.0f} ms, max {row['light_max_ms']:.0f} ms over "
            f"{len(latencies)} requests; heavy {row['heavy_requests']} requests, errors "
            f"{row['heavy_errors']}")
        rows.append(row)
    return rows


@contextlib.contextmanager
def _served(directory: Path, batch: int):
    """``(service, port)``: ``gdacil serve``'s application on a free local port, in this
    process, until the block ends."""
    import uvicorn

    from ..learner.serve import ModelService, create_app

    service = ModelService(directory, poll=0, max_inputs=max(256, batch))
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=0,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield service, server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(60)


def measure_scenario(port: int, payload: list[str], scenario: tuple, batch: int,
                     cfg: ServeBenchConfig) -> dict:
    """One pass of ``scenario`` (name, clients, inputs per request; 0: ``batch``)."""
    name, clients, size = scenario
    size = size or batch
    bodies = [[json.dumps({"inputs": [payload[(c * 7 + r * size + i) % len(payload)]
                                      for i in range(size)]}).encode()
               for r in range(cfg.requests + 1)] for c in range(clients)]
    latencies: list[float] = []
    errors: list[int] = []
    workers = [threading.Thread(target=_loop, args=(port, b, None, latencies, errors))
               for b in bodies]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.perf_counter() - start
    n = clients * (cfg.requests + 1)
    return {"scenario": name, "clients": clients, "inputs_per_request": size, "requests": n,
            "errors": len(errors), "requests_per_s": n / wall, "inputs_per_s": n * size / wall,
            "p50_ms": 1e3 * float(np.percentile(latencies, 50)),
            "p99_ms": 1e3 * float(np.percentile(latencies, 99))}


def measure_serve(ports: dict, payload: list[str], batch: int, cfg: ServeBenchConfig,
                  log) -> dict[str, list[dict]]:
    """Every scenario against every server (by precision), interleaved: ``cfg.serve_rounds``
    rounds, each running the scenario once against each server; the round with the most
    requests per second is kept (its p50 and p99 with it), for each server."""
    rows: dict[str, list[dict]] = {key: [] for key in ports}
    for scenario in SCENARIOS:
        best: dict[str, dict] = {}
        for _ in range(max(1, cfg.serve_rounds)):
            for key, port in ports.items():
                row = measure_scenario(port, payload, scenario, batch, cfg)
                if key not in best or row["requests_per_s"] > best[key]["requests_per_s"]:
                    best[key] = row
        for key, row in best.items():
            log(f"  serve {key} {row['scenario']}: {row['requests_per_s']:.1f} req/s, "
                f"{row['inputs_per_s']:.1f} inputs/s, p50 {row['p50_ms']:.0f} ms, "
                f"p99 {row['p99_ms']:.0f} ms")
            rows[key].append(row)
    return rows


def bench_model(name: str, spec: ServeModel, cfg: ServeBenchConfig, log) -> dict:
    """The default model (``precision: auto``) and the same model made at each other
    precision of ``cfg.precisions``, on the same samples and inputs, measured side by side."""
    from ..backbones.base import resolve_precision
    from ..learner import Learner

    default = resolve_precision("auto", None)
    with tempfile.TemporaryDirectory(prefix="gdacil-bench-serve-") as tmp:
        raws, labels, source = _raw_samples(spec, cfg, Path(tmp) / "images")
        seen: dict[str, int] = {}
        learn: list[int] = []
        test: list[int] = []
        for k, y in enumerate(labels):  # every other sample of each class is learned
            seen[y] = seen.get(y, 0) + 1
            (learn if seen[y] % 2 else test).append(k)
        queries, truth = [raws[k] for k in test], [labels[k] for k in test]
        made = {default: "auto", **{p: p for p in cfg.precisions if p != default}}
        learners, runs = {}, {}
        for key, precision in made.items():
            learner = Learner(spec.backbone, backbone_options=spec.options, seed=cfg.seed,
                              precision=precision)
            start = time.perf_counter()
            learner.learn([raws[k] for k in learn], [labels[k] for k in learn])
            learn_s = time.perf_counter() - start
            learner.save(Path(tmp) / key)
            answers = [p.classes[0] for p in learner.predict(queries, probabilities=False)]
            learners[key] = learner
            runs[key] = {"precision": precision, "runs": learner.precision, "learn_s": learn_s,
                         "answers": answers}
        for key, predict in measure_predict(learners, queries, spec.batch, cfg.repeats).items():
            runs[key]["predict"] = predict
            log(f"{name} ({made[key]}: {key}): predict {predict['fraction']:.3f} of the bare "
                f"model at batch {predict['batch']} ({predict['predict_s'] * 1e3:.0f} ms "
                f"against {predict['bare_s'] * 1e3:.0f} ms; "
                f"{predict['fraction_with_preprocessing']:.3f} with its preprocessing)")
        payload = _payload(queries, spec.modality)
        with contextlib.ExitStack() as stack:
            served = {key: stack.enter_context(_served(Path(tmp) / key, spec.batch))
                      for key in made}
            for key, rows in measure_serve({k: port for k, (_, port) in served.items()},
                                           payload, spec.batch, cfg, log).items():
                runs[key]["serve"] = rows
            service, port = served[default]
            heavy = _heavy_bodies(service.learner.modality, payload,
                                  service.info()["server"]["max_text_chars"],
                                  service.max_inputs, cfg.megapixels)
            heavy_rows = measure_heavy(port, payload, heavy, cfg, log)
    reference = runs.get("fp32", runs[default])["answers"]
    for key, found in runs.items():
        answers = found.pop("answers")
        found["top1_agreement_with_fp32"] = float(np.mean([a == b for a, b in
                                                           zip(answers, reference)]))
        found["accuracy"] = float(np.mean([a == b for a, b in zip(answers, truth)]))
        log(f"{name} {key}: top-1 agreement with fp32 {found['top1_agreement_with_fp32']:.4f},"
            f" accuracy {found['accuracy']:.4f} on {len(truth)} held-out inputs")
    main = runs[default]
    return {"about": spec.about, "source": source, "classes": len(set(labels)),
            "learned": len(learn), "default_precision": default, "learn_s": main["learn_s"],
            "predict": main["predict"], "serve": main["serve"], "heavy": heavy_rows,
            "precisions": runs}


def run(cfg: ServeBenchConfig, log=print) -> dict:
    torch.set_num_threads(cfg.threads)
    models = {name: bench_model(name, spec, cfg, log) for name, spec in cfg.models.items()}
    return {"benchmark": "serve", "config": asdict(cfg), "machine": machine_info(),
            "models": models}


def render(payload: dict) -> str:
    cfg, models = payload["config"], payload["models"]
    predict = markdown_table(
        ["model", "batch", "bare forward + head (ms)", "with preprocessing (ms)",
         "Learner.predict (ms)", "fraction", "fraction with preprocessing"],
        [[name, m["predict"]["batch"], f"{m['predict']['bare_s'] * 1e3:.1f}",
          f"{m['predict']['preprocess_and_bare_s'] * 1e3:.1f}",
          f"{m['predict']['predict_s'] * 1e3:.1f}", f"{m['predict']['fraction']:.3f}",
          f"{m['predict']['fraction_with_preprocessing']:.3f}"]
         for name, m in models.items()])
    serve = markdown_table(
        ["model", "scenario", "clients", "inputs/request", "requests/s", "inputs/s", "p50 ms",
         "p99 ms", "errors"],
        [[name, r["scenario"], r["clients"], r["inputs_per_request"], f"{r['requests_per_s']:.1f}",
          f"{r['inputs_per_s']:.1f}", f"{r['p50_ms']:.0f}", f"{r['p99_ms']:.0f}", r["errors"]]
         for name, m in models.items() for r in m["serve"]])
    heavy = markdown_table(
        ["model", "heavy client", "light p50 ms", "light p99 ms", "light max ms",
         "light requests", "light errors", "heavy requests", "heavy p50 ms", "heavy errors"],
        [[name, r["heavy"], f"{r['light_p50_ms']:.0f}", f"{r['light_p99_ms']:.0f}",
          f"{r['light_max_ms']:.0f}", r["light_requests"], r["light_errors"],
          r["heavy_requests"] if r["heavy"] != "none" else "-",
          f"{r['heavy_p50_ms']:.0f}" if r["heavy_p50_ms"] is not None else "-",
          ", ".join(map(str, r["heavy_errors"])) or ("0" if r["heavy"] != "none" else "-")]
         for name, m in models.items() for r in m.get("heavy", [])])
    precisions = markdown_table(
        ["model", "precision", "default here", "learn (s)", "Learner.predict (ms)",
         "top-1 agreement with fp32", "accuracy"],
        [[name, p, "yes" if p == m["default_precision"] else "", f"{r['learn_s']:.1f}",
          f"{r['predict']['predict_s'] * 1e3:.1f}", f"{r['top1_agreement_with_fp32']:.4f}",
          f"{r['accuracy']:.4f}"]
         for name, m in models.items() for p, r in m.get("precisions", {}).items()])
    precision_serve = markdown_table(
        ["model", "scenario", *(f"{p} {what}" for p in _precisions(models)
                                for what in ("inputs/s", "p99 ms"))],
        [[name, row["scenario"], *(value for p in _precisions(models) for value in (
            f"{m['precisions'][p]['serve'][k]['inputs_per_s']:.1f}",
            f"{m['precisions'][p]['serve'][k]['p99_ms']:.0f}"))]
         for name, m in models.items() if "precisions" in m
         for k, row in enumerate(m["serve"])])
    machine = payload["machine"]
    intro, bullets = __doc__.split("\n\n")[1:3]
    return "\n".join([
        "# The continual classifier's throughput: predict and `gdacil serve`", "",
        " ".join(intro.split()), "",
        *("* " + " ".join(b.removeprefix("* ").split()) for b in bullets.split("\n* ")), "",
        f"Machine: {machine.get('cpu_model') or machine['processor']}"
        + (" (native bfloat16)" if machine.get("native_bfloat16") else "")
        + f", {machine['cpu_count']} cores, {cfg['threads']} "
        f"torch thread(s), torch {machine['torch']}; "
        f"{cfg['classes']} classes; {cfg['requests']} requests per client and scenario.", "",
        f"Default precision here (``auto``): {_default_precision(models)}.", "",
        "## predict against the bare model", "", predict, "",
        "## gdacil serve", "", serve, "",
        f"## A heavy client beside {cfg['light']} light ones ({cfg['seconds']:g} s each)", "",
        heavy, "",
        "## fp32 and bf16 on the same inputs", "", precisions, "", precision_serve, ""])


def _precisions(models: dict) -> list[str]:
    """The precisions every model ran, in the order of the first."""
    first: dict = next((m["precisions"] for m in models.values() if "precisions" in m), {})
    return list(first)


def _default_precision(models: dict) -> str:
    found = {m.get("default_precision", "fp32") for m in models.values()}
    return ", ".join(sorted(found))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="gdacil bench serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a tiny random ViT and few requests (seconds; for tests)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--requests", type=int, help="requests per client and scenario")
    output_arguments(parser, "serve", "serve.json and serve.md")
    args = parser.parse_args(argv)
    refuse_to_overwrite(parser, args, "serve.json", "serve.md")
    cfg = replace(QUICK if args.quick else FULL, threads=args.threads)
    if args.requests:
        cfg = replace(cfg, requests=args.requests)
    payload = run(cfg, log=lambda line: print(line, flush=True))
    write_report(args.out, "serve", payload, render(payload))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
