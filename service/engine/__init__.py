"""The engine: admission, batching and the table lookup, shared by every front.

This package's names below are what the fronts (``service/rpc``) may use: they build a
``Request`` with a ``Reply`` and await ``Engine.embed`` (``tests/test_layout.py`` holds
them to it).
"""

from __future__ import annotations

from service.engine.admission import Admitted, Input, Inputs, Options
from service.engine.budgets import RestHold, RestSlots, Slot, StreamBudgets, StreamTurn
from service.engine.cuda_shm import CudaSharedMemoryRegistry
from service.engine.engine import Engine, Request
from service.engine.loading import LoadedModel
from service.engine.replies import NativeReply, OipReply, RegionOutput
from service.engine.rest_reply import RestAnswer, RestReply

__all__ = ["Admitted", "CudaSharedMemoryRegistry", "Engine", "Input", "Inputs", "LoadedModel",
           "NativeReply", "OipReply", "Options", "RegionOutput", "Request", "RestAnswer",
           "RestHold", "RestReply", "RestSlots", "Slot", "StreamBudgets", "StreamTurn"]
