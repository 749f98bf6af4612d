"""Regenerate docs/config.md from the schema (tests/config/test_reference.py checks it is current)."""

from pathlib import Path

from leap_finetune.config.reference import render_reference

path = Path(__file__).resolve().parents[1] / "docs" / "config.md"
path.write_text(render_reference(), encoding="utf-8")
print(f"wrote {path}")
