"""examples/downstream_service.py: tables served here, the rest of the LM downstream."""

from __future__ import annotations

import asyncio
import hashlib
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc
import grpc.aio
import pytest
import torch

from client import EmbeddingClient
from examples.downstream_service import (
    Prediction,
    RestOfGPT,
    downstream_server,
    main,
    predict,
    train_demo_checkpoint,
)
from service.local import ServerHandle
from tests.tiny_model import MakeCheckpoint, start
from training.model import GPT

TEXT = "The cat walks to the"
IDS = [464, 3797, 11114, 284, 262]  # GPT-2 BPE of TEXT
VOCAB = 50257
C = 32  # train_demo_checkpoint's n_embd


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[Path, GPT, ServerHandle]]:
    """A tied GPT trained 20 steps, exported, its tables served by a real server."""
    repo = tmp_path_factory.mktemp("downstream") / "models"
    version_dir, model = train_demo_checkpoint(repo, name="nano", steps=20)
    handle = start(repo, default_model="nano")
    yield version_dir, model, handle
    handle.stop()


def _whole_model_logits(model: GPT, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([ids]))[0][0, -1, :VOCAB]  # (vocab_size,)


def _ask(rest: RestOfGPT, target: str, text: str) -> Prediction:
    async def scenario() -> Prediction:
        async with downstream_server(rest, target) as ds, \
                grpc.aio.insecure_channel(ds) as channel:
            return await predict(channel, text)

    return asyncio.run(scenario())


def test_first_block_input_is_bit_identical(trained: tuple[Path, GPT, ServerHandle]) -> None:
    _, model, handle = trained
    with EmbeddingClient(handle.target, timeout=30) as c:
        e = c.embed(TEXT, model="nano")  # the default compose: token + position
    assert e.token_ids == IDS
    assert e.array.shape == (len(IDS), C)
    with torch.inference_mode():
        local = model.input_embeddings(torch.tensor([IDS]))[0]  # (T, C)
    assert e.array.tobytes() == local.numpy().tobytes()


def test_downstream_logits_equal_the_whole_model(
        trained: tuple[Path, GPT, ServerHandle]) -> None:
    version_dir, model, handle = trained
    rest = RestOfGPT(version_dir)
    p = _ask(rest, handle.target, TEXT)
    expected = _whole_model_logits(model, IDS)
    assert p.token_ids == IDS
    assert (p.model, p.version) == ("nano", 1)
    assert p.checkpoint_id == hashlib.sha256((version_dir / "manifest.json").read_bytes()
                                             ).hexdigest()
    assert p.logits.shape == (VOCAB,)
    assert p.logits.dtype.str == "<f4"
    # Same input bits, same modules: equal up to fp32 rounding of thread-split reductions.
    assert torch.allclose(torch.from_numpy(p.logits.copy()), expected, rtol=0, atol=1e-5)
    assert p.next_token_id == int(expected.argmax())


def test_rest_of_gpt_holds_no_position_table(trained: tuple[Path, GPT, ServerHandle]) -> None:
    """The tables stay in the embedding service; a tied head is the one token table."""
    version_dir, model, _ = trained
    rest = RestOfGPT(version_dir)
    names = {n for n, _ in rest.named_parameters()}
    assert not any(n.startswith(("wte.", "wpe.")) for n in names)
    assert torch.equal(rest.lm_head.weight, model.wte.weight.detach())


def test_token_only_input_changes_the_logits(trained: tuple[Path, GPT, ServerHandle]) -> None:
    """Negative control: the wrong compose moves the logits far beyond the tolerance."""
    version_dir, model, handle = trained
    with EmbeddingClient(handle.target, timeout=30) as c:
        token_rows = c.embed(TEXT, model="nano", compose="token").array.copy()
    wrong = RestOfGPT(version_dir).next_token_logits(torch.from_numpy(token_rows))
    assert (wrong - _whole_model_logits(model, IDS)).abs().max() > 1e-2


def test_untied_head_from_model_safetensors(tmp_path: Path) -> None:
    version_dir, model = train_demo_checkpoint(tmp_path / "models", name="untied", steps=2,
                                               tie_weights=False)
    rest = RestOfGPT(version_dir)
    assert not torch.equal(rest.lm_head.weight, model.wte.weight.detach())
    with torch.inference_mode():
        x = model.input_embeddings(torch.tensor([IDS]))[0]  # (T, C)
    assert torch.allclose(rest.next_token_logits(x), _whole_model_logits(model, IDS),
                          rtol=0, atol=1e-5)


def test_other_checkpoint_is_failed_precondition(
        trained: tuple[Path, GPT, ServerHandle]) -> None:
    version_dir, _, handle = trained
    rest = RestOfGPT(version_dir)
    rest.checkpoint_id = "0" * 64  # blocks from some other export of "nano" v1
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        _ask(rest, handle.target, TEXT)
    assert exc.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    served = hashlib.sha256((version_dir / "manifest.json").read_bytes()).hexdigest()
    assert exc.value.details() == (f"embedding service serves checkpoint {served[:12]}, "
                                   f"blocks are from 000000000000")


TOO_LONG = ("embedding service: input: start_position (0) + T (40) = 40 exceeds max_seq_len 32 "
            "of model 'nano' (or set truncate)")


@pytest.mark.parametrize(("text", "code", "details"), [
    ("", grpc.StatusCode.INVALID_ARGUMENT, "text: a non-empty string"),
    (" cat" * 40, grpc.StatusCode.INVALID_ARGUMENT, TOO_LONG),  # the embedding service's
])
def test_errors(trained: tuple[Path, GPT, ServerHandle], text: str, code: grpc.StatusCode,
                details: str) -> None:
    version_dir, _, handle = trained
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        _ask(RestOfGPT(version_dir), handle.target, text)
    assert exc.value.code() == code
    assert exc.value.details() == details


def test_main_demo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--text", TEXT]) == 0
    out = capsys.readouterr().out
    assert f"{TEXT!r} -> ids {IDS} (model nano v1, checkpoint " in out
    assert "logits (50257,) float32; top 3: " in out


def test_a_taken_port_is_one_line(trained: tuple[Path, GPT, ServerHandle],
                                  capsys: pytest.CaptureFixture[str]) -> None:
    version_dir, _, handle = trained
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert main(["--checkpoint", str(version_dir), "--target", handle.target,
                     "--port", str(port)]) == 2
    assert capsys.readouterr().err == (
        f"python examples/downstream_service.py: error: --port {port}: port {port} on "
        f"127.0.0.1 is already in use (another server or a previous instance still running); "
        f"stop it or choose another port with --port\n")


def test_a_version_not_from_training_is_one_line(tmp_path: Path,
                                                 make_checkpoint: MakeCheckpoint,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """An imported model (no training config in its provenance): refused in one line."""
    version_dir = make_checkpoint(tmp_path, "imported")
    (version_dir / "model.safetensors").write_bytes(b"")  # passes the option's own check
    assert main(["--checkpoint", str(version_dir), "--target", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith(f"python examples/downstream_service.py: error: {version_dir}")
