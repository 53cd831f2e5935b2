"""The GPT-2 tokenizer built from the local ranks file (never downloaded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.format.tokenizer import gpt2_spec, load_ranks, load_tokenizer


@pytest.fixture(scope="module")
def tokenizer(gpt2_ranks: Path):  # type: ignore[no-untyped-def]
    return load_tokenizer(gpt2_spec(), gpt2_ranks)


@pytest.mark.parametrize(("text", "ids"), [
    ("hello world", [31373, 995]),
    ("Hello, world!", [15496, 11, 995, 0]),
    (" the", [262]),
    ("hello <|endoftext|>", [31373, 1279, 91, 437, 1659, 5239, 91, 29]),
])
def test_known_ids(tokenizer, text: str, ids: list[int]) -> None:  # type: ignore[no-untyped-def]
    assert tokenizer.encode(text) == ids
    assert tokenizer.decode(ids) == text


def test_special_token_only_when_allowed(tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert tokenizer.encode("<|endoftext|>", allow_special_tokens=True) == [50256]
    assert tokenizer.encode("<|endoftext|>") == [27, 91, 437, 1659, 5239, 91, 29]
    assert tokenizer.n_vocab == 50257


def test_token_bytes_and_partial_utf8(tokenizer) -> None:  # type: ignore[no-untyped-def]
    assert tokenizer.token_bytes([31373, 995]) == [b"hello", b" world"]
    ids = tokenizer.encode("é")
    assert b"".join(tokenizer.token_bytes(ids)) == "é".encode()
    assert tokenizer.decode([ids[0]]) in ("é", "\ufffd")


def test_ranks_file_checked(tmp_path: Path, gpt2_ranks: Path) -> None:
    assert len(load_ranks(gpt2_ranks)) == 50256
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(gpt2_ranks.read_bytes()[:-10] + b"AAAA 1\n")
    with pytest.raises(ValueError, match="sha256 does not match"):
        load_tokenizer(gpt2_spec(), bad)
    (tmp_path / "junk.tiktoken").write_bytes(b"not base64!! x\n")
    with pytest.raises(ValueError, match=r"junk\.tiktoken:1"):
        load_ranks(tmp_path / "junk.tiktoken")
