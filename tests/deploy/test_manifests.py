"""The Kubernetes manifests of docs/containers.md are valid: each is checked against the
Kubernetes API's models (the ``kubernetes`` package's, strictly: an unknown field is an error, as with
``kubectl apply --validate=strict``), KServe's InferenceService against its CRD's schema (vendored, pruned, in
tests/data/kserve_crd), and what they name (a metric, V2 routes, a V2 request) is checked against a running
server."""

from __future__ import annotations

import copy
import re
from typing import Any

import httpx
import pydantic
import pytest
import yaml

from modelserve import cli, container
from modelserve.config import load_project_config
from tests.conftest import REPO
from tests.test_readme import blocks

kubernetes = pytest.importorskip("kubernetes", reason="the dev extra installs the kubernetes package")
jsonschema = pytest.importorskip("jsonschema", reason="the dev extra installs jsonschema")

PAGE = "containers.md"
#: (apiVersion, kind) -> the kubernetes package's model of that object.
MODELS = {
    ("apps/v1", "Deployment"): "V1Deployment",
    ("v1", "Service"): "V1Service",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2HorizontalPodAutoscaler",
}
#: The fields KServe's v1beta1 PredictorSpec adds to a PodSpec (its ComponentExtensionSpec, and the model
#: formats, which a custom container does not use).
KSERVE_PREDICTOR_FIELDS = {
    "minReplicas", "maxReplicas", "scaleTarget", "scaleMetric", "containerConcurrency", "timeout",
    "canaryTrafficPercent", "labels", "annotations", "logger", "batcher", "deploymentStrategy", "model",
}  # fmt: skip


def manifests(page: str) -> list[dict[str, Any]]:
    """The documents of a docs page's ```yaml blocks that hold a ``kind``."""
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    return [
        document
        for block in blocks(text, "yaml")
        for document in yaml.safe_load_all(block)
        if isinstance(document, dict) and "kind" in document
    ]


def check(document: dict[str, Any], kind: str) -> list[str]:
    """Where `document` is not a valid `kind` (a model of the kubernetes package: ``V1Deployment``,
    ``V1PodSpec``...), one dotted path each. The models check as ``kubectl apply --validate=strict`` does: an
    unknown or misspelt field, a value of the wrong type (``"40"`` for an integer), a missing required field."""
    try:
        getattr(kubernetes.client, kind).model_validate(document)
    except pydantic.ValidationError as error:
        return [".".join(str(part) for part in problem["loc"]) for problem in error.errors()]
    return []


def test_every_manifest_is_a_valid_kubernetes_object() -> None:
    checked = []
    for document in manifests(PAGE):
        key = (document["apiVersion"], document["kind"])
        if key[0].startswith("serving.kserve.io/"):
            continue  # test_the_inference_service_is_a_kserve_custom_predictor
        assert key in MODELS, f"no schema check for {key}"
        assert check(document, MODELS[key]) == [], key[1]
        checked.append(key[1])
    assert sorted(checked) == ["Deployment", "HorizontalPodAutoscaler", "Service"]


