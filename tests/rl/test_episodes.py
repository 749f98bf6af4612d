"""Multi-turn episodes (rl/episodes.py): the completion of an episode is, token for token, the chat template's rendering
of the conversation (tool turns included), and its mask trains exactly the tokens SFT would train in that conversation:
the model's own turns with their end token, never a tool result or the template's glue.

The turns are scripted here (the tokens a model would sample, as token ids), the tools run in real worker processes,
the templates are LFM2's and LFM2.5's; tests/e2e/test_agents.py runs the same loop with a real model in GRPO."""

from __future__ import annotations

import textwrap

import pytest

from leap_finetune.data.chat_templates import load_chat_template
from leap_finetune.data.render import IGNORE_INDEX, Renderer
from leap_finetune.models.tiny import load_tiny_tokenizer
from leap_finetune.rl.episodes import ANSWERED, BUDGET, MAX_TURNS, ToolTurns, run_episodes
from leap_finetune.rl.tool_specs import ToolSource, load_toolbox
from leap_finetune.rl.tool_workers import ToolWorkers

TOOLS = '''
def multiply(a: int, b: int) -> int:
    """Multiply.

    Args:
        a: A number.
        b: Another.
    """
    return a * b
'''
CALL = "<|tool_call_start|>[multiply(a=12, b=34)]<|tool_call_end|>"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("episode-tools")
    (folder / "tools.py").write_text(textwrap.dedent(TOOLS))
    return ToolSource("functions", str(folder / "tools.py"))


@pytest.fixture(scope="module")
def workers(source):
    pool = ToolWorkers(source, workers=1, timeout=2, memory_mb=64, max_chars=100)
    yield pool
    pool.close()


def _setup(family: str):
    tokenizer = load_tiny_tokenizer("tiny-lfm2" if family == "lfm2" else "tiny-lfm2.5")
    template = load_chat_template(family, tokenizer)
    return tokenizer, Renderer(tokenizer, template, "all", None), Renderer(tokenizer, template, "assistant", None)


def _scripted(tokenizer, turns_per_episode: list[list[str]]):
    """generate(): each running episode's next scripted turn, as the tokens of its text plus the end token."""
    taken = [0] * len(turns_per_episode)
    eos = tokenizer.eos_token_id

    def generate(prompts, max_new):
        out = []
        for ids in prompts:
            episode = next(i for i, p in enumerate(starts) if ids[: len(p)] == p and len(ids) >= len(p))
            text = turns_per_episode[episode][taken[episode]]
            taken[episode] += 1
            out.append((tokenizer(text, add_special_tokens=False)["input_ids"] + [eos])[:max_new])
        return out, [[-0.5] * len(row) for row in out]

    starts: list = []
    return generate, starts


@pytest.mark.parametrize("family", ["lfm2", "lfm2.5"])
def test_an_episode_is_the_templates_rendering_and_trains_only_the_models_turns(family, source, workers):
    tokenizer, renderer, trained = _setup(family)
    schemas = load_toolbox(source, "test").schemas
    prompt = [{"role": "user", "content": "What is 12 * 34?"}]
    prompt_text = renderer.prompt_text(prompt, schemas)
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    generate, starts = _scripted(tokenizer, [[CALL, "408"]])
    starts.append(prompt_ids)
    (episode,) = run_episodes(
        [prompt_ids],
        [{}],
        generate=generate,
        workers=workers,
        schemas=schemas,
        tool_turns=ToolTurns(renderer),
        eos_ids=[tokenizer.eos_token_id],
        max_turns=4,
        budget=200,
    )
    assert episode.ended == ANSWERED and episode.final_answer == "408" and episode.calls == 1
    assert [m["role"] for m in episode.messages] == ["assistant", "tool", "assistant"]
    assert episode.messages[1]["content"] == "408" and episode.messages[1]["ok"]
    conversation = [*prompt, {"role": "assistant", "content": CALL}, {"role": "tool", "content": "408"}]
    conversation.append({"role": "assistant", "content": "408"})
    # the same conversation as an SFT row: its tokens, and the tokens SFT trains (the assistant turns)
    row = trained.tokenize(conversation, schemas, truncate=False)
    full = prompt_ids + episode.completion_ids
    assert row.input_ids[: len(full)] == full
    assert tokenizer.decode(row.input_ids[len(full) :]) == "\n"  # (the template's newline after the last turn)
    sft_mask = [int(label != IGNORE_INDEX) for label in row.labels][len(prompt_ids) : len(full)]
    assert episode.mask == sft_mask and 0 < sum(sft_mask) < len(sft_mask)
    text = tokenizer.decode([t for t, m in zip(episode.completion_ids, episode.mask, strict=True) if not m])
    marker = "<|tool_response_start|>408<|tool_response_end|>" if family == "lfm2" else "tool\n408"
    assert marker in text and "<|im_start|>assistant\n" in text  # (the glue is untrained)
    assert episode.logprobs == [-0.5 if m else 0.0 for m in episode.mask]  # (the glue's are not the model's)


