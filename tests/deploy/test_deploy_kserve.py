"""The KServe recipe (deploy/kserve): it renders, its objects pass a closed schema check, and
its parts agree with each other and with the service's own flags and OIP contract.

Schema: deploy/kserve/validate_kserve.py, run by the tools interpreter, against the field
tables of the KServe Python SDK's generated models (PyPI ``kserve``, extracted into .tools/
by scripts/install_k8s_tools.sh) and kubernetes-validate's strict schemas for the Kubernetes
types inside them (containers, metadata). Negative controls show each layer rejects a
misspelt field. Not checked anywhere here: enum values (KServe's CRDs carry few; the SDK
carries none), CEL rules, KServe's admission webhooks, and anything that needs a cluster.
"""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any, NoReturn

import pytest
import yaml
from google.protobuf import json_format

from genproto.embedding.v1 import embedding_pb2 as pb
from genproto.inference.v2 import grpc_service_pb2 as oip
from service.config import parse_config
from service.rpc.oip_tensors import read_input, request_parameters
from tests.deploy.conftest import DEPLOY, REPO, TOOLS_BIN

KSERVE = DEPLOY / "kserve"
KSERVE_VERSION = "0.21.0"  # scripts/install_k8s_tools.sh's kserve_version
MODELS_DIR = REPO / ".tools" / f"kserve-{KSERVE_VERSION}" / "kserve" / "models"
# The same Kubernetes version test_deploy_k8s_validate.py validates the overlays against.
K8S_VERSION = "1.30.0"
INTEROP = REPO / "docs" / "interop.md"


def _missing(reason: str) -> NoReturn:
    """Fail: a run must never pass by skipping the schema check (make test installs it)."""
    pytest.fail(reason)


