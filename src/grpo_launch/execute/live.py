"""What the launcher serves and writes while a run goes, asked for by the recipe and nothing otherwise: the run's
Prometheus endpoint (``launch.metrics_port``, bound to ``launch.metrics_host``, 127.0.0.1 unless set) and the run
report rewritten every ``launch.report_every_steps`` steps.

Both are threads of the launcher process, so they work the same for every backend: on a run over several hosts the
endpoint serves from the launcher's host, reading the run directory the trainers write (metrics.jsonl is the source
of truth; :mod:`grpo_launch.analysis.live_metrics` is the one metric list). The port is bound before anything of the
run starts: one in use is an error naming the key.
"""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from grpo_launch.analysis.live_metrics import METRICS, samples
from grpo_launch.analysis.report import write_report
from grpo_launch.analysis.view import RunView
from grpo_launch.errors import GrpoLaunchError, LaunchError
from grpo_launch.planning.plan_types import Plan
from grpo_launch.rundir.layout import RunPaths
from grpo_launch.rundir.records import MetricsTail
from grpo_launch.spec import RunContext

REPORT_POLL_S = 2.0  # how often the report thread looks for a new step
# A scrape's connection: how long it may stay silent before it is closed, and how many are served at once (each is a
# thread of the launcher; one more is closed at once, never queued). Prometheus scrapes once per interval, and a
# scrape is answered in milliseconds: what holds a connection longer is not a scraper.
CONNECTION_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 16


class RunCollector:
    """A prometheus_client collector over a run directory: every scrape reads it once (:class:`RunView`), and
    metrics.jsonl only from where the last scrape stopped (:class:`MetricsTail`: a long run's file is not parsed
    again every few seconds)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.tail = MetricsTail(RunPaths(self.run_dir).metrics)
        self._reading = threading.Lock()  # scrapes may overlap; the tail is read by one at a time

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        try:
            with self._reading:
                found = samples(RunView.load(self.run_dir, strict=False, tail=self.tail))
        except Exception:  # a run file being replaced mid-read: this scrape serves nothing, the next reads again
            found = []
        for metric in METRICS:
            kind = CounterMetricFamily if metric.kind == "counter" else GaugeMetricFamily
            family = kind(metric.name, metric.help, labels=list(metric.labels))
            for name, labels, value in found:
                if name == metric.name:
                    family.add_metric([labels.get(k, "") for k in metric.labels], value)
            yield family


class MetricsServer(http.server.ThreadingHTTPServer):
    """The run's endpoint: a thread per connection (daemon threads: a stuck scrape never holds the launcher's exit),
    and its collector, whose reading of the run directory :func:`serve_metrics` keeps between scrapes."""

    daemon_threads = True
    allow_reuse_address = False  # another listener on the port must be an error, not shared
    # The kernel's queue of connections not yet accepted (socketserver's default is 5). Past it a connection's SYN is
    # dropped and the client retries after 1 s, 2 s, 4 s…: a burst of idle connections, each closed at once when the
    # slots are full, would delay a real scrape by seconds. 128 was Linux's SOMAXCONN cap before 5.4.
    request_queue_size = 128
    collector: RunCollector


def serve_metrics(
    run_dir: str | Path,
    host: str,
    port: int,
    *,
    timeout_s: float = CONNECTION_TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
) -> MetricsServer:
    """A started HTTP server on ``host:port`` answering ``GET /metrics`` with the run's metrics, each connection
    closed after ``timeout_s`` of silence and at most ``max_connections`` served at once (a connection beyond them
    is closed at once: idle connections cannot pile up threads in the launcher). Raises LaunchError when the port
    cannot be bound."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

    collector = RunCollector(run_dir)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)

    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = timeout_s  # an idle or slow connection is closed, and its thread ends

        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "the run's metrics are at /metrics")
                return
            body = generate_latest(registry)
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # scrapes are not the launcher's news
            pass

    slots = threading.BoundedSemaphore(max_connections)

    class Server(MetricsServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        def process_request(self, request: Any, client_address: Any) -> None:
            if not slots.acquire(blocking=False):  # as many connections as threads allowed: closed, no thread
                self.shutdown_request(request)
                return
            try:
                super().process_request(request, client_address)
            except BaseException:
                slots.release()  # no thread started to release it
                raise

        def finish_request(self, request: Any, client_address: Any) -> None:
            try:  # in the connection's own thread, until its handler is done (or timed out)
                super().finish_request(request, client_address)
            finally:
                slots.release()

    try:
        server = Server((host, port), Handler)
        server.collector = collector
    except OSError as exc:
        raise LaunchError(
            f"cannot serve the run's metrics on {host}:{port}: {exc.strerror or exc}",
            hint=f"Set launch.metrics_port to a free port (or launch.metrics_host to an address of this host): "
            f"launch.metrics_port={port + 1}.",
        ) from None
    threading.Thread(target=server.serve_forever, name="grpo-launch-metrics", daemon=True).start()
    return server


def _report_loop(plan: Plan, ctx: RunContext, every: int, stop: threading.Event) -> None:
    """Write the run report each time the run passes another ``every`` steps."""
    written = 0
    while not stop.wait(REPORT_POLL_S):
        try:
            steps = RunView.load(plan.run_dir, strict=False).steps()
        except Exception:  # mid-write: read again at the next poll
            continue
        if not steps or steps[-1].step // every <= written:
            continue
        written = steps[-1].step // every
        try:
            path = write_report(plan.run_dir)
        except (GrpoLaunchError, OSError, ValueError) as exc:
            ctx.emit(f"[grpo-launch] no report at step {steps[-1].step}: {exc}")
            return  # matplotlib missing or the like: it will not come later
        ctx.emit(f"[grpo-launch] run report at step {steps[-1].step}: {path}")


@contextlib.contextmanager
def live_run(plan: Plan, ctx: RunContext) -> Iterator[None]:
    """The run's endpoint and report thread for as long as the run goes (none of them unless the recipe asks)."""
    launch = plan.recipe.launch
    server = None
    if launch.metrics_port is not None:
        server = serve_metrics(plan.run_dir, launch.metrics_host, launch.metrics_port)
        ctx.emit(f"[grpo-launch] metrics: http://{_url_host(launch.metrics_host)}:{launch.metrics_port}/metrics")
    stop = threading.Event()
    reporter = None
    if launch.report_every_steps:
        reporter = threading.Thread(
            target=_report_loop,
            args=(plan, ctx, launch.report_every_steps, stop),
            name="grpo-launch-report",
            daemon=True,
        )
        reporter.start()
    try:
        yield
    finally:
        stop.set()
        if server is not None:
            server.shutdown()
            server.server_close()
        if reporter is not None:
            reporter.join(timeout=30)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
