"""The command line: ``python -m modelserve PROJECT_DIR`` (also installed as ``modelserve``).

Exit codes: 0 after a clean shutdown (SIGINT, SIGTERM), 2 for a bad command line or project folder, 3 when
a handler fails to load, 4 when the address cannot be listened on (a port in use, an unknown host). Only this
module turns errors into exit codes.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from modelserve.jobs import STORE_CHOICES, store_kind
from modelserve.launch import (
    ENV_SETTINGS,
    EXIT_LOAD,
    SERVERS,
    ignore_signal,
    listen,
    make_app,
    serve_granian,
    settings_of,
    ssl_settings,
    warn_exposed,
)
from modelserve.logs import configure_logging

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_ADDRESS = 4
DEFAULT_PORT = 8888
DEFAULT_GRACE = 30.0
SECONDS = "a number of seconds"

logger = logging.getLogger("modelserve")


def number(
    kind: type[int] | type[float],
    minimum: float | None = None,
    maximum: float | None = None,
    *,
    above: bool = False,
    noun: str | None = None,
) -> Callable[[str], float]:
    """An argparse ``type`` that reads an int or a finite float within bounds, so that every numeric option is
    refused the same way (exit 2, ``modelserve: error: argument --port: expected ...``)::

        parser.add_argument("--port", type=number(int, 1, 65535))
        parser.add_argument("--body-timeout", type=number(float, 0, above=True))   # more than 0

    `above` makes `minimum` itself refused (a timeout of 0 would close every connection at once).
    """
    noun = noun or ("an integer" if kind is int else "a number")
    if minimum is not None and maximum is not None:
        wanted = f"{noun} from {minimum:g} to {maximum:g}"
    elif minimum is not None:
        wanted = f"{noun} {'above' if above else 'of at least'} {minimum:g}"
    else:
        wanted = noun

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}") from None
        low = minimum is not None and (value <= minimum if above else value < minimum)
        if not math.isfinite(value) or low or (maximum is not None and value > maximum):
            raise argparse.ArgumentTypeError(f"expected {wanted}, got {text!r}")
        return value

    return parse


def path(text: str) -> str:
    """An argparse ``type`` for a file or folder: absolute, against the folder the command ran in, before anything
    changes the working directory (a project folder becomes it; uvicorn reads the TLS files after that)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a path, got ''")
    from modelserve.project import caller_dir

    return os.path.normpath(caller_dir() / os.path.expanduser(text))


