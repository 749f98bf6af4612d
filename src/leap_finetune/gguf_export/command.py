"""`leap-finetune export`'s choice between a folder export and the GGUF ones, and the GGUF options' checks."""

from __future__ import annotations

from pathlib import Path

from leap_finetune.errors import LeapError


def export_command(model: str, merge: bool, output, gguf: list[str] | None, options: dict) -> None:
    """`options`: llama_cpp, no_verify, no_speed, adapter, checkpoints, max_drop, max_kl (each goes with --gguf)."""
    if gguf:
        kwargs = {
            "output": output,
            "llama_cpp": options["llama_cpp"],
            "verify": not options["no_verify"],
            "max_drop": options["max_drop"],
            "max_kl": options["max_kl"],
            "speed": not options["no_speed"],
        }
        if options["checkpoints"]:
            if options["adapter"]:
                raise LeapError(
                    "--checkpoints and --gguf-adapter together are not offered",
                    where="export",
                    fix="export the checkpoints merged (--checkpoints), or one adapter (--gguf-adapter)",
                )
            from rich.console import Console

            from leap_finetune.gguf_export.checkpoints import export_all

            kwargs.pop("output")
            export_all(Path(model), gguf, output, Console(stderr=True), **kwargs)
            return
        from leap_finetune.gguf_export.export import export_gguf

        export_gguf(model, gguf, adapter=options["adapter"], **kwargs)
        return
    given = [name for name in ("llama_cpp", "max_drop", "max_kl") if options[name] is not None]
    given += [name for name in ("no_verify", "no_speed", "adapter", "checkpoints") if options[name]]
    if given:
        raise LeapError(
            "--llama-cpp, --no-verify, --no-speed, --gguf-adapter, --checkpoints, --max-drop and --max-kl go with "
            "--gguf",
            where="export",
            fix="add --gguf TYPE, e.g. --gguf q4_k_m (or --gguf auto)",
        )
    from leap_finetune.export import export_model

    export_model(model, merge=merge, output=output)
