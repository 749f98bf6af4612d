"""leap_finetune/startup.py: the training libraries imported with the cyclic collector paused, then frozen."""

from __future__ import annotations

import gc
import subprocess
import sys

from leap_finetune.startup import collector_paused, import_quickly


def test_the_collector_is_paused_inside_and_what_was_made_is_frozen_after():
    assert gc.isenabled()
    before = gc.get_freeze_count()
    with collector_paused():
        assert not gc.isenabled()
        made = [[i] for i in range(1000)]  # (tracked objects: frozen on the way out)
        with collector_paused():  # (nested: the outer pause holds)
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() >= before + len(made)


def test_a_paused_collector_stays_paused_and_an_import_error_leaves_it_running():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # (whoever paused it resumes it)
    finally:
        gc.enable()
    try:
        import_quickly("leap_finetune.no_such_module")
    except ModuleNotFoundError:
        pass
    assert gc.isenabled()


def test_a_recipe_is_imported_with_the_collector_paused_in_a_fresh_process():
    """What a training process does first (recipes.recipe): the recipe and its libraries imported, the collector
    running again after, and the libraries' objects frozen."""
    code = (
        "import gc\n"
        "from leap_finetune.recipes import recipe\n"
        "module = recipe('sft', to_train=True)\n"
        "import sys\n"
        "print(module.__name__, gc.isenabled(), gc.get_freeze_count() > 100000, 'trl.trainer.sft_trainer' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["leap_finetune.recipes.sft", "True", "True", "True"], out
