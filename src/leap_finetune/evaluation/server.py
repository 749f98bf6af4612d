"""Generation benchmarks against an OpenAI-compatible server (`leap-finetune eval --server URL`): vLLM,
`transformers serve`, llama.cpp's server or a hosted API answer the benchmark prompts through their chat
completions endpoint (the server applies the model's own chat template). Log-prob benchmarks need the
model's token probabilities and always run through transformers.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from leap_finetune.errors import LeapError

FIX = (
    "start the server (e.g. `vllm serve MODEL` or `transformers serve`) and give its base URL, e.g. "
    "http://127.0.0.1:8000/v1"
)


class ServerGenerator:
    """Answers benchmark prompts through the server's /chat/completions, several requests at a time."""

    def __init__(
        self, base_url: str, model: str | None = None, *, api_key_env: str | None = None, timeout_s: float = 600.0
    ):
        try:
            from openai import OpenAI
        except ImportError:
            raise LeapError(
                "--server talks to the server with the `openai` client, which is not installed",
                where="--server",
                fix="pip install 'leap-finetune[serve]' (the openai client and transformers serve)",
            ) from None
        self.base_url = base_url.rstrip("/")
        key = os.environ.get(api_key_env) if api_key_env else os.environ.get("OPENAI_API_KEY")
        self.client = OpenAI(base_url=self.base_url, api_key=key or "not-needed", timeout=timeout_s, max_retries=2)
        self.model = model or self._served_model()

    def _served_model(self) -> str:
        """The server's (first) model, asked before anything is evaluated: a wrong URL fails here, clearly."""
        try:
            models = [m.id for m in self.client.models.list()]
        except Exception as err:  # noqa: BLE001 - connection refused, 404 on a wrong path, auth
            raise LeapError(
                f"the server at {self.base_url} did not list its models ({type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''})",
                where="--server",
                fix=FIX,
            ) from None
        if not models:
            raise LeapError(
                f"the server at {self.base_url} serves no model",
                where="--server",
                fix="load a model on the server, or name it with --server-model",
            )
        return models[0]

    def generate(self, bench_name: str, items, evals) -> list[str]:
        def one(item) -> str:
            options = {"max_tokens": evals.max_new_tokens, "temperature": evals.temperature if evals.do_sample else 0.0}
            if evals.do_sample:
                options["top_p"] = evals.top_p
            try:
                answer = self.client.chat.completions.create(model=self.model, messages=item.prompt, **options)
            except Exception as err:  # noqa: BLE001 - reported with the row it belongs to
                raise LeapError(
                    f"the server at {self.base_url} failed on benchmark '{bench_name}' ({item.file}, "
                    f"{item.location}): {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                    where="--server",
                    fix="look at the server's log; " + FIX,
                ) from None
            return (answer.choices[0].message.content or "").strip()  # as local generation's answers

        with ThreadPoolExecutor(max_workers=max(1, evals.batch_size)) as pool:
            return list(pool.map(one, items))