def test_episodes_end_at_max_turns_at_the_budget_and_on_calls_that_do_not_parse(source, workers):
    tokenizer, renderer, _ = _setup("lfm2")
    schemas = load_toolbox(source, "test").schemas
    prompts = []
    for question in ("a", "b", "c", "d"):
        text = renderer.prompt_text([{"role": "user", "content": question}], schemas)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    bad = "<|tool_call_start|>[multiply(a=1, b=]<|tool_call_end|>"
    wrong = '<|tool_call_start|>[multiply(a="x", b=2)]<|tool_call_end|>'
    script = [[CALL, CALL], ["9" * 900], [bad, "0"], [wrong, "8"]]
    generate, starts = _scripted(tokenizer, script)
    starts.extend(prompts)
    episodes = run_episodes(
        prompts,
        [{}] * 4,
        generate=generate,
        workers=workers,
        schemas=schemas,
        tool_turns=ToolTurns(renderer),
        eos_ids=[tokenizer.eos_token_id],
        max_turns=2,
        budget=250,
    )
    calls_twice, too_long, unparsed, bad_arguments = episodes
    assert calls_twice.ended == MAX_TURNS and calls_twice.final_answer == "" and calls_twice.calls == 1
    assert too_long.ended == BUDGET and len(too_long.completion_ids) == 250 and too_long.final_answer == ""
    assert unparsed.parse_failures == 1 and unparsed.calls == 0 and unparsed.final_answer == "0"
    assert unparsed.messages[1]["content"].startswith("error: the tool call") and not unparsed.messages[1]["ok"]
    assert bad_arguments.tool_errors == 1 and "'x' is not of type 'integer'" in bad_arguments.messages[1]["content"]
    assert all(len(e.mask) == len(e.completion_ids) == len(e.logprobs) for e in episodes)


def test_augmented_tools_are_shown_renamed_and_their_calls_run_the_real_tool(source, workers):
    import random

    from leap_finetune.data.tool_disguise import augment, shown_prompt, tool_list_text

    tokenizer, renderer, _ = _setup("lfm2.5")
    schemas = load_toolbox(source, "test").schemas
    rng = random.Random(3)
    views = [augment(schemas, rng) for _ in range(8)]
    assert any(v.schemas[0]["name"] != "multiply" for v in views)  # (renamed in some episodes)
    assert any(set(v.schemas[0]["parameters"]["properties"]) != {"a", "b"} for v in views)
    view = next(v for v in views if v.schemas[0]["name"] != "multiply")
    shown = view.schemas[0]
    assert shown["name"].isidentifier() and sorted(shown["parameters"]["required"]) == sorted(
        shown["parameters"]["properties"]
    )
    prompt = renderer.prompt_text([{"role": "user", "content": "12 * 34?"}], schemas)
    swapped = shown_prompt(prompt, schemas, view)
    assert tool_list_text(view.schemas) in swapped and '"name": "multiply"' not in swapped
    a, b = list(shown["parameters"]["properties"])
    call = f"<|tool_call_start|>[{shown['name']}({a}=12, {b}=34)]<|tool_call_end|>"
    real_name = "<|tool_call_start|>[multiply(a=12, b=34)]<|tool_call_end|>"
    other = shown_prompt(renderer.prompt_text([{"role": "user", "content": "1 * 2?"}], schemas), schemas, view)
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in (swapped, other)]
    generate, starts = _scripted(tokenizer, [[call, "408"], [real_name, "0"]])
    starts.extend(ids)
    good, stale = run_episodes(
        ids,
        [{}, {}],
        generate=generate,
        workers=workers,
        schemas=schemas,
        tool_turns=ToolTurns(renderer),
        eos_ids=[tokenizer.eos_token_id],
        max_turns=3,
        budget=200,
        views=[view, view],
    )
    assert good.messages[1] == {"role": "tool", "name": "multiply", "content": "408", "ok": True}
    assert stale.tool_errors == 1 and "no tool named 'multiply'" in stale.messages[1]["content"]
