"""The server's process: the app made from the command's settings, TLS checked, the socket bound, uvicorn run.

`modelserve.cli` reads the command line and turns what goes wrong into exit codes; this module does the
work in between. With ``--workers N`` or ``--reload`` the parent only checks the project and binds the
socket; every worker process makes its own app with `worker_app`, from the settings the parent left in the
environment (`ENV_SETTINGS`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

#: The worker processes of --workers and --reload import the app from this module; the parent passes its
#: settings through this variable.
ENV_SETTINGS = "MODELSERVE_CLI_SETTINGS"
#: The exit code of a worker whose project failed to load (`modelserve.cli.EXIT_LOAD`).
EXIT_LOAD = 3

logger = logging.getLogger("modelserve")


def settings_of(args: argparse.Namespace, base_url: str) -> dict[str, Any]:
    return {
        "project_dir": str(Path(args.project_dir).resolve()),  # already absolute (`path`); links resolved
        "base_url": base_url,
        "jobs_store": args.jobs_store,
        "workers": args.workers,
        "reload": args.reload,
        "graceful_timeout": args.graceful_timeout,
        "host": args.host,
        "api_key_env": args.api_key_env,
        "cors_origins": args.cors_origin,
        "docs": args.docs,
        "grpc_port": args.grpc_port,
        "grpc_tls": [args.ssl_certfile, args.ssl_keyfile] if args.ssl_certfile else None,
        "model_control": args.model_control,
        "load_models": args.load_model,
    }


def make_app(settings: dict[str, Any], on_load_error: Any) -> Any:
    from modelserve.http import create_app

    if settings["workers"] == 1:
        single_process_metrics()
    app = create_app(
        settings["project_dir"],
        base_url=settings["base_url"],
        on_load_error=on_load_error,
        jobs_store=settings["jobs_store"],
        workers=settings["workers"],
        host=settings["host"],
        api_key_env=settings["api_key_env"],
        cors_origins=settings["cors_origins"],
        docs=settings.get("docs", True),
    )
    app.server.graceful_timeout = settings["graceful_timeout"]
    if settings.get("model_control") == "explicit":
        app.server.repository.explicit(settings["load_models"])
    if settings.get("grpc_port"):
        from modelserve.grpc import attach

        certfile, keyfile = settings.get("grpc_tls") or (None, None)
        attach(app.server, settings["host"], settings["grpc_port"], certfile=certfile, keyfile=keyfile)
    app.server.tune_collector_after_load = True  # this process serves this project only
    return app


def single_process_metrics() -> None:
    """Have a server of one process (``--workers 1``, ``--reload``, granian) count its metrics in memory, exact at
    every scrape and with exemplars: a ``PROMETHEUS_MULTIPROC_DIR`` inherited from the environment (an image made
    for gunicorn, say) had it read and add up that folder's files instead, a missing folder failing at start with
    a traceback and an old one's counts added to this server's. ``--workers N`` > 1 makes a folder of its own
    (`modelserve.cli`)."""
    from modelserve.metrics import count_in_memory

    for name, folder in count_in_memory().items():
        logger.warning(
            "%s=%s is left out: a server of one process counts its metrics itself (--workers N > 1 makes a folder "
            "of its own)",
            name,
            folder,
        )


def worker_app() -> Any:
    """App factory of the worker processes (``--workers`` > 1 and ``--reload``)."""
    settings = json.loads(os.environ[ENV_SETTINGS])

    def stop_worker(exc: Exception) -> None:
        if settings["reload"]:
            return  # keep serving 503s with the error; the next saved change restarts the worker
        logging.getLogger("modelserve").critical("worker %d stops (the error is above)", os.getpid())
        logging.shutdown()
        os._exit(EXIT_LOAD)

    from modelserve._serving import closing_at_shutdown

    if not settings["reload"]:
        app = make_app(settings, stop_worker)
    else:
        try:
            app = make_app(settings, stop_worker)
        except Exception as exc:  # a saved mistake: answer 503 naming it until the next change reloads
            from modelserve._reload import failed_app

            return failed_app(exc)
    closing_at_shutdown(app.server)  # its WebSocket sessions get 1001 at the worker's shutdown
    return app


def ssl_settings(args: argparse.Namespace) -> dict[str, Any]:
    """uvicorn's TLS settings from ``--ssl-*``, checked by loading the certificate once (`ValueError` says why).

    The paths are absolute already (`path`). A private key that users other than its owner may read gets a
    warning naming the file and the ``chmod`` that fixes it.
    """
    if args.ssl_certfile is None:
        if args.ssl_keyfile is not None or args.ssl_keyfile_password_env is not None:
            raise ValueError("--ssl-keyfile and --ssl-keyfile-password-env need --ssl-certfile")
        return {}
    for option, file in (("--ssl-certfile", args.ssl_certfile), ("--ssl-keyfile", args.ssl_keyfile)):
        if file is not None and not os.path.isfile(file):
            reason = "is not a file" if os.path.exists(file) else "does not exist"
            raise ValueError(f"{option}: {file} {reason}")
    password = None
    if args.ssl_keyfile_password_env is not None:
        password = os.environ.get(args.ssl_keyfile_password_env)
        if password is None:
            raise ValueError(
                f"--ssl-keyfile-password-env: the environment variable {args.ssl_keyfile_password_env} is not set"
            )
    import ssl

    asked: list[bool] = []

    def no_password() -> str:  # OpenSSL asks for a password only when the key is encrypted
        asked.append(True)
        return ""

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:  # an encrypted key without a password fails here, rather than OpenSSL prompting on the terminal
        context.load_cert_chain(args.ssl_certfile, args.ssl_keyfile, password if password is not None else no_password)
    except (OSError, ssl.SSLError) as exc:
        if asked:
            option, file = (
                ("--ssl-keyfile", args.ssl_keyfile) if args.ssl_keyfile else ("--ssl-certfile", args.ssl_certfile)
            )
            raise ValueError(
                f"{option}: the private key in {file} is encrypted; give its password with --ssl-keyfile-password-env"
            ) from None
        raise ValueError(f"cannot load the TLS certificate {args.ssl_certfile} and its key: {exc}") from None
    warn_readable_key(args.ssl_keyfile or args.ssl_certfile)
    return {"ssl_certfile": args.ssl_certfile, "ssl_keyfile": args.ssl_keyfile, "ssl_keyfile_password": password}


def warn_readable_key(file: str) -> None:
    """Warn when users other than the owner of the private key's file may read it (or write it: mode & 0o077)."""
    import shlex
    import stat

    mode = stat.S_IMODE(os.stat(file).st_mode)
    if mode & 0o077:
        logger.warning(
            "the TLS private key %s is open to users other than its owner (mode %s); restrict it with: chmod 600 %s",
            file,
            oct(mode)[2:].zfill(4),
            shlex.quote(file),
        )


