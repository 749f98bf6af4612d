from leap_finetune.config.reference import render_reference
from tests.conftest import REPO


def test_docs_config_reference_is_generated_from_the_current_schema():
    committed = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    assert committed == render_reference(), "run: python scripts/gen_config_docs.py"


def test_every_example_config_loads(tmp_path):
    from leap_finetune.config.loader import load_config

    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert len(examples) >= 3
    for path in examples:
        assert path.read_text().startswith("#"), f"{path.name} should start with a comment saying how to run it"
        load_config(path)
