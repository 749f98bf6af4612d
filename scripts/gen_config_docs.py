"""Regenerate docs/config.md and the config's JSON schema (shipped in the package, for editors) from the
schema; tests/config/test_reference.py checks both are current."""

from pathlib import Path

from leap_finetune.config.starters import schema_path, schema_text
from leap_finetune.validate.reference import render_reference

path = Path(__file__).resolve().parents[1] / "docs" / "config.md"
path.write_text(render_reference(), encoding="utf-8")
print(f"wrote {path}")
schema_path().write_text(schema_text(), encoding="utf-8")
print(f"wrote {schema_path()}")
