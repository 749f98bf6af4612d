"""Quieter libraries: our progress bar and reports replace their per-step bars and notices (light to import)."""

from __future__ import annotations

import logging
import os


def quiet_libraries() -> None:
    """Our progress bar and reports replace the libraries' per-step bars and notices."""
    import warnings

    import datasets
    import transformers

    # transformers' own deprecation notices about arguments TRL passes; nothing a user can act on. The
    # test suite sets LEAP_FINETUNE_SHOW_WARNINGS=1 so that CI shows them (a coming change is noticed).
    if not os.environ.get("LEAP_FINETUNE_SHOW_WARNINGS"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
        # bitsandbytes (QLoRA): its 4-bit matrix-vector op sits in the graph where no gradient flows through it (the
        # frozen base); torch warns about every such op once
        warnings.filterwarnings("ignore", message=r"bitsandbytes::\w+: an autograd kernel was not registered")
    quiet_bitsandbytes()
    datasets.disable_progress_bars()
    # the judge's HTTP client logs every request at INFO (Ray workers show INFO)
    for name in ("httpx", "httpx2"):  # openai 1-2 use httpx, openai 3 httpx2
        logging.getLogger(name).setLevel(logging.WARNING)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def quiet_bitsandbytes() -> None:
    """bitsandbytes on a CPU says at import that an optional faster kernel (from the Hub) is missing: nothing to act
    on (called before anything imports it: transformers does when it reads a quantization_config)."""
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
