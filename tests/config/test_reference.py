from leap_finetune.validate.reference import render_reference
from tests.conftest import REPO


def test_docs_config_reference_is_generated_from_the_current_schema():
    committed = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    assert committed == render_reference(), "run: python scripts/gen_config_docs.py"


def test_every_example_config_loads(tmp_path):
    from leap_finetune.validate.loader import load_config

    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert len(examples) >= 3
    for path in examples:
        assert path.read_text().startswith("#"), f"{path.name} should start with a comment saying how to run it"
        if "DEFAULT_QLORA" in path.read_text():
            continue  # (needs bitsandbytes, which the suite keeps out of .venv: tests/e2e/test_qlora.py loads it)
        load_config(path)


def test_every_block_of_the_schema_has_its_section_and_allowed_values_are_spelled_out():
    """A block added to the schema (a mapping of its own keys) gets its `## block` table; no type is shown as
    Python (`Literal[...]`, a class path)."""
    import typing

    from pydantic import BaseModel

    from leap_finetune.config.schema import LeapConfigModel

    text = render_reference()
    for name, field in LeapConfigModel.model_fields.items():
        inner = [
            a
            for a in typing.get_args(field.annotation) or (field.annotation,)
            if isinstance(a, type) and issubclass(a, BaseModel)
        ]
        if inner:
            assert f"## `{name}`" in text, name
    assert "Literal" not in text and "leap_finetune.config" not in text