def host(text: str) -> str:
    """An argparse ``type`` for ``--host``: a name or address. An empty one is refused: bound as it is, it
    would mean every interface, the opposite of what a user who left it blank is likely to want."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a host name or address (127.0.0.1, 0.0.0.0, ::1), got {text!r}")
    return text


def jobs_store(text: str) -> str:
    """An argparse ``type`` for ``--jobs-store``: checked here, so that a typo is refused even when the project
    has no async API yet (it would be ignored until one is added)."""
    if store_kind(text) is None:
        raise argparse.ArgumentTypeError(f"expected {STORE_CHOICES}, got {text!r}")
    return text


def build_parser() -> argparse.ArgumentParser:
    from modelserve import __version__

    parser = argparse.ArgumentParser(
        prog="modelserve",
        description="Serve the models of a project folder over HTTP.",
    )
    parser.add_argument("--version", action="version", version=f"modelserve {__version__}")
    parser.add_argument(
        "project_dir",
        type=path,
        help="folder holding modelserve.yaml (or a model.py with a class Model, a Truss, a cortex.yaml)",
    )
    parser.add_argument("--host", type=host, default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    parser.add_argument(
        "--port",
        type=number(int, 1, 65535),
        default=DEFAULT_PORT,
        metavar="PORT",
        help=f"port to bind (default: {DEFAULT_PORT})",
    )
    parser.add_argument(
        "--workers",
        type=number(int, 1),
        default=1,
        metavar="N",
        help="worker processes, each loading the project (default: 1)",
    )
    parser.add_argument(
        "--server",
        choices=list(SERVERS),
        default="uvicorn",
        help="uvicorn, or granian: Rust HTTP, one process, the granian extra (docs/edge.md) (default: uvicorn)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=["critical", "error", "warning", "info", "debug"],
        help="log level (default: info)",
    )
    parser.add_argument(
        "--log-format", default="text", choices=["text", "json"], help="text for people, json for log pipelines"
    )
    parser.add_argument("--reload", action="store_true", help="restart when project files change")
    parser.add_argument(
        "--no-access-log", dest="access_log", action="store_false", help="do not log a line per request"
    )
    parser.add_argument(
        "--graceful-timeout",
        type=number(float, 0, noun=SECONDS),
        default=DEFAULT_GRACE,
        metavar="SECONDS",
        help=f"seconds in-flight requests get to finish after SIGTERM (default: {DEFAULT_GRACE:g})",
    )
    parser.add_argument(
        "--no-docs", dest="docs", action="store_false", help="do not serve /docs (the OpenAPI document's page)"
    )
    parser.add_argument(
        "--tracing",
        action="store_true",
        help="send OpenTelemetry traces to the collector of OTEL_EXPORTER_OTLP_ENDPOINT (needs the 'tracing' extra)",
    )
    parser.add_argument("--jobs-store", type=jobs_store, default=None, help=f"override the jobs store: {STORE_CHOICES}")
    parser.add_argument(
        "--secrets-dir",
        type=path,
        default=None,
        metavar="PATH",
        help="folder of secret files, one per secret name, read by a Model's `secrets` (default: /secrets)",
    )
    grpc = parser.add_argument_group("gRPC and the model repository")
    grpc.add_argument(
        "--grpc-port",
        type=number(int, 1, 65535),
        default=None,
        metavar="PORT",
        help="serve the Open Inference Protocol over gRPC on this port too (needs the grpc extra)",
    )
    grpc.add_argument(
        "--model-control",
        choices=["none", "explicit"],
        default="none",
        help="explicit: load and unload models while serving (/v2/repository); none (default): all load at start",
    )
    grpc.add_argument(
        "--load-model",
        metavar="NAME",
        action="append",
        default=[],
        help="with --model-control explicit, an API to load at start (repeatable; default: all of them)",
    )
    security = parser.add_argument_group("serving beyond loopback")
    security.add_argument(
        "--api-key-env",
        metavar="NAME",
        default=None,
        help="require an API key on every route but the probes; the keys are in this environment variable",
    )
    security.add_argument(
        "--cors-origin",
        metavar="ORIGIN",
        action="append",
        default=[],
        help="let web pages of this origin (https://app.example.com) call the server from a browser; repeatable",
    )
    security.add_argument(
        "--ssl-certfile", metavar="PATH", type=path, default=None, help="serve HTTPS with this certificate"
    )
    security.add_argument(
        "--ssl-keyfile", metavar="PATH", type=path, default=None, help="the certificate's private key"
    )
    security.add_argument(
        "--ssl-keyfile-password-env",
        metavar="NAME",
        default=None,
        help="environment variable holding the private key's password",
    )
    from modelserve.http._protocol import BODY_TIMEOUT, HEADER_TIMEOUT, MAX_HEADER_SIZE, REFUSAL_PAUSE

    limits = parser.add_argument_group("transport limits")
    limits.add_argument(
        "--max-header-size",
        type=number(int, 1),
        default=MAX_HEADER_SIZE,
        metavar="BYTES",
        help=f"largest request line and headers; larger: 400 and closed (default: {MAX_HEADER_SIZE})",
    )
    limits.add_argument(
        "--header-timeout",
        type=number(float, 0, above=True, noun=SECONDS),
        default=HEADER_TIMEOUT,
        metavar="SECONDS",
        help=f"seconds a request's headers may take to arrive, then closed (default: {HEADER_TIMEOUT:g})",
    )
    limits.add_argument(
        "--body-timeout",
        type=number(float, 0, above=True, noun=SECONDS),
        default=BODY_TIMEOUT,
        metavar="SECONDS",
        help=f"seconds a request's body may take after its headers, then closed (default: {BODY_TIMEOUT:g})",
    )
    limits.add_argument(
        "--refusal-pause",
        type=number(float, 0, 1, noun=SECONDS),
        default=REFUSAL_PAUSE,
        metavar="SECONDS",
        help="after a 503 because the line was full, seconds before the connection's next request is read"
        " (0: at once)"
        f" (default: {REFUSAL_PAUSE:g})",
    )
    return parser


def command_line(options: dict[str, object]) -> list[str]:
    """The options of `modelserve.serve` as the command line's words: ``log_format="json"`` is
    ``--log-format json``, ``reload=True`` is ``--reload``, a list repeats its option
    (``cors_origin=[a, b]``), and False turns off what is on by default (``docs=False`` is ``--no-docs``, as
    ``create_app(docs=False)`` and uvicorn's ``access_log=False``); False or None for anything else is nothing."""
    # A flag that is on by default: its dest is what a keyword names (docs, access_log), its option turns it off.
    off = {
        action.dest: action.option_strings[0]
        for action in build_parser()._actions
        if action.nargs == 0 and action.default is True
    }
    words: list[str] = []
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if key in off:
            if value is False:
                words.append(off[key])
            elif value is not True and value is not None:
                words.extend([flag, str(value)])  # argparse refuses it, naming the option
        elif value is True:
            words.append(flag)
        elif isinstance(value, (list, tuple)):
            for item in value:
                words.extend([flag, str(item)])
        elif value is not False and value is not None:
            words.extend([flag, str(value)])
    return words


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("dockerfile", "build"):  # `modelserve dockerfile PROJECT`: modelserve.container
        return _container_command(argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    if args.workers > 1 and args.reload:
        parser.print_usage(sys.stderr)
        print("modelserve: error: --reload and --workers cannot be used together", file=sys.stderr)
        return EXIT_USAGE
    if args.load_model and args.model_control != "explicit":
        parser.print_usage(sys.stderr)
        print("modelserve: error: --load-model needs --model-control explicit", file=sys.stderr)
        return EXIT_USAGE
    if args.grpc_port is not None and args.grpc_port == args.port:
        parser.print_usage(sys.stderr)
        print(f"modelserve: error: --grpc-port and --port are both {args.port}; give them two ports", file=sys.stderr)
        return EXIT_USAGE
    if args.grpc_port is not None and args.ssl_keyfile_password_env is not None:
        parser.print_usage(sys.stderr)
        print("modelserve: error: --grpc-port serves TLS with an unencrypted private key only", file=sys.stderr)
        return EXIT_USAGE

    if args.secrets_dir is not None:
        from modelserve.secrets import SECRETS_DIR_ENV

        os.environ[SECRETS_DIR_ENV] = args.secrets_dir
    if args.tracing:  # through the environment, so that every worker (and a reload) turns it on too
        from modelserve.config import TRACING_ENV

        os.environ[TRACING_ENV] = "1"

    import logging.config

    log_config = configure_logging(args.log_level, args.log_format, args.access_log)
    logging.config.dictConfig(log_config)

    from modelserve.errors import ConfigError, LoadError

    try:
        ssl_kwargs = ssl_settings(args)
    except ValueError as exc:
        print(f"modelserve: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    display_host = f"[{args.host}]" if ":" in args.host else args.host
    scheme = "https" if ssl_kwargs else "http"
    base_url = f"{scheme}://{display_host}:{args.port}"
    settings = settings_of(args, base_url)
    multiprocess = args.workers > 1 or args.reload
    if args.workers > 1:
        # Every worker writes its metrics to files here, so that /metrics adds them all up.
        metrics_dir = tempfile.mkdtemp(prefix="modelserve-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        atexit.register(shutil.rmtree, metrics_dir, True)  # after the workers are gone, whatever the exit
        # Every worker takes its slot (and so its GPU among an API's devices) from lock files here.
        # ... and says there when it has loaded, so that every worker's /readyz answers for all of them.
        from modelserve.devices import SLOTS_ENV, WORKERS_ENV

        slots_dir = tempfile.mkdtemp(prefix="modelserve-slots-")
        os.environ[SLOTS_ENV] = slots_dir
        os.environ[WORKERS_ENV] = str(args.workers)
        atexit.register(shutil.rmtree, slots_dir, True)

    # Validate the project in this process first (config, imports, signatures), so that the common
    # mistakes give a clear message and an exit code before any worker starts.
    failures: list[Exception] = []
    try:
        app = make_app(settings, failures.append)
    except ConfigError as exc:
        print(f"modelserve: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except LoadError as exc:
        print(f"modelserve: error: {exc}", file=sys.stderr)
        return EXIT_LOAD
    auth = app.server.project.auth  # a metrics key alone opens /metrics only: every API is still open
    warn_exposed(
        args.host, auth is not None and (auth.api_keys_env or auth.api_keys_file) is not None, bool(ssl_kwargs)
    )
    if args.grpc_port is not None:
        try:
            _probe_grpc_port(args.host, args.grpc_port)
        except OSError as exc:
            print(f"modelserve: error: {exc}", file=sys.stderr)
            return EXIT_ADDRESS

    from modelserve.http._protocol import TransportConfig, TransportLimits

    limits = TransportLimits(args.max_header_size, args.header_timeout, args.body_timeout, args.refusal_pause)
    if args.server == "granian":
        try:
            failures += serve_granian(app, args, limits, ssl_kwargs, log_config)
        except ValueError as exc:
            print(f"modelserve: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        except OSError as exc:
            print(f"modelserve: error: {exc}", file=sys.stderr)
            return EXIT_ADDRESS
        if failures:  # the error itself was logged when it happened
            print("modelserve: error: the project failed to load (see the error above)", file=sys.stderr)
            return EXIT_LOAD
        return EXIT_OK
    config_kwargs: dict[str, Any] = {
        "host": args.host,
        "port": args.port,
        "log_config": log_config,
        "timeout_graceful_shutdown": args.graceful_timeout,
        "server_header": False,
        "access_log": args.access_log,
        **ssl_kwargs,
    }
    if not multiprocess:
        config = TransportConfig(app, limits=limits, **config_kwargs)
        try:
            sock = listen(config)
        except OSError as exc:
            print(f"modelserve: error: {exc}", file=sys.stderr)
            return EXIT_ADDRESS
        from modelserve._serving import ClosingServer, closing_at_shutdown

        closing_at_shutdown(app.server)  # WebSocket sessions get 1001 before uvicorn's 1012
        server = ClosingServer(config)

        def stop(exc: Exception) -> None:
            failures.append(exc)
            server.should_exit = True

        app.state.modelserve.on_load_error = stop
        # uvicorn re-raises the signal that stopped it once it has shut down; with these handlers in place
        # that re-raise is harmless and a clean SIGINT/SIGTERM shutdown exits 0.
        signal.signal(signal.SIGTERM, ignore_signal)
        signal.signal(signal.SIGINT, ignore_signal)
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:
            pass
        except SystemExit as exc:
            return int(exc.code or 0)
        if failures:  # the error itself was logged when it happened
            print("modelserve: error: the project failed to load (see the error above)", file=sys.stderr)
            return EXIT_LOAD
        return EXIT_OK if server.started else EXIT_USAGE

    del app  # the parent only validated the project; the workers serve it
    os.environ[ENV_SETTINGS] = json.dumps(settings)
    # Pickled into the workers, its limits and protocol class (checked here, once) with it.
    config = TransportConfig(
        "modelserve.launch:worker_app", limits=limits, factory=True, workers=args.workers, **config_kwargs
    )
    try:
        sock = listen(config)
    except OSError as exc:
        print(f"modelserve: error: {exc}", file=sys.stderr)
        return EXIT_ADDRESS
    from modelserve._serving import ClosingServer, run_workers

    if args.reload:
        from modelserve._reload import ProjectReload

        config.reload = True
        ProjectReload(
            config, target=ClosingServer(config).run, sockets=[sock], project_dir=settings["project_dir"]
        ).run()
        return EXIT_OK
    supervisor = run_workers(config, [sock])
    if any(process.exitcode == EXIT_LOAD for process in supervisor.processes):
        print("modelserve: error: a worker failed to load the project; see the log above", file=sys.stderr)
        return EXIT_LOAD
    return EXIT_OK


def _probe_grpc_port(host: str, port: int) -> None:
    """`OSError` naming the address when gRPC could not listen on it (a port in use), so that it exits 4 as the
    HTTP port does, before any model loads; gRPC itself binds once the app starts, when a failure is a load
    error. Bound and closed with SO_REUSEADDR, as gRPC binds: a port in TIME_WAIT is free to both."""
    import socket

    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise OSError(f"cannot listen on {shown} (--grpc-port): {exc.strerror or exc}") from None
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
                probe.listen()
            except OSError as exc:
                raise OSError(f"cannot listen on {shown} (--grpc-port): {exc.strerror or exc}") from None


def _container_command(argv: list[str]) -> int:
    """``modelserve dockerfile ...`` and ``modelserve build ...`` (docs/containers.md): exit 2 for a mistake."""
    from modelserve.container import run_command
    from modelserve.errors import ConfigError

    try:
        return run_command(argv)
    except SystemExit as exc:  # argparse: bad usage, or --help
        return int(exc.code or 0)
    except ConfigError as exc:
        print(f"modelserve: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def run() -> None:
    """Entry point of ``python -m modelserve`` and the ``modelserve`` command: `main`, then exit.

    A sync stage cannot be interrupted. When one is still running once the grace period of a shutdown has
    passed, the interpreter would wait for its thread before exiting; the process exits now instead (the
    request it served was already answered or abandoned, and its async job put back in a durable queue).
    """
    import threading

    from modelserve import _threads

    code = main()
    _threads.shutdown()  # the idle worker threads exit; one running user code stays
    deadline = time.monotonic() + 0.5
    stuck = []
    for thread in threading.enumerate():
        if thread is threading.main_thread() or thread.daemon:
            continue
        thread.join(max(deadline - time.monotonic(), 0))
        if thread.is_alive():
            stuck.append(thread)
    if stuck:
        logging.getLogger("modelserve").warning(
            "%d thread(s) still running user code after the shutdown; exiting without waiting for them", len(stuck)
        )
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
