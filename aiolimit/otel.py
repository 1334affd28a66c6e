"""OpenTelemetry metrics for aiolimit (``pip install 'aiolimit-redis[otel]'``: the API only).

>>> import aiolimit
>>> from aiolimit.otel import OpenTelemetryObserver
>>> aiolimit.observe(OpenTelemetryObserver())          # the global MeterProvider
>>> aiolimit.observe(OpenTelemetryObserver(meter_provider=provider))

Instruments (meter ``aiolimit``), each with the attribute ``aiolimit.limiter`` (the limiter's
name; never a client id, which would make one series per user) unless said otherwise:

==============================  ====================  ===============  ============================
name                            kind                  unit             attributes besides
==============================  ====================  ===============  ============================
``aiolimit.requests``           counter               ``{request}``    ``aiolimit.result``:
                                                                       ``granted``, ``refused``,
                                                                       ``error``; ``error.type``
                                                                       (the exception class) on
                                                                       errors
``aiolimit.permits``            counter               ``{permit}``     (permits granted)
``aiolimit.wait.duration``      histogram             ``s``            (callers given a
                                                                       reservation: how long they
                                                                       slept until their slot)
``aiolimit.queued``             up-down counter       ``{request}``    (callers of this process
                                                                       waiting for a reservation
                                                                       now)
``aiolimit.partner.refusals``   counter               ``{response}``   ``http.response.status_code``
                                                                       (429 or 503: the HTTP
                                                                       clients' partner refused a
                                                                       call)
``aiolimit.learned.rate``       gauge                 ``{permit}/s``   (a learned rate in force:
                                                                       :class:`~aiolimit.Learner`)
``aiolimit.learned.ceiling``    gauge                 ``{permit}/s``   (its ceiling)
``aiolimit.redis.round_trips``  counter               ``{round_trip}`` none: shared by limiters
``aiolimit.redis.requests``     counter               ``{request}``    none: requests the round
                                                                       trips carried (divided by
                                                                       round trips: the mean
                                                                       batch size)
``aiolimit.redis.batch.size``   histogram             ``{request}``    none: requests per round
                                                                       trip; only with
                                                                       ``batch_sizes=True``
==============================  ====================  ===============  ============================

Cost. An OpenTelemetry SDK ``add`` or ``record`` costs about 5 µs, more than half of a
grant's whole client-side CPU time (8 µs); so the counters are kept here in plain dicts (a
dict update per grant) and handed to OpenTelemetry as observable instruments, read when the
SDK collects. ``aiolimit.wait.duration`` is recorded directly, but only for a caller that
waited for a reservation (it slept far longer than a record takes); grants made at once are
counted in ``aiolimit.requests``, not in the histogram (as ASP.NET Core's
``request.time_in_queue`` counts queued requests only). The batch-size histogram would cost
a record per round trip, which at one request per round trip adds about 5 % to a call's
latency: it is off unless ``batch_sizes=True``; the two Redis counters give the mean.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ._extras import missing_extra

try:
    from opentelemetry import metrics
    from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
except ImportError as exc:
    raise missing_extra("aiolimit.otel", "otel") from exc

from . import __version__
from ._observe import Observer
from .errors import LimiterError

__all__ = ["OpenTelemetryObserver"]

LIMITER = "aiolimit.limiter"
RESULT = "aiolimit.result"
ERROR_TYPE = "error.type"
STATUS = "http.response.status_code"

# Waits from a millisecond (a reservation a few grants ahead) to minutes (a deep queue).
_WAIT_BOUNDARIES = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
# One request to a full pipeline (the coalescer's acquire_many carries 64 per call).
_BATCH_BOUNDARIES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class OpenTelemetryObserver(Observer):
    """Reports what limiters do as OpenTelemetry metrics (see the module's table); attach it
    with ``aiolimit.observe(OpenTelemetryObserver())``."""

    __slots__ = (
        "_attributes",
        "_batch",
        "_errors",
        "_granted",
        "_learned",
        "_queued",
        "_refusals",
        "_refused",
        "_sent",
        "_trips",
        "_wait",
    )

    def __init__(
        self, meter_provider: MeterProvider | None = None, *, batch_sizes: bool = False
    ) -> None:
        meter = metrics.get_meter("aiolimit", __version__, meter_provider=meter_provider)
        # Counts kept here, read by the SDK when it collects (possibly in its own thread:
        # it copies each dict, which is atomic under the GIL, before reading it).
        self._granted: dict[str, list[int]] = {}  # name -> [grants, permits]
        self._refused: dict[str, int] = {}
        self._errors: dict[tuple[str, str], int] = {}  # (name, error type)
        self._queued: dict[str, int] = {}
        self._refusals: dict[tuple[str, int], int] = {}  # (name, status)
        self._trips = 0
        self._sent = 0
        self._attributes: dict[str, dict[str, Any]] = {}  # name -> {LIMITER: name}
        self._learned: dict[str, tuple[float, float]] = {}  # name -> (rate, ceiling) per s
        meter.create_observable_counter(
            "aiolimit.requests",
            callbacks=[self._observe_requests],
            unit="{request}",
            description="Requests for permits, by result: granted, refused or error.",
        )
        meter.create_observable_counter(
            "aiolimit.permits",
            callbacks=[self._observe_permits],
            unit="{permit}",
            description="Permits granted.",
        )
        meter.create_observable_up_down_counter(
            "aiolimit.queued",
            callbacks=[self._observe_queued],
            unit="{request}",
            description="Callers in this process waiting for a reserved slot.",
        )
        meter.create_observable_counter(
            "aiolimit.partner.refusals",
            callbacks=[self._observe_refusals],
            unit="{response}",
            description="Responses of 429 or 503 from the server an HTTP client's limiter guards.",
        )
        meter.create_observable_counter(
            "aiolimit.redis.round_trips",
            callbacks=[self._observe_trips],
            unit="{round_trip}",
            description="Round trips to Redis (shared by concurrent calls of any limiter).",
        )
        meter.create_observable_counter(
            "aiolimit.redis.requests",
            callbacks=[self._observe_sent],
            unit="{request}",
            description="Requests carried by round trips to Redis.",
        )
        meter.create_observable_gauge(
            "aiolimit.learned.rate",
            callbacks=[self._observe_learned],
            unit="{permit}/s",
            description="The learned rate in force (its first rate), as this process last saw it.",
        )
        meter.create_observable_gauge(
            "aiolimit.learned.ceiling",
            callbacks=[self._observe_ceiling],
            unit="{permit}/s",
            description="The most a learned rate may be: the limiter's rate from code.",
        )
        self._wait = meter.create_histogram(
            "aiolimit.wait.duration",
            unit="s",
            description="How long callers that waited for a reservation waited for their grant.",
            explicit_bucket_boundaries_advisory=_WAIT_BOUNDARIES,
        )
        self._batch = None
        if batch_sizes:
            self._batch = meter.create_histogram(
                "aiolimit.redis.batch.size",
                unit="{request}",
                description="Requests carried by one round trip to Redis.",
                explicit_bucket_boundaries_advisory=_BATCH_BOUNDARIES,
            )

    # -- what limiters report (the hot path: dict updates only) ----------------------------

    def granted(self, name: str, permits: int, waited: float) -> None:
        counts = self._granted.get(name)
        if counts is None:
            counts = self._granted[name] = [0, 0]
        counts[0] += 1
        counts[1] += permits
        if waited:
            self._wait.record(waited, self._limiter(name))

    def refused(self, name: str, permits: int) -> None:
        self._refused[name] = self._refused.get(name, 0) + 1

    def failed(self, name: str, permits: int, error: LimiterError) -> None:
        key = (name, type(error).__name__)
        self._errors[key] = self._errors.get(key, 0) + 1

    def queued(self, name: str, change: int) -> None:
        self._queued[name] = self._queued.get(name, 0) + change

    def partner_refused(self, name: str, status: int, pause: float | None) -> None:
        key = (name, status)
        self._refusals[key] = self._refusals.get(key, 0) + 1

    def round_trip(self, requests: int) -> None:
        self._trips += 1
        self._sent += requests
        if self._batch is not None:
            self._batch.record(requests)

    def learned(self, name: str, permits: int, ceiling: int, interval: float) -> None:
        self._learned[name] = (permits / interval, ceiling / interval)

    # -- what the SDK reads when it collects -------------------------------------------------

    def _limiter(self, name: str) -> dict[str, Any]:
        attributes = self._attributes.get(name)
        if attributes is None:
            attributes = self._attributes[name] = {LIMITER: name}
        return attributes

    def _observe_requests(self, options: CallbackOptions) -> Iterable[Observation]:
        for name, (grants, _) in self._granted.copy().items():
            yield Observation(grants, {LIMITER: name, RESULT: "granted"})
        for name, count in self._refused.copy().items():
            yield Observation(count, {LIMITER: name, RESULT: "refused"})
        for (name, error), count in self._errors.copy().items():
            yield Observation(count, {LIMITER: name, RESULT: "error", ERROR_TYPE: error})

    def _observe_permits(self, options: CallbackOptions) -> Iterable[Observation]:
        for name, (_, permits) in self._granted.copy().items():
            yield Observation(permits, self._limiter(name))

    def _observe_queued(self, options: CallbackOptions) -> Iterable[Observation]:
        for name, count in self._queued.copy().items():
            yield Observation(count, self._limiter(name))

    def _observe_refusals(self, options: CallbackOptions) -> Iterable[Observation]:
        for (name, status), count in self._refusals.copy().items():
            yield Observation(count, {LIMITER: name, STATUS: status})

    def _observe_learned(self, options: CallbackOptions) -> Iterable[Observation]:
        for name, (rate, _) in self._learned.copy().items():
            yield Observation(rate, self._limiter(name))

    def _observe_ceiling(self, options: CallbackOptions) -> Iterable[Observation]:
        for name, (_, ceiling) in self._learned.copy().items():
            yield Observation(ceiling, self._limiter(name))

    def _observe_trips(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self._trips)

    def _observe_sent(self, options: CallbackOptions) -> Iterable[Observation]:
        yield Observation(self._sent)
