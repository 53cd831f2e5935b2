"""The family's own transformers code, cut down to what runs before the first block.

``Reference`` builds the text model of a Hugging Face config (``get_text_config()``: the
language model of a multimodal checkpoint, never its other towers) with one layer and no
weight initialisation: parameters are allocated but never written, so a 1 GiB table that
is never touched costs no memory. A traced run (``TaintMode``) then says which parameters
``hidden_states[0]`` and ``get_input_embeddings()(ids)`` are computed from; only those are
read from the checkpoint (their shards opened on demand through the index, safetensors
only), and the probes run with them, in fp32 and in the stored dtype. The layer's own
parameters stay unwritten: what it computes comes after ``hidden_states[0]``.

transformers is imported here and nowhere on the serving path (the ``import`` extra).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from training.importers.source import ImporterError, SafetensorsDir, reason
from training.importers.untrusted import (
    IMPORT_EXTRA,
    SAFE_KWARGS,
    guarded,
    load_transformers,
    refuse_custom_code,
)

__all__ = ["IMPORT_EXTRA", "Probe", "Reference", "TaintMode", "load_transformers"]


@dataclass(frozen=True)
class Probe:
    """One probe: ids, and the first position (None: the model's own default positions)."""

    ids: tuple[int, ...]
    start: int | None

    def label(self) -> str:
        """For messages: which probe."""
        where = "default positions" if self.start is None else f"positions {self.start}.."
        return f"ids {list(self.ids)} at {where}"


class TaintMode(TorchFunctionMode):
    """Records, for every tensor computed under it, the parameters it was computed from.

    Every torch function and Tensor method goes through ``__torch_function__``: the
    outputs (and an in-place op's target) inherit the union of their inputs' parameters.
    Tensors are kept alive while the mode is, so an id is never reused."""

    def __init__(self, params: Mapping[int, str]) -> None:
        super().__init__()
        self.params = params  # id(parameter) -> its name in the model
        self.taint: dict[int, frozenset[str]] = {}
        self._alive: list[torch.Tensor] = []

    def of(self, t: torch.Tensor) -> frozenset[str]:
        """The parameters ``t`` was computed from."""
        name = self.params.get(id(t))
        return self.taint.get(id(t), frozenset()) | ({name} if name else frozenset())

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        sources = frozenset().union(*(self.of(t) for t in inputs)) if inputs else frozenset()
        if sources:
            targets = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            name = getattr(func, "__name__", "")
            if inputs and (name.endswith("_") or name == "__setitem__"):
                targets.append(inputs[0])  # in place: the target now depends on the inputs
            for t in targets:
                self.taint[id(t)] = self.taint.get(id(t), frozenset()) | sources
                self._alive.append(t)
        return out


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def _cut_down(config: Any) -> Any:
    """A copy of the text config with one layer (per-layer lists cut to match); the whole
    config where the family does not let its layer count be set (Funnel's blocks)."""
    cut = config.__class__.from_dict(config.to_dict())
    n = getattr(cut, "num_hidden_layers", None)
    if isinstance(n, int) and n > 1:
        try:
            cut.num_hidden_layers = 1
        except Exception:  # a computed count (Funnel: block_sizes): keep every layer
            return config.__class__.from_dict(config.to_dict())
        for key, value in list(vars(cut).items()):
            if isinstance(value, list) and len(value) == n and key.endswith("layer_types"):
                setattr(cut, key, value[:1])
    return cut


class Reference:
    """The cut-down text model of one checkpoint, in one dtype."""

    def __init__(self, src: SafetensorsDir, dtype: torch.dtype) -> None:
        refuse_custom_code(src.dir)  # before transformers reads any file of it
        with guarded() as tf:
            from transformers.initialization import no_init_weights

            try:
                config = tf.AutoConfig.from_pretrained(str(src.dir), **SAFE_KWARGS)
            except (ValueError, KeyError, OSError) as e:
                if "trust_remote_code" in str(e):  # transformers found code it would run
                    raise ImporterError(f"{src.dir / 'config.json'}: names code of its own: "
                                        f"refused; files in a model directory are data and "
                                        f"are never run") from None
                raise ImporterError(f"{src.dir / 'config.json'}: transformers "
                                    f"{tf.__version__} cannot read it ({reason(e)})") from None
            self.full_config = config
            self.text_config = config.get_text_config(decoder=True)
            self.dtype = dtype
            cut = _cut_down(self.text_config)
            try:
                with no_init_weights(), _default_dtype(dtype):
                    self.model = tf.AutoModel.from_config(
                        cut, dtype=dtype, trust_remote_code=False).eval()
            except ImporterError:
                raise
            except Exception as e:  # transformers raises many types for configs it rejects
                raise ImporterError(f"{src.dir / 'config.json'}: transformers cannot build "
                                    f"the text model of model_type "
                                    f"{self.text_config.model_type!r} ({reason(e)})") from None
        self.model.requires_grad_(False)
        self.names = {id(p): n for n, p in self.model.named_parameters()}
        self._forward = inspect.signature(self.model.forward).parameters
        self.takes_positions = "position_ids" in self._forward

    def parameter(self, name: str) -> torch.nn.Parameter:
        """The model's parameter of that name."""
        return self.model.get_parameter(name)

    def token_table_name(self) -> str:
        """The name of ``get_input_embeddings().weight``."""
        try:
            weight = self.model.get_input_embeddings().weight
            return self.names[id(weight)]
        except Exception as e:  # no input embeddings, or not a parameter of the model
            raise ImporterError(f"{type(self.model).__name__}.get_input_embeddings() is not "
                                f"a table of the model's parameters ({reason(e)})") from None

    def set(self, name: str, value: torch.Tensor, rows: Sequence[int] | None = None) -> None:
        """Write a checkpoint tensor into the parameter (``rows``: only those rows, the
        rest left unwritten, for an fp32 copy of a large table)."""
        p = self.parameter(name)
        if tuple(p.shape) != tuple(value.shape):
            raise ImporterError(f"{name}: checkpoint shape {tuple(value.shape)}, the model "
                                f"built from config.json has {tuple(p.shape)}")
        if rows is None:
            p.data = value.to(self.dtype)  # no copy when the dtype already matches
        else:
            index = torch.tensor(sorted(set(rows)))
            p.data[index] = value[index].to(self.dtype)

    def _kwargs(self, probe: Probe) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"output_hidden_states": True}
        if "use_cache" in self._forward:
            kwargs["use_cache"] = False
        if probe.start is not None:
            kwargs["position_ids"] = torch.arange(probe.start,
                                                  probe.start + len(probe.ids))[None]  # (1, T)
        return kwargs

    def run(self, probe: Probe) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden_states[0], get_input_embeddings()(ids)) for one probe: (T, C), (T, dim)."""
        ids = torch.tensor([probe.ids])  # (1, T)
        with torch.no_grad():
            hidden = self.model(input_ids=ids, **self._kwargs(probe)).hidden_states[0]
            token = self.model.get_input_embeddings()(ids)  # (1, T, dim)
        return hidden[0], token[0]  # (T, C), (T, dim)

    def sources(self, probe: Probe) -> tuple[frozenset[str], frozenset[str]]:
        """The parameters hidden_states[0] and get_input_embeddings()(ids) are computed
        from (values are irrelevant here: the parameters may still be unwritten)."""
        taint = TaintMode(self.names)
        ids = torch.tensor([probe.ids])  # (1, T)
        with torch.no_grad(), taint:
            out = self.model(input_ids=ids, **self._kwargs(probe))
            token = self.model.get_input_embeddings()(ids)
        return taint.of(out.hidden_states[0]), taint.of(token)
