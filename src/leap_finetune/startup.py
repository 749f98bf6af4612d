"""Starting a process quickly: the training libraries imported with Python's cyclic garbage collector paused.

Importing torch, transformers, peft, datasets and TRL creates about a million objects, and Python's collector walks
all the older ones at each full collection it triggers on the way: measured on a 2-core machine (Python 3.11), the
imports of an SFT training process take 7.0 s, 4.0 s with the collector paused while they run. Every process that
trains or evaluates pays this (the `leap-finetune` command, each Ray Train worker, the training child of a GPU run,
the evaluation server, each evaluation client of async_eval). Imports create almost no cyclic garbage, so nothing
is lost by pausing; what they created is then frozen (`gc.freeze`: never walked again), and the collector resumes
for the run itself.
"""

from __future__ import annotations

import gc
import importlib
import sys
from contextlib import contextmanager
from types import ModuleType


@contextmanager
def collector_paused():
    """The cyclic collector off inside, the objects made inside frozen after (nested uses pause once)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def import_quickly(name: str) -> ModuleType:
    """`importlib.import_module(name)`, with the collector paused when the module is not loaded yet."""
    module = sys.modules.get(name)
    if module is not None:
        return module
    with collector_paused():
        return importlib.import_module(name)
