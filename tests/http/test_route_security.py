"""Every route, method and gRPC method of a project that uses every feature, against API keys with ``auth.apis``,
CORS and the Host check (docs/beyond-loopback.md, docs/grpc.md, docs/websocket.md): one real server, a table
of what each route must ask for, and a check that the table names every route the app registers, so that a
new route cannot be added unchecked."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import modelserve
from modelserve.http.routing import RouteTable
from tests.conftest import free_port, write_project
from tests.http.test_repository import plus_onnx

websockets = pytest.importorskip("websockets")
grpc = pytest.importorskip("grpc")
health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")

pytestmark = pytest.mark.slow

KEY = "route-key-" + "a" * 24
METRICS_KEY = "route-metrics-" + "b" * 20
WRONG = "route-key-" + "c" * 24
ENV = {"ROUTE_SECURITY_KEYS": KEY, "ROUTE_SECURITY_METRICS_KEY": METRICS_KEY}
ORIGIN = "http://app.example"

#: What a route asks of a request: a key, nothing, or the API key or the metrics key.
KEYED, OPEN, METRICS = "key", "open", "metrics"

PROJECT = {
    "modelserve.yaml": """
        apis:
          - name: secret
            truss: config.yaml
          - name: sock
            truss: sock/config.yaml
          - name: open
            handler: {path: open.py, class: Model}
            openai: embeddings
          - name: jobs
            kind: async
            handler: {path: jobs.py, class: Handler}
          - name: openjobs
            kind: async
            handler: {path: jobs.py, class: Open}
          - name: plus
            model: {path: models/plus, version_policy: all}
        auth:
          api_keys_env: ROUTE_SECURITY_KEYS
          metrics_key_env: ROUTE_SECURITY_METRICS_KEY
          apis: [secret, sock, jobs, plus]
        cors:
          allow_origins: ["http://app.example"]
    """,
    "config.yaml": "model_name: secret\n",
    "model/model.py": """
        from pathlib import Path

        CALLS = Path(__file__).resolve().parents[1] / "calls.log"


        class Model:
            def predict(self, inputs):
                with CALLS.open("a") as calls:
                    calls.write("secret.predict\\n")
                return {"ran": True}

            def chat_completions(self, inputs):
                with CALLS.open("a") as calls:
                    calls.write("secret.chat_completions\\n")
                return {"choices": []}
    """,
    "sock/config.yaml": "model_name: sock\n",
    "sock/model/model.py": """
        from pathlib import Path

        CALLS = Path(__file__).resolve().parents[2] / "calls.log"


        class Model:
            async def websocket(self, websocket):
                with CALLS.open("a") as calls:
                    calls.write("sock.websocket\\n")
                await websocket.close()
    """,
    "open.py": """
        class Model:
            def predict(self, inputs):
                return [[0.5]]
    """,
    "jobs.py": """
        import time
        from pathlib import Path

        HERE = Path(__file__).resolve().parent


        class Handler:
            def handle_async(self, payload):
                with (HERE / "calls.log").open("a") as calls:
                    calls.write("jobs.handle_async\\n")
                deadline = time.monotonic() + 30
                while not (HERE / "gate").exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
                return {"done": payload}


        class Open:
            def handle_async(self, payload):
                return payload
    """,
}

#: Every route of the project: (what it asks for, a path that reaches it). An API's ``/<api>/ws`` answers a plain
#: GET with a 400 (it is a WebSocket); the handshakes are checked by `test_every_websocket_handshake`.
ROUTES: dict[str, tuple[str, str]] = {
    "/secret": (KEYED, "/secret"),
    "/sock": (KEYED, "/sock"),
    "/open": (OPEN, "/open"),
    "/plus": (KEYED, "/plus"),
    "/plus/versions/{version}": (KEYED, "/plus/versions/1"),
    "/jobs": (KEYED, "/jobs"),
    "/jobs/{job_id}": (KEYED, "/jobs/some-job"),
    "/openjobs": (OPEN, "/openjobs"),
    "/openjobs/{job_id}": (OPEN, "/openjobs/some-job"),
    "/v1/models": (KEYED, "/v1/models"),
    "/v1/models/{name}": (KEYED, "/v1/models/open"),
    "/v1/chat/completions": (KEYED, "/v1/chat/completions"),
    "/v1/embeddings": (OPEN, "/v1/embeddings"),
    "/v1/models/secret:predict": (KEYED, "/v1/models/secret:predict"),
    "/v1/models/secret:predict_binary": (KEYED, "/v1/models/secret:predict_binary"),
    "/v1/models/sock:predict": (KEYED, "/v1/models/sock:predict"),
    "/v1/models/sock:predict_binary": (KEYED, "/v1/models/sock:predict_binary"),
    "/v1/websocket": (KEYED, "/v1/websocket"),
    "/secret/ws": (KEYED, "/secret/ws"),
    "/sock/ws": (KEYED, "/sock/ws"),
    "/open/ws": (OPEN, "/open/ws"),
    "/plus/ws": (KEYED, "/plus/ws"),
    "/v2": (KEYED, "/v2"),
    "/v2/health/live": (OPEN, "/v2/health/live"),
    "/v2/health/ready": (OPEN, "/v2/health/ready"),
    "/v2/models/stats": (KEYED, "/v2/models/stats"),
    "/v2/models/plus/versions/{tail:path}": (KEYED, "/v2/models/plus/versions/2/infer"),
    "/v2/repository/index": (KEYED, "/v2/repository/index"),
    "/v2/repository/models/{tail:path}": (KEYED, "/v2/repository/models/nothing/load"),
    "/v2/models/{rest:path}": (KEYED, "/v2/models/nothing/infer"),
    "/healthz": (OPEN, "/healthz"),
    "/readyz": (OPEN, "/readyz"),
    "/metrics": (METRICS, "/metrics"),
    "/openapi.json": (KEYED, "/openapi.json"),
    "/openapi/{api}": (KEYED, "/openapi/open.json"),
    "/docs": (KEYED, "/docs"),
    "/docs/{asset}": (KEYED, "/docs/swagger-ui.css"),
}
# V2's routes of each model, with and without /versions/1 (the versioned model's own versions are one route).
for _name, _access in (("secret", KEYED), ("sock", KEYED), ("open", OPEN), ("plus", KEYED)):
    for _base in [f"/v2/models/{_name}", *([] if _name == "plus" else [f"/v2/models/{_name}/versions/1"])]:
        for _tail in ("", "/ready", "/config", "/infer", "/stats"):
            ROUTES[_base + _tail] = (_access, _base + _tail)

#: Paths no route has, or that name a guarded API in a form no route has: each is a 401 without a key, so that
#: a caller without one cannot tell a guarded API from no API.
UNKNOWN = ["/nothing", "/secret/extra/deep", "/v2/models/nothing", "/v1/models/nothing:predict", "/nothing/ws"]

#: A key in a form the server does not take, or no key: each is refused on a guarded route.
NOT_A_KEY: list[tuple[dict[str, str], str]] = [
    ({}, ""),
    ({"authorization": f"Bearer {WRONG}"}, ""),
    ({"x-api-key": WRONG}, ""),
    ({"authorization": KEY}, ""),  # without "Bearer "
    ({"authorization": f"Basic {KEY}"}, ""),
    ({"authorization": f"Token {KEY}"}, ""),
    ({"x-api-key": f"Bearer {KEY}"}, ""),
    ({"api-key": KEY}, ""),
    ({"x-api-key": METRICS_KEY}, ""),  # the metrics key opens /metrics only
    ({}, f"?api_key={KEY}"),  # never in the URL
    ({}, f"?token={KEY}"),
]


def project(root: Path) -> Path:
    write_project(root, PROJECT)
    for number in (1, 2):
        plus_onnx(root / "models" / "plus" / str(number) / "model.onnx", float(number))
    return root


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return project(tmp_path_factory.mktemp("route-security") / "project")


@pytest.fixture(scope="module")
def grpc_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(root: Path, grpc_port: int, start_server_module: Any) -> Any:
    args = ["--jobs-store", "memory", "--grpc-port", str(grpc_port), "--model-control", "explicit"]
    started = start_server_module(root, *args, env=ENV)
    started.wait_ready(timeout=90)
    return started


@pytest.fixture(scope="module")
def table(root: Path) -> Iterator[RouteTable]:
    """The route table the server serves: the same project, built in this process."""
    cwd = os.getcwd()
    with pytest.MonkeyPatch.context() as patch:
        for name, value in ENV.items():
            patch.setenv(name, value)
        patch.delenv("MODELSERVE_URL", raising=False)
        try:
            yield modelserve.create_app(root, jobs_store="memory").table
        finally:
            os.chdir(cwd)


@pytest.fixture(scope="module")
def client(server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as opened:
        yield opened


def calls(root: Path) -> list[str]:
    """What user code has run so far (each handler writes a line)."""
    path = root / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


def assert_no_internals(answer: httpx.Response, root: Path) -> None:
    for leak in ("Traceback", 'File "', str(root), "site-packages", str(Path(modelserve.__file__).parent)):
        assert leak not in answer.text, (answer.request.method, answer.request.url, answer.text)


def test_the_table_names_every_route_the_app_registers(table: RouteTable) -> None:
    assert sorted(route.path for route in table.routes) == sorted(ROUTES)


def test_no_key_a_wrong_key_or_a_key_in_another_form_is_refused_exactly_where_the_docs_say(
    client: httpx.Client, table: RouteTable, root: Path
) -> None:
    before = calls(root)
    for route in table.routes:
        access, path = ROUTES[route.path]
        for method in [*route.allowed, "OPTIONS", "PUT"]:
            for headers, query in NOT_A_KEY:
                answer = client.request(method, path + query, headers=headers, content=b"{}")
                case = (method, path + query, headers, answer.status_code, answer.text)
                opened = access == OPEN or (access == METRICS and headers.get("x-api-key") == METRICS_KEY)
                if opened:
                    assert answer.status_code != 401, case
                else:
                    assert answer.status_code == 401, case
                    assert answer.headers["www-authenticate"] == "Bearer", case
                    if method != "HEAD":
                        assert set(answer.json()) == {"error", "request_id"}, case
                assert_no_internals(answer, root)
    assert calls(root) == before  # no guarded API ran


def test_the_right_key_opens_every_route_in_either_header(client: httpx.Client, table: RouteTable, root: Path) -> None:
    for route in table.routes:
        _, path = ROUTES[route.path]
        for headers in ({"authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}, {"Authorization": f"bearer {KEY}"}):
            for method in ("GET", "HEAD") if "GET" in route.allowed else ("POST",):
                answer = client.request(method, path, headers=headers, content=b"{}")
                assert answer.status_code != 401, (method, path, headers, answer.text)
                assert_no_internals(answer, root)


def test_a_guarded_api_and_no_api_answer_alike_without_a_key(client: httpx.Client) -> None:
    def seen(method: str, path: str) -> tuple[int, str]:
        answer = client.request(method, path)
        return answer.status_code, answer.json()["error"]

    for method in ("GET", "POST", "DELETE", "PUT", "OPTIONS"):
        expected = seen(method, "/nothing")
        assert expected[0] == 401
        for path in [*UNKNOWN, "/secret", "/jobs/some-job", "/v2/models/plus/versions/9", "/v2/models/secret/infer"]:
            assert seen(method, path) == expected, (method, path)
    with_key = client.get("/nothing", headers={"x-api-key": KEY})
    assert with_key.status_code == 404  # the key is what tells them apart


def ws_url(server: Any, path: str) -> str:
    return server.url.replace("http://", "ws://") + path


async def handshake(url: str, **options: Any) -> int:
    """The status of a WebSocket handshake: 101 when accepted, else the status it was refused with."""
    try:
        async with websockets.connect(url, open_timeout=10, **options):
            return 101
    except websockets.exceptions.InvalidStatus as refused:
        return int(refused.response.status_code)


def raw_handshake(port: int, path: str, hosts: list[str]) -> int:
    """The status a WebSocket handshake with these ``Host`` headers (and a key) is answered with (websockets'
    client adds its own Host to the headers it is given)."""
    lines = [f"GET {path} HTTP/1.1", *(f"Host: {host}" for host in hosts), f"X-API-Key: {KEY}"]
    lines += ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="]
    lines += ["Sec-WebSocket-Version: 13"]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection"
            head += chunk
    return int(head.split(b" ", 2)[1])


def test_every_websocket_handshake(server: Any, table: RouteTable, root: Path) -> None:
    ws_routes = [route.path for route in table.routes if route.path.endswith("/ws") or route.path == "/v1/websocket"]
    assert len(ws_routes) == 5
    key = {"x-api-key": KEY}

    async def sweep() -> None:
        for path in [*ws_routes, *UNKNOWN, "/secret", "/healthz"]:
            access = ROUTES[path][0] if path in ROUTES else KEYED
            is_ws = path in ws_routes
            for headers, query in NOT_A_KEY:
                status = await handshake(ws_url(server, path + query), additional_headers=headers)
                expected = (101 if is_ws else 404) if access == OPEN else 401
                assert status == expected, (path + query, headers, status)
            for subprotocol in (f"bearer.{WRONG}", f"token.{KEY}", KEY):
                status = await handshake(ws_url(server, path), subprotocols=[subprotocol])
                assert status == ((101 if is_ws else 404) if access == OPEN else 401), (path, subprotocol)
            # A key in either header or as the subprotocol: the route's own answer, which only then tells a
            # WebSocket route from the rest.
            for options in ({"additional_headers": key}, {"subprotocols": [f"bearer.{KEY}"]}):
                status = await handshake(ws_url(server, path), **options)
                assert status == (101 if is_ws else 404), (path, options, status)
            # The Origin check and the Host check, before anything else.
            status = await handshake(ws_url(server, path), origin="http://evil.example", additional_headers=key)
            assert status == 403, path
            for hosts in (["evil.example"], ["evil.example", "127.0.0.1"], ["127.0.0.1", "evil.example"]):
                assert raw_handshake(server.port, path, hosts) == 400, (path, hosts)

    asyncio.run(sweep())
    assert calls(root).count("sock.websocket") == 2  # the two handshakes with a key to /v1/websocket


def test_the_host_check_covers_every_route_but_the_probes(client: httpx.Client, table: RouteTable) -> None:
    probes = {"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"}
    for route in table.routes:
        _, path = ROUTES[route.path]
        for method in route.allowed:
            answer = client.request(method, path, headers={"host": "evil.example", "x-api-key": KEY})
            if path in probes:
                assert answer.status_code == 200, (method, path)
            else:
                assert answer.status_code == 400, (method, path, answer.text)
    preflight = {"host": "evil.example", "origin": ORIGIN, "access-control-request-method": "POST"}
    assert client.options("/open", headers=preflight).status_code == 400


def job_status(client: httpx.Client, job: str) -> str:
    answer = client.get(f"/jobs/{job}", headers={"x-api-key": KEY})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["status"])


def plus_state(client: httpx.Client) -> list[tuple[str, str, str]]:
    index = client.post("/v2/repository/index", headers={"x-api-key": KEY}).json()
    return sorted((entry["name"], entry["version"], entry["state"]) for entry in index)


def inference_counts(client: httpx.Client) -> list[int]:
    stats = client.get("/v2/models/stats", headers={"x-api-key": KEY}).json()["model_stats"]
    return [entry["inference_stats"]["success"]["count"] for entry in stats]


def test_safe_methods_and_preflights_never_run_submit_cancel_load_or_unload(
    client: httpx.Client, table: RouteTable, root: Path
) -> None:
    submitted = client.post("/jobs", headers={"x-api-key": KEY}, json={"n": 1})
    assert submitted.status_code == 200, submitted.text
    job = submitted.json()["id"]
    deadline = time.monotonic() + 30
    while "jobs.handle_async" not in calls(root):  # running, held until the gate opens
        assert time.monotonic() < deadline
        time.sleep(0.02)
    before = (calls(root), job_status(client, job), plus_state(client), inference_counts(client))
    paths = {route.path: ROUTES[route.path][1].replace("some-job", job) for route in table.routes}
    paths["load"], paths["unload"] = "/v2/repository/models/plus/load", "/v2/repository/models/plus/unload"
    for path in paths.values():
        for method in ("GET", "HEAD", "OPTIONS"):
            for key in ({"x-api-key": KEY}, {}):
                client.request(method, path, headers=key, content=b'{"inputs": [], "n": 2}')
            for request_method in ("POST", "DELETE"):
                preflight = {"origin": ORIGIN, "access-control-request-method": request_method}
                answer = client.request("OPTIONS", path, headers=preflight)
                assert answer.status_code == 204, (path, answer.text)
    for method in ("GET", "DELETE"):  # an open API's job routes reach its own jobs only
        answer = client.request(method, f"/openjobs/{job}")
        assert answer.status_code == 404 and "no job" in answer.json()["error"], answer.text
    assert (calls(root), job_status(client, job), plus_state(client), inference_counts(client)) == before
    (root / "gate").touch()
    deadline = time.monotonic() + 30
    while job_status(client, job) != "completed":  # not cancelled by any of the above
        assert time.monotonic() < deadline
        time.sleep(0.02)


#: gRPC's methods: (what each asks for, with a model's name), for the methods modelserve implements.
GRPC: dict[str, str] = {
    "ServerLive": OPEN,
    "ServerReady": OPEN,
    "ServerMetadata": KEYED,
    "ModelReady": "model",
    "ModelMetadata": "model",
    "ModelConfig": "model",
    "ModelStatistics": "model",
    "ModelInfer": "model",
    "ModelStreamInfer": "model",
    "RepositoryIndex": KEYED,
    "RepositoryModelLoad": KEYED,
    "RepositoryModelUnload": KEYED,
}


def test_every_grpc_method(grpc_port: int, server: Any, root: Path) -> None:
    from modelserve.grpc._proto import grpc_service_pb2 as pb
    from modelserve.grpc.servicer import InferenceServicer

    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    implemented = {method.name for method in service.methods if hasattr(InferenceServicer, method.name)}
    assert implemented == set(GRPC)
    before = calls(root)
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        for method in service.methods:
            if method.name not in GRPC:
                continue
            request_type = getattr(pb, method.input_type.name)
            response_type = getattr(pb, method.output_type.name)
            full = f"/{service.full_name}/{method.name}"
            models = ["secret", "plus", "open", "nothing"] if GRPC[method.name] == "model" else ["plus"]
            for model in models:
                fields = {"model_name": model} if "model_name" in request_type.DESCRIPTOR.fields_by_name else {}
                if "name" in request_type.DESCRIPTOR.fields_by_name:
                    fields = {"name": model}
                request = request_type(**fields)
                opened = GRPC[method.name] == OPEN or (GRPC[method.name] == "model" and model == "open")
                for headers, _ in NOT_A_KEY[:9]:
                    metadata = list(headers.items())
                    if method.client_streaming:
                        call = channel.stream_stream(full, request_type.SerializeToString, response_type.FromString)
                        try:
                            answers = list(call(iter([request]), metadata=metadata, timeout=10))
                            code = grpc.StatusCode.OK if answers and not answers[0].error_message else None
                            refused = any("API key" in answer.error_message for answer in answers)
                            code = grpc.StatusCode.UNAUTHENTICATED if refused else code
                        except grpc.RpcError as error:
                            code = error.code()
                    else:
                        call = channel.unary_unary(full, request_type.SerializeToString, response_type.FromString)
                        try:
                            call(request, metadata=metadata, timeout=10)
                            code = grpc.StatusCode.OK
                        except grpc.RpcError as error:
                            code = error.code()
                            assert "Traceback" not in (error.details() or "")
                    case = (method.name, model, headers, code)
                    if opened:
                        assert code != grpc.StatusCode.UNAUTHENTICATED, case
                    else:
                        assert code == grpc.StatusCode.UNAUTHENTICATED, case
    assert calls(root) == before


@pytest.mark.parametrize("path", ["/readyz", "/v2/health/ready"])
def test_the_probes_name_a_guarded_api_only_to_a_request_with_a_key(client: httpx.Client, path: str) -> None:
    every = {"secret": "ready", "sock": "ready", "open": "ready", "jobs": "ready", "openjobs": "ready", "plus": "ready"}
    if path == "/readyz":
        for headers in ({"x-api-key": KEY}, {"authorization": f"Bearer {KEY}"}):
            assert client.get(path, headers=headers).json()["apis"] == every
    for headers, query in NOT_A_KEY:
        answer = client.get(path + query, headers=headers)
        assert answer.status_code == 200
        assert "secret" not in answer.text and "plus" not in answer.text, (headers, query)
        if path == "/readyz":
            assert answer.json()["apis"] == {"open": "ready", "openjobs": "ready"}


BROKEN = {
    "modelserve.yaml": """
        apis:
          - name: broken
            handler: {path: model.py, class: Broken}
          - name: fine
            handler: {path: model.py, class: Fine}
        auth: {api_keys_env: ROUTE_SECURITY_KEYS, apis: [broken]}
    """,
    "model.py": """
        class Broken:
            def __init__(self):
                raise RuntimeError("cannot load")

            def predict(self, inputs):
                return inputs


        class Fine:
            def predict(self, inputs):
                return inputs
    """,
}


def test_a_failed_guarded_api_is_counted_not_named_without_a_key(tmp_path: Path) -> None:
    write_project(tmp_path, BROKEN)
    cwd = os.getcwd()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ROUTE_SECURITY_KEYS", KEY)
        patch.delenv("MODELSERVE_URL", raising=False)
        try:
            app = modelserve.create_app(tmp_path)
        finally:
            os.chdir(cwd)

    async def probe() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            deadline = time.monotonic() + 30
            keyed = {"x-api-key": KEY}
            while (await client.get("/readyz", headers=keyed)).json()["apis"] != {"broken": "failed", "fine": "ready"}:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.02)
            answer = (await client.get("/readyz", headers=keyed)).json()
            assert answer["error"] == "failed to load: broken"
            answer = (await client.get("/readyz")).json()
            assert (answer["error"], answer["apis"]) == ("failed to load: 1 API", {"fine": "ready"})
            answer = (await client.get("/v2/health/ready", headers=keyed)).json()
            assert (answer["error"], answer["apis"]) == (
                "failed to load: broken",
                {"broken": "failed", "fine": "ready"},
            )
            answer = (await client.get("/v2/health/ready")).json()
            assert (answer["error"], answer["apis"]) == ("failed to load: 1 API", {"fine": "ready"})
        await app.server.close()

    asyncio.run(probe())


def test_the_grpc_health_service_names_a_guarded_model_only_to_a_call_with_a_key(grpc_port: int, server: Any) -> None:
    serving = health_pb2.HealthCheckResponse.SERVING
    path = "/grpc.health.v1.Health/"
    request, answer = health_pb2.HealthCheckRequest, health_pb2.HealthCheckResponse
    with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
        check = channel.unary_unary(path + "Check", request.SerializeToString, answer.FromString)
        watch = channel.unary_stream(path + "Watch", request.SerializeToString, answer.FromString)

        def checked(service: str, metadata: list[tuple[str, str]]) -> Any:
            try:
                return check(request(service=service), metadata=metadata, timeout=10).status
            except grpc.RpcError as error:
                return error.code()

        def watched(service: str, metadata: list[tuple[str, str]]) -> Any:
            call = watch(request(service=service), metadata=metadata, timeout=10)
            try:
                return next(call).status
            except grpc.RpcError as error:
                return error.code()
            finally:
                call.cancel()

        for ask in (checked, watched):
            for service in ("", "inference.GRPCInferenceService", "open"):  # the probes' names and an open model's
                assert ask(service, []) == serving, service
            for headers, _ in NOT_A_KEY[:9]:
                for service in ("secret", "plus", "nothing"):
                    assert ask(service, list(headers.items())) == grpc.StatusCode.UNAUTHENTICATED, (service, headers)
            for service in ("secret", "plus"):
                assert ask(service, [("x-api-key", KEY)]) == serving, service
        assert checked("nothing", [("authorization", f"Bearer {KEY}")]) == grpc.StatusCode.NOT_FOUND


#: A project's lone Truss API also has SageMaker's routes, Truss's ``/v1/models/model`` paths and ``/``.
LONE = {
    "modelserve.yaml": """
        apis:
          - name: lone
            truss: config.yaml
        auth: {api_keys_env: ROUTE_SECURITY_KEYS}
    """,
    "config.yaml": "model_name: lone\n",
    "model/model.py": """
        class Model:
            def predict(self, inputs):
                raise AssertionError("no request in this test reaches the model")
    """,
}
LONE_OPEN = {"/healthz", "/readyz", "/v2/health/live", "/v2/health/ready"}


def test_every_route_of_a_lone_truss_api_needs_a_key(tmp_path: Path) -> None:
    write_project(tmp_path, LONE)
    cwd = os.getcwd()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ROUTE_SECURITY_KEYS", KEY)
        patch.delenv("MODELSERVE_URL", raising=False)
        try:
            app = modelserve.create_app(tmp_path, host="127.0.0.1")
        finally:
            os.chdir(cwd)
    own = {
        "/",
        "/ping",
        "/invocations",
        "/v1/models/model",
        "/v1/models/model:predict",
        "/v1/models/model:predict_binary",
    }
    paths = {route.path for route in app.table.routes}
    assert own <= paths

    async def sweep() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            for route in app.table.routes:
                path = route.path.replace("{", "").replace("}", "").replace(":path", "")
                for method in [*route.allowed, "OPTIONS"]:
                    for headers, query in NOT_A_KEY:
                        answer = await client.request(method, path + query, headers=headers, content=b"{}")
                        case = (method, path + query, headers, answer.status_code)
                        assert (answer.status_code == 401) is (route.path not in LONE_OPEN), case
                    # The Host check (on: the app knows its loopback bind), on every route but the probes.
                    answer = await client.request(method, path, headers={"x-api-key": KEY, "host": "evil.example"})
                    assert (answer.status_code == 400) is (route.path not in LONE_OPEN), (method, path)
        await app.server.close()

    asyncio.run(sweep())