def warn_exposed(host: str, keys: bool, tls: bool) -> None:
    """Say what a bind beyond loopback serves to the network (README: Serving beyond loopback)."""
    from modelserve.http.guard import is_loopback

    if is_loopback(host):
        return
    if not keys:
        logger.warning(
            "serving on %s without API keys: every API, job and /metrics is open to anyone who can reach the port "
            "(see auth: in modelserve.yaml, or --api-key-env)",
            host,
        )
    elif not tls:
        logger.warning("serving on %s over plain HTTP: API keys cross the network in clear text", host)


def ignore_signal(signum: int, frame: Any) -> None:
    return None


def listen(config: Any) -> Any:
    """The server's socket, bound before any model loads; `OSError` names the address when it cannot be."""
    try:
        return config.bind_socket()
    except SystemExit:  # uvicorn logged the OSError and exits; say which address, in our words
        pass
    import socket

    host = f"[{config.host}]" if ":" in config.host else config.host
    try:
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        with socket.socket(family) as probe:
            probe.bind((config.host, config.port))
        reason = "it could not be bound"
    except OSError as exc:
        reason = exc.strerror or str(exc)
    raise OSError(f"cannot listen on {host}:{config.port}: {reason}")


#: The HTTP servers ``--server`` picks from, and the extra each needs beyond modelserve's own (None: none).
SERVERS: dict[str, str | None] = {"uvicorn": None, "granian": "granian"}


def serve_granian(
    app: Any, args: argparse.Namespace, limits: Any, ssl: dict[str, Any], log_config: dict[str, Any]
) -> list[Exception]:
    """Serve `app` (made in this process) with granian until SIGINT or SIGTERM (`modelserve.http._granian`);
    the load errors that stopped it, if any. `ValueError` when granian is missing or cannot hold `limits`
    (checked before anything is bound), `OSError` naming the address when it cannot be listened on."""
    from functools import partial

    from modelserve.http import _granian
    from modelserve.http.websocket import going_away

    missing = _granian.granian_missing()
    if missing is not None:
        raise ValueError(missing)
    if args.workers > 1 or args.reload:
        raise ValueError("--server granian serves one process: --workers and --reload need --server uvicorn")
    _granian.check_limits(limits)
    if ssl.get("ssl_keyfile_password") is not None:
        raise ValueError(
            "--ssl-keyfile-password-env: granian cannot read an encrypted private key; give it the key decrypted "
            "(openssl pkey -in KEY -out PLAIN_KEY, then chmod 600 PLAIN_KEY) or serve with --server uvicorn"
        )
    failures: list[Exception] = []
    stops: list[Any] = []

    def stop(exc: Exception) -> None:
        failures.append(exc)
        if stops:
            stops[0]()

    app.state.modelserve.on_load_error = stop
    host = f"[{args.host}]" if ":" in args.host else args.host
    try:
        _granian.serve(
            app,
            host=args.host,
            port=args.port,
            limits=limits,
            ssl=ssl,
            log_config=log_config,
            graceful_timeout=args.graceful_timeout,
            on_ready=stops.append,
            on_stop=partial(going_away, app.server),  # WebSocket sessions get 1001, then granian stops
        )
    except OSError as exc:
        raise OSError(f"cannot listen on {host}:{args.port}: {exc.strerror or exc}") from None
    return failures
