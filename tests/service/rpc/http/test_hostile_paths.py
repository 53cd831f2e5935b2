"""Model names a client can put in a REST path that no file system or JSON writer likes:
percent-encoded invalid UTF-8, an encoded surrogate, NUL, dots, a slash, 4,000 bytes. Each
gets its exact JSON 4xx, with the name quoted (cut to 64 characters) and no server path,
and the server keeps serving."""

from __future__ import annotations

import pytest

from service.local import ServerHandle
from tests.service.rpc.http.conftest import infer_body, request

# (in the path, as the error quotes it): yarl decodes what is valid UTF-8 and keeps the rest
NAMES = [("%FF", "'%FF'"), ("%ED%A0%80", "'%ED%A0%80'"), ("%00", "'\\\\x00'"),
         ("..", "'..'"), ("%2E%2E", "'..'"), ("tiny%00", "'tiny\\\\x00'"),
         ("x" * 4000, "'" + "x" * 64 + "'... (4000 characters)")]


@pytest.mark.parametrize(("name", "quoted"), NAMES)
@pytest.mark.parametrize("route", ["", "/infer", "/tokenize"])
def test_hostile_model_names_are_not_found(server: ServerHandle, name: str, quoted: str,
                                           route: str) -> None:
    method = "GET" if route == "" else "POST"
    body = infer_body([[1, 2]]) if method == "POST" else None
    reply = request(server.http_port, method, f"/v2/models/{name}{route}", body)
    assert reply.status == 404
    assert reply.body.decode() == ('{"error": "model ' + quoted
                                   + ' is not loaded (loaded: rope, tiny)"}')
    assert request(server.http_port, "GET", "/v2/health/ready").json() == {"ready": True}


@pytest.mark.parametrize(("name", "quoted"), NAMES)
def test_hostile_model_names_are_not_ready(server: ServerHandle, name: str,
                                           quoted: str) -> None:
    reply = request(server.http_port, "GET", f"/v2/models/{name}/ready")
    assert reply.status == 400  # the protocol's "4xx is false"
    assert reply.json()["ready"] is False


@pytest.mark.parametrize("route", ["", "/ready", "/infer"])
def test_an_encoded_slash_is_a_path_separator_not_a_name(server: ServerHandle,
                                                         route: str) -> None:
    method = "POST" if route == "/infer" else "GET"
    reply = request(server.http_port, method, f"/v2/models/a%2Fb{route}",
                    infer_body([[1]]) if method == "POST" else None)
    assert (reply.status, reply.json()) == (404, {
        "error": f"no endpoint /v2/models/a/b{route}; see GET /v2 and /v2/models/<model>"})