@pytest.fixture(scope="module")
def rendered_kserve(kubectl: str) -> str:
    """``kubectl kustomize deploy/kserve``."""
    proc = subprocess.run([kubectl, "kustomize", str(KSERVE)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def objects(rendered_kserve: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The recipe's objects as {(kind, name): object}."""
    docs = [d for d in yaml.safe_load_all(rendered_kserve) if d]
    by_key = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    assert len(by_key) == len(docs), "duplicate kind/name"
    return by_key


@pytest.fixture(scope="module")
def validate(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """validate(objects) -> {kind/name: [errors]}, through validate_kserve.py."""
    python = TOOLS_BIN / "python"
    schemas = sorted((REPO / ".tools" / "venv" / "lib").glob(
        f"python3*/site-packages/kubernetes_validate/kubernetes-json-schema/"
        f"v{K8S_VERSION}-local-strict"))
    if not (python.exists() and MODELS_DIR.is_dir() and schemas):
        _missing("KServe SDK models or kubernetes-validate schemas not found: "
                 "run scripts/install_k8s_tools.sh")
    out_dir = tmp_path_factory.mktemp("kserve")

    def run(objs: list[dict[str, Any]]) -> dict[str, list[str]]:
        path = out_dir / "objects.yaml"
        path.write_text(yaml.safe_dump_all(objs))
        proc = subprocess.run([str(python), str(KSERVE / "validate_kserve.py"), str(MODELS_DIR),
                               str(schemas[0]), str(path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode in (0, 1), proc.stderr
        result: dict[str, list[str]] = json.loads(proc.stdout)
        assert proc.returncode == (1 if any(result.values()) else 0)
        return result

    return run


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(obj))
    return out


def _runtime_container(objects: dict[tuple[str, str], dict[str, Any]],
                       name: str = "embedding-service-grpc") -> dict[str, Any]:
    (container,) = objects[("ServingRuntime", name)]["spec"]["containers"]
    return container


def test_recipe_renders_exactly_its_five_objects(
        objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    assert sorted(objects) == [("InferenceGraph", "embedding-pipeline"),
                               ("InferenceService", "embedding-service"),
                               ("InferenceService", "embedding-service-http"),
                               ("ServingRuntime", "embedding-service-grpc"),
                               ("ServingRuntime", "embedding-service-http")]
    assert {o["apiVersion"] for o in objects.values()} == {"serving.kserve.io/v1beta1",
                                                           "serving.kserve.io/v1alpha1"}


def test_every_object_passes_the_closed_schema(
        objects: dict[tuple[str, str], dict[str, Any]], validate: Any) -> None:
    assert validate(list(objects.values())) == {
        "InferenceGraph/embedding-pipeline": [],
        "InferenceService/embedding-service": [],
        "InferenceService/embedding-service-http": [],
        "ServingRuntime/embedding-service-grpc": [],
        "ServingRuntime/embedding-service-http": []}


@pytest.mark.parametrize(("kind", "name", "mutate", "errors"), [
    # Misspelt KServe fields: closed by the SDK models' attribute maps.
    ("InferenceService", "embedding-service",
     lambda o: o["spec"]["predictor"]["model"].update(storageURI="pvc://x/"),
     [".spec.predictor.model: unknown field 'storageURI'"]),
    ("InferenceGraph", "embedding-pipeline",
     lambda o: o["spec"]["nodes"]["root"]["steps"][1].update(servicename="x"),
     [".spec.nodes.root.steps[1]: unknown field 'servicename'"]),
    ("ServingRuntime", "embedding-service-grpc",
     lambda o: o["spec"].update(protocolVersion=["grpc-v2"]),
     [".spec: unknown field 'protocolVersion'"]),
    # A required field and a wrong type.
    ("InferenceGraph", "embedding-pipeline",
     lambda o: o["spec"]["nodes"]["root"].pop("routerType"),
     [".spec.nodes.root: missing required field 'routerType'"]),
    ("ServingRuntime", "embedding-service-grpc",
     lambda o: o["spec"]["supportedModelFormats"][0].update(autoSelect="true"),
     [".spec.supportedModelFormats[0].autoSelect: expected bool, got 'true'"]),
    # Kubernetes types inside KServe objects: kubernetes-validate's strict schemas.
    ("ServingRuntime", "embedding-service-grpc",
     lambda o: o["spec"]["containers"][0]["ports"][0].update(containerport=8081),
     [".spec.containers[0].ports[0]: Additional properties are not allowed "
      "('containerport' was unexpected)"]),
    ("ServingRuntime", "embedding-service-grpc",
     lambda o: o["spec"]["containers"][0]["ports"][0].update(containerPort="8081"),
     [".spec.containers[0].ports[0].containerPort: '8081' is not of type 'integer'"]),
    ("InferenceService", "embedding-service",
     lambda o: o["metadata"].update(label={"a": "b"}),
     [".metadata: Additional properties are not allowed ('label' was unexpected)"]),
    ("InferenceService", "embedding-service",
     lambda o: o.update(apiVersion="serving.kserve.io/v1alpha1"),
     ["apiVersion: expected 'serving.kserve.io/v1beta1', got 'serving.kserve.io/v1alpha1'"]),
])
def test_validator_rejects_a_broken_object(
        objects: dict[tuple[str, str], dict[str, Any]], validate: Any, kind: str, name: str,
        mutate: Any, errors: list[str]) -> None:
    """Negative controls: each layer of the check really fails, at the field that is wrong."""
    obj = _copy(objects[(kind, name)])
    mutate(obj)
    assert validate([obj]) == {f"{kind}/{name}": errors}


def test_a_kind_without_a_schema_is_an_error(validate: Any) -> None:
    assert validate([{"apiVersion": "serving.kserve.io/v1alpha1", "kind": "TrainedModel",
                      "metadata": {"name": "x"}, "spec": {}}]) == {
        "TrainedModel/x": ["no schema for kind 'TrainedModel'"]}


def test_container_args_are_the_services_flags_and_match_the_h2c_port(
        objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    """The args parse with the server's own parser; the h2c port is the --grpc-port."""
    container = _runtime_container(objects)
    # KServe mounts storageUri only into the container of this name.
    assert container["name"] == "kserve-container"
    config = parse_config(container["args"], environ={})
    assert config.grpc_port == 8081
    assert str(config.model_repository) == "/mnt/models"  # KServe's model mount path
    assert config.host == "0.0.0.0"
    assert config.default_model == "gpt2"
    assert container["ports"] == [{"name": "h2c", "containerPort": config.grpc_port,
                                   "protocol": "TCP"}]


def test_http_runtime_args_match_its_http1_port(
        objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    """The REST runtime: the same flags, and Knative's routed "http1" port is --http-port."""
    container = _runtime_container(objects, "embedding-service-http")
    assert container["name"] == "kserve-container"
    config = parse_config(container["args"], environ={})
    assert (config.http_port, config.grpc_port) == (8080, 8081)
    assert str(config.model_repository) == "/mnt/models"
    assert (config.host, config.default_model) == ("0.0.0.0", "gpt2")
    assert container["ports"] == [{"name": "http1", "containerPort": config.http_port,
                                   "protocol": "TCP"}]
    grpc_container = _runtime_container(objects)
    assert {k: v for k, v in container.items() if k not in ("args", "ports")} == {
        k: v for k, v in grpc_container.items() if k not in ("args", "ports")}


def test_inference_services_use_their_runtimes_over_grpc_v2_and_v2(
        objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    runtime = objects[("ServingRuntime", "embedding-service-grpc")]["spec"]
    model = objects[("InferenceService", "embedding-service")]["spec"]["predictor"]["model"]
    assert model["runtime"] == "embedding-service-grpc"
    assert model["protocolVersion"] == "grpc-v2"
    assert runtime["protocolVersions"] == ["grpc-v2"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["supportedModelFormats"]}
    # The claim deploy/k8s/base/pvc.yaml creates (and the training job writes to).
    pvc = yaml.safe_load((DEPLOY / "k8s" / "base" / "pvc.yaml").read_text())
    assert model["storageUri"] == f"pvc://{pvc['metadata']['name']}/"
    http_runtime = objects[("ServingRuntime", "embedding-service-http")]["spec"]
    http_model = objects[("InferenceService", "embedding-service-http")]["spec"]["predictor"][
        "model"]
    assert (http_model["runtime"], http_model["protocolVersion"]) == (
        "embedding-service-http", "v2")
    assert http_runtime["protocolVersions"] == ["v2"]
    assert http_model["storageUri"] == model["storageUri"]
    # Only one runtime is picked automatically for the model format.
    assert [f["autoSelect"] for f in runtime["supportedModelFormats"]
            + http_runtime["supportedModelFormats"]] == [True, False]


def test_graph_is_a_sequence_from_the_embedding_service_to_the_placeholder(
        objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    nodes = objects[("InferenceGraph", "embedding-pipeline")]["spec"]["nodes"]
    assert list(nodes) == ["root"]
    assert nodes["root"]["routerType"] == "Sequence"
    assert nodes["root"]["steps"] == [
        {"name": "embed", "serviceName": "embedding-service-http", "dependency": "Hard"},
        {"name": "transform", "serviceName": "my-downstream-transformer", "data": "$response",
         "dependency": "Hard"}]
    # Step 1 names the REST InferenceService of this recipe (the router speaks HTTP only);
    # step 2 is the user's own, and the recipe must not pretend to provide it.
    isvc = objects[("InferenceService", "embedding-service-http")]
    assert isvc["spec"]["predictor"]["model"]["protocolVersion"] == "v2"
    assert ("InferenceService", "my-downstream-transformer") not in objects


def _kserve_section() -> str:
    text = INTEROP.read_text()
    section = text.split("## KServe InferenceGraph", 1)[1]
    return section.split("\n## ", 1)[0]


def test_documented_grpc_request_is_accepted_by_the_oip_face() -> None:
    """The ModelInfer body in docs/interop.md parses into exactly the documented request."""
    blocks = re.findall(r"```json grpc\n(.*?)```", _kserve_section(), re.S)
    assert len(blocks) == 1
    request = json_format.ParseDict(json.loads(blocks[0]), oip.ModelInferRequest())
    assert request.model_name == "gpt2"
    assert request_parameters(request) == {
        "start_position": 7, "compose": pb.COMPOSE_TOKEN_ONLY, "truncate": pb.TRUNCATE_NONE,
        "allow_special_tokens": False, "add_special_tokens": None, "datatype": "FP32"}
    (seq,) = read_input(request, 7)
    assert [int(i) for i in seq.ids] == [464, 3797, 11114, 284, 262]
    assert seq.start_position == 7


def test_documented_rest_body_is_the_same_request() -> None:
    """The REST-shaped body in the doc says the same as the gRPC one (ids and parameters)."""
    blocks = re.findall(r"```json\n(.*?)```", _kserve_section(), re.S)
    assert len(blocks) == 1
    body = json.loads(blocks[0])
    assert body == {
        "inputs": [{"name": "input_ids", "shape": [1, 5], "datatype": "INT64",
                    "data": [464, 3797, 11114, 284, 262]}],
        "parameters": {"compose": "token_only", "start_position": 7, "datatype": "FP32"}}
