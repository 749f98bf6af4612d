"""Image rows where the run would otherwise go wrong later: an image in a benchmark's answer turn (refused at
validate), and batch_tokens on image rows (what it does, said with advice that works)."""

from __future__ import annotations

from tests.conftest import invoke, write_config, write_jsonl
from tests.data.test_image_rows import QUESTION, image_row, picture, vl_config


def test_an_image_in_a_benchmark_answer_turn_is_refused_by_validate(workdir):
    """Was accepted, then every evaluation of the run failed with transformers' words."""
    picture(workdir / "ok.png")
    write_jsonl(workdir / "train.jsonl", [image_row("ok.png")] * 2)
    answer_image = {
        "messages": [
            {"role": "user", "content": [QUESTION]},
            {"role": "assistant", "content": [{"type": "image", "image": "ok.png"}, {"type": "text", "text": "red"}]},
        ]
    }
    write_jsonl(workdir / "bench.jsonl", [image_row("ok.png"), answer_image])
    config = {**vl_config(), "evals": {"benchmarks": [{"name": "b", "path": "bench.jsonl", "metric": "exact_match"}]}}
    for command in ("validate", "run"):
        result = invoke(command, str(write_config(workdir, config)), cwd=workdir)
        assert result.returncode == 2, result.stderr
        message = " ".join(result.stderr.split())
        assert "bench.jsonl, line 2" in message and "an image in an assistant turn" in message, message
    assert not (workdir / "outputs").exists()


def test_batch_tokens_on_image_rows_says_what_it_does_and_advice_that_works(workdir):
    """An image row costs its tokens plus 256 per tile (the vision encoder's work): a budget that fits one row per
    micro-batch is said, with a budget that would group them - never `max_length` (a row with images is never cut)."""
    picture(workdir / "ok.png")
    write_jsonl(workdir / "train.jsonl", [image_row("ok.png", answer=f"red {i}") for i in range(8)])
    for budget, words in (
        (512, "batch_tokens 512: every micro-batch holds one row"),
        (200, "8 row(s) cost more than batch_tokens 200"),
    ):
        config = write_config(workdir, vl_config(batch_tokens=budget), f"b{budget}.yaml")
        for command in ("validate", "plan"):
            result = invoke(command, str(config), cwd=workdir)
            said = " ".join((result.stdout + result.stderr).split())
            assert result.returncode == 0 and words in said, (command, said)
            assert "each image tile counted as 256" in said and "raise batch_tokens to >= " in said
            assert "max_length cannot shorten them" in said and "set max_length to cut" not in said
            # (each image is one picture already: fewer tiles cannot shorten the rows, and max_tiles: 1 is refused)
            assert "tiles (" not in said and "max_tiles" not in said, said
    grouped = write_config(workdir, vl_config(batch_tokens=4096), "grouped.yaml")
    assert "every micro-batch holds one row" not in invoke("validate", str(grouped), cwd=workdir).stderr


def test_batch_tokens_advises_fewer_tiles_only_for_images_cut_into_tiles(workdir):
    """A large picture cut into tiles (do_image_splitting): fewer tiles shorten its rows, with min_tiles named (the
    default min_tiles 2 refuses max_tiles: 1 alone)."""
    picture(workdir / "large.png", size=(400, 300))
    write_jsonl(workdir / "train.jsonl", [image_row("large.png", answer=f"red {i}") for i in range(4)])
    config = {
        **vl_config(batch_tokens=2048, max_length=2048),
        "image_processor": {"do_image_splitting": True},
    }
    result = invoke("validate", str(write_config(workdir, config)), cwd=workdir)
    said = " ".join(result.stderr.split())
    assert result.returncode == 0 and "4 row(s) cost more than batch_tokens 2048" in said, said
    assert "or cut images into fewer tiles (a lower image_processor.max_tiles, with min_tiles at most it, or " \
           "do_image_splitting: false)" in said  # fmt: skip
