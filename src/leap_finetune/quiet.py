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
    datasets.disable_progress_bars()
    # the judge's HTTP client logs every request at INFO (Ray workers show INFO)
    for name in ("httpx", "httpx2"):  # openai 1-2 use httpx, openai 3 httpx2
        logging.getLogger(name).setLevel(logging.WARNING)
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