def test_the_checker_refuses_a_misspelt_or_mistyped_field() -> None:
    (deployment,) = [doc for doc in manifests(PAGE) if doc["kind"] == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    pod["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/readyz"
    pod["terminationGracePeriodSeconds"] = "40"
    problems = check(deployment, "V1Deployment")
    assert "spec.template.spec.containers.0.readinessProbe.httpGet.paht" in problems
    assert "spec.template.spec.terminationGracePeriodSeconds" in problems
    assert check({"kind": "Service", "spec": {"ports": [{"port": 80}]}}, "V1Service") == []
    assert check({"spec": {"ports": [{"name": "http"}]}}, "V1Service") == ["spec.ports.0.port"]  # required


def strict(schema: Any) -> Any:
    """A CRD's structural schema as ``kubectl apply --validate=strict`` applies it: an object's fields are the
    ones it lists (the API server would drop any other), unless it keeps unknown fields on purpose."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(value) for value in schema]
    return schema


def crd_problems(document: dict[str, Any]) -> list[str]:
    """Where `document` breaks KServe's InferenceService schema, one ``path: reason`` each."""
    text = (REPO / "tests" / "data" / "kserve_crd" / "inferenceservice.schema.yaml").read_text(encoding="utf-8")
    validator = jsonschema.Draft4Validator(strict(yaml.safe_load(text)))  # OpenAPI v3.0 schemas are draft 4's
    return sorted(
        f"{'.'.join(map(str, error.absolute_path))}: {error.validator}" for error in validator.iter_errors(document)
    )


def test_the_inference_service_follows_kserve_s_crd_schema() -> None:
    service = _by_kind(PAGE)["InferenceService"]
    assert crd_problems(service) == []
    wrong = copy.deepcopy(service)
    predictor = wrong["spec"]["predictor"]
    predictor["containerConcurency"] = 101  # misspelt
    predictor["minReplicas"] = "1"  # a string where KServe wants an integer
    predictor["containers"][0]["ports"][0] = {"port": 8080}  # not a container port's field, and it lacks one
    del wrong["spec"]["predictor"]
    wrong["spec"]["predictors"] = predictor
    assert crd_problems({**wrong, "spec": {"predictor": predictor}}) == [
        "spec.predictor.containers.0.ports.0: additionalProperties",
        "spec.predictor.containers.0.ports.0: required",
        "spec.predictor.minReplicas: type",
        "spec.predictor: additionalProperties",  # containerConcurency
    ]
    assert crd_problems(wrong) == ["spec: additionalProperties", "spec: required"]


def _by_kind(page: str) -> dict[str, dict[str, Any]]:
    return {document["kind"]: document for document in manifests(page)}


def test_the_autoscaler_scales_the_deployment_on_a_metric_modelserve_serves(start_server: Any) -> None:
    hpa = _by_kind(PAGE)["HorizontalPodAutoscaler"]["spec"]
    deployment = _by_kind(PAGE)["Deployment"]
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
    assert hpa["scaleTargetRef"] == target
    (metric,) = hpa["metrics"]
    name, labels = metric["pods"]["metric"]["name"], metric["pods"]["metric"]["selector"]["matchLabels"]
    project = REPO / "examples" / "iris"
    (api,) = load_project_config(project).apis
    assert labels == {"api": api.name}
    assert kubernetes.utils.parse_quantity(metric["pods"]["target"]["averageValue"]) < api.max_concurrency

    server = start_server(project)
    server.wait_ready()
    text = httpx.get(server.url + "/metrics").text
    assert re.search(rf'^{name}\{{api="{api.name}"\}} ', text, re.MULTILINE), text  # a gauge per pod, by api


def test_the_inference_service_is_a_kserve_custom_predictor(start_server: Any) -> None:
    service = _by_kind(PAGE)["InferenceService"]
    assert service["apiVersion"] == "serving.kserve.io/v1beta1"
    assert set(service) == {"apiVersion", "kind", "metadata", "spec"} and set(service["spec"]) == {"predictor"}
    assert check(service["metadata"], "V1ObjectMeta") == []
    predictor = service["spec"]["predictor"]
    pod = {key: value for key, value in predictor.items() if key not in KSERVE_PREDICTOR_FIELDS}
    assert check(pod, "V1PodSpec") == []
    (server_container,) = pod["containers"]
    assert server_container["name"] == "kserve-container"  # the container KServe routes to, on port 8080
    args = cli.build_parser().parse_args(["examples/iris-onnx", *server_container["args"]])
    assert args.port == server_container["ports"][0]["containerPort"] == 8080
    assert server_container["securityContext"]["runAsUser"] == container.UID

    project = REPO / "examples" / "iris-onnx"
    (api,) = load_project_config(project).apis
    assert predictor["containerConcurrency"] == api.max_concurrency + api.max_queue_length
    server = start_server(project)
    server.wait_ready()
    for probe in (server_container["readinessProbe"], server_container["livenessProbe"]):
        assert httpx.get(server.url + probe["httpGet"]["path"]).status_code == 200
    text = (REPO / "docs" / PAGE).read_text(encoding="utf-8")
    (request,) = blocks(text, "json")
    path = re.search(r"`http://iris\.[^`]*?(/v2/models/\w+/infer)`", text)
    assert path is not None and path[1] == f"/v2/models/{api.name}/infer"
    answer = httpx.post(server.url + path[1], content=request, headers={"content-type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["model_name"] == api.name
