"""``GET /metrics`` of ``gdacil serve``: the server's counters in the Prometheus text format
(``pip install 'gdacil[serve]'`` brings ``prometheus-client``).

=======================================  ==========================================================
``gdacil_requests_total``                requests answered, by ``endpoint`` (the route's path,
                                         ``/inbox/{item}/label`` for every item; ``other`` for a
                                         path of no route), ``method`` and ``status``
``gdacil_request_duration_seconds``      histogram of the seconds to answer, by ``endpoint``
``gdacil_queue_inputs``                  inputs waiting to be scored
``gdacil_batches_total``                 backbone forwards run
``gdacil_inputs_total``                  inputs answered by ``/predict``
``gdacil_reject_inputs_total``           those of requests that asked ``"reject": true``
``gdacil_unknown_inputs_total``          those answered unknown: the unknown-answer rate is
                                         ``rate(unknown) / rate(reject_inputs)``
``gdacil_model_info``                    1, labelled with the ``version`` served
``gdacil_model_version``                 the number of the version served (3 for ``v3``)
``gdacil_model_age_seconds``             seconds since the version served was saved
``gdacil_inbox_items``                   items in the inbox (with ``--inbox``), and
``gdacil_inbox_bytes``                   their bytes
=======================================  ==========================================================

Each application has its own :class:`~prometheus_client.CollectorRegistry`, so several servers
in one process keep their own counts.
"""

from __future__ import annotations

import time
from datetime import datetime

from .._optional import require

__all__ = ["RequestMetrics", "ServerMetrics"]

#: The methods counted by name (any other is counted as ``other``)
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
#: Histogram buckets of request durations, in seconds
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class ServerMetrics:
    """The metrics of one application serving ``service`` (a
    :class:`~gdacil.learner.serve.ModelService`); :class:`RequestMetrics` counts its
    requests.

    Examples
    --------
    >>> from types import SimpleNamespace
    >>> metrics = ServerMetrics(SimpleNamespace(inbox=None, observed=lambda: {}))
    >>> metrics.requests.labels("/health", "GET", "200").inc()
    >>> print(metrics.render().decode().split("# HELP gdacil_request_duration")[0].strip())
    ... # doctest: +ELLIPSIS
    # HELP gdacil_requests_total Requests answered, by endpoint, method and status
    # TYPE gdacil_requests_total counter
    gdacil_requests_total{endpoint="/health",method="GET",status="200"} 1.0
    ...
    """

    def __init__(self, service):
        prometheus = require("prometheus_client", feature="gdacil serve's /metrics",
                             install="pip install 'gdacil[serve]'")
        self.service = service
        self.registry = prometheus.CollectorRegistry(auto_describe=True)
        self.requests = prometheus.Counter(
            "gdacil_requests", "Requests answered, by endpoint, method and status",
            ("endpoint", "method", "status"), registry=self.registry)
        self.duration = prometheus.Histogram(
            "gdacil_request_duration_seconds", "Seconds to answer a request, by endpoint",
            ("endpoint",), buckets=BUCKETS, registry=self.registry)
        self.registry.register(_ServiceCollector(service))
        self._prometheus = prometheus

    def render(self) -> bytes:
        """The text format of every metric."""
        return self._prometheus.generate_latest(self.registry)


class RequestMetrics:
    """ASGI middleware counting every answer of ``app`` in ``metrics`` (a
    :class:`ServerMetrics`), by the path of the first of ``routes`` (Starlette routes) that
    matches, ``other`` when none does: the label's values are bounded by the routes."""

    def __init__(self, app, metrics: ServerMetrics, routes):
        self.app, self.metrics, self.routes = app, metrics, routes

    def endpoint(self, path: str) -> str:
        for route in self.routes:
            regex = getattr(route, "path_regex", None)
            if regex is not None and regex.match(path):
                return route.path_format
        return "other"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500  # unless an answer starts

        async def recording_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            name = self.endpoint(scope.get("path", ""))
            method = scope["method"] if scope["method"] in _METHODS else "other"
            self.metrics.requests.labels(name, method, str(status)).inc()
            self.metrics.duration.labels(name).observe(time.perf_counter() - started)


class _ServiceCollector:
    """The metrics read from the service when scraped."""

    def __init__(self, service):
        self.service = service
        self._created: dict[str, float | None] = {}

    def describe(self):
        return []

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        service = self.service
        scheduler = getattr(service, "_scheduler", None)
        if scheduler is not None:
            yield GaugeMetricFamily("gdacil_queue_inputs", "Inputs waiting to be scored",
                                    value=scheduler.pending)
            yield CounterMetricFamily("gdacil_batches", "Backbone forwards run",
                                      value=scheduler.batches)
        observed = service.observed()
        for key, text in (("inputs", "Inputs answered by /predict"),
                          ("reject_inputs", "Inputs of requests that asked reject: true"),
                          ("unknown", "Inputs answered unknown")):
            if key in observed:
                name = "gdacil_unknown_inputs" if key == "unknown" else f"gdacil_{key}"
                yield CounterMetricFamily(name, text, value=observed[key])
        learner = getattr(service, "learner", None)
        version = getattr(learner, "version", None)
        if version is not None:
            info = GaugeMetricFamily("gdacil_model_info", "The version served",
                                     labels=("version",))
            info.add_metric((version,), 1)
            yield info
            if version[1:].isdigit():
                yield GaugeMetricFamily("gdacil_model_version",
                                        "The number of the version served",
                                        value=int(version[1:]))
            created = self._created_at(service.directory, version)
            if created is not None:
                yield GaugeMetricFamily("gdacil_model_age_seconds",
                                        "Seconds since the version served was saved",
                                        value=max(0.0, time.time() - created))
        inbox = service.inbox
        if inbox is not None:
            yield GaugeMetricFamily("gdacil_inbox_items", "Items in the inbox", value=len(inbox))
            yield GaugeMetricFamily("gdacil_inbox_bytes", "Bytes of the inbox's items",
                                    value=inbox.bytes)

    def _created_at(self, directory, version: str) -> float | None:
        """When ``version`` was saved (seconds since the epoch; read once per version)."""
        if version not in self._created:
            from .bundle import versions

            found = next((v for v in versions(directory) if v.name == version), None)
            try:
                self._created[version] = datetime.fromisoformat(found.created).timestamp() \
                    if found is not None and found.created else None
            except ValueError:
                self._created[version] = None
        return self._created[version]

