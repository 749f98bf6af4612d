"""Tools shown under other names, so that the model learns to read a tool list rather than memorise one (a model
shipped to an app meets tool lists it was never trained on): new names, some arguments renamed, another order,
reworded descriptions.

- `environment.augment_tools` (GRPO episodes): each training episode is shown a disguise; the calls it makes are
  mapped back to the real tools before anything runs; evaluation episodes see the real list. The prompt was rendered
  once by the driver with the real definitions; an episode's prompt is that text with the tool list replaced (the
  chat template writes each definition as its JSON, joined by ", " - checked at the run's start).
- `dataset.augment_tools` (SFT rows): a training row's definitions and every call of its assistant turns are
  written with the disguise's names (`disguise_conversation`); evaluation rows keep the real ones.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, replace

from leap_finetune.data import tool_calls as tc
from leap_finetune.data.sft_rows import Conversation
from leap_finetune.data.tool_use import TOOL_LIST_HINT

PREFIXES = ("", "get_", "do_", "run_", "call_", "use_")
SUFFIXES = ("", "_tool", "_fn", "_api", "_v2")
ARGUMENT_SUFFIXES = ("_value", "_input", "_arg")
OPENINGS = ("", "Use this to ", "This tool will ", "Call it to ")


@dataclass
class ToolView:
    """The tools as one episode sees them, and how its calls map back to the real ones."""

    schemas: list[dict]
    names: dict[str, str]  # shown name -> real name
    arguments: dict[str, dict[str, str]]  # real name -> {shown argument -> real argument}

    def real_call(self, name: str, arguments: dict) -> tuple[str, dict]:
        real = self.names.get(name, name)
        renamed = self.arguments.get(real, {})
        return real, {renamed.get(k, k): v for k, v in arguments.items()}


def identity(schemas: list[dict]) -> ToolView:
    return ToolView(schemas, {s["name"]: s["name"] for s in schemas}, {})


def _reworded(text: str, rng: random.Random) -> str:
    opening = rng.choice(OPENINGS)
    if not opening or not text:
        return text
    return opening + text[0].lower() + text[1:]


def augment(schemas: list[dict], rng: random.Random) -> ToolView:
    """New names (distinct, still identifiers), renamed arguments, shuffled order, reworded descriptions."""
    shown, names, arguments, taken = [], {}, {}, set()
    for schema in schemas:
        real = schema["name"]
        name = real
        for _ in range(20):
            name = rng.choice(PREFIXES) + real + rng.choice(SUFFIXES)
            if name not in taken:
                break
        name = name if name not in taken else f"{real}_{len(taken)}"
        taken.add(name)
        view = copy.deepcopy(schema)
        view["name"], names[name] = name, real
        if isinstance(view.get("description"), str):
            view["description"] = _reworded(view["description"], rng)
        parameters = view.get("parameters") or {}
        properties = parameters.get("properties") or {}
        mapping, renamed = {}, {}
        for argument, spec in properties.items():
            new = argument + rng.choice(ARGUMENT_SUFFIXES) if rng.random() < 0.5 else argument
            mapping[new], renamed[new] = argument, spec
        if properties:
            parameters["properties"] = renamed
            if isinstance(parameters.get("required"), list):
                back = {v: k for k, v in mapping.items()}
                parameters["required"] = [back.get(a, a) for a in parameters["required"]]
        arguments[real] = mapping
        shown.append(view)
    rng.shuffle(shown)
    return ToolView(shown, names, arguments)


def tool_list_text(schemas: list[dict]) -> str:
    """The definitions as the LFM chat templates write them in the system prompt."""
    return ", ".join(json.dumps(s, ensure_ascii=False) for s in schemas)


def shown_prompt(prompt: str, schemas: list[dict], view: ToolView) -> str:
    return prompt.replace(tool_list_text(schemas), tool_list_text(view.schemas), 1)


# ---- SFT rows (dataset.augment_tools) -------------------------------------------------------------------------


def disguise_conversation(conversation: Conversation, rng: random.Random) -> Conversation | None:
    """The row with its tools disguised: the definitions (its `tools` column, or the JSON tool list of its system
    prompt) and every call of its assistant turns (LFM notation in the content, or structured `tool_calls` for other
    families), and the `name` of its tool turns. None: the row has no definitions this can read."""
    messages = [dict(m) for m in conversation.messages]
    if conversation.tools:
        functions = [t.get("function", t) for t in conversation.tools]
        view = augment(functions, rng)
        wrapped = {t.get("function", t)["name"]: "function" in t for t in conversation.tools}
        tools = [{"type": "function", "function": s} if wrapped[view.names[s["name"]]] else s for s in view.schemas]
    else:
        found = _system_list(messages[0]) if messages and messages[0]["role"] == "system" else None
        if found is None:
            return None
        functions, begin, end = found
        view, tools = augment(functions, rng), None
        content = messages[0]["content"]
        messages[0]["content"] = content[:begin] + json.dumps(view.schemas, ensure_ascii=False) + content[end:]
    shown_names = {real: shown for shown, real in view.names.items()}
    shown_arguments = {real: {r: s for s, r in mapping.items()} for real, mapping in view.arguments.items()}

    def shown_call(name: str, arguments: dict) -> tuple[str, dict]:
        mapping = shown_arguments.get(name, {})
        return shown_names.get(name, name), {mapping.get(k, k): v for k, v in arguments.items()}

    for message in messages:
        if message["role"] == "assistant":
            if isinstance(message.get("content"), str) and tc.CALL_START in message["content"]:
                message["content"] = _shown_blocks(message["content"], shown_call)
            if isinstance(message.get("tool_calls"), list):
                message["tool_calls"] = [_shown_structured(c, shown_call) for c in message["tool_calls"]]
        elif message["role"] == "tool" and isinstance(message.get("name"), str):
            message["name"] = shown_names.get(message["name"], message["name"])
    return replace(conversation, messages=messages, tools=tools)


def _system_list(message: dict) -> tuple[list[dict], int, int] | None:
    """(the definitions, where their JSON list starts and ends) in a system prompt: after <|tool_list_start|> (LFM2)
    or `List of tools:` (LFM2.5), or None."""
    content = message.get("content")
    if not isinstance(content, str):
        return None
    at = content.find(tc.LIST_START)
    at = at + len(tc.LIST_START) if at != -1 else content.find(TOOL_LIST_HINT)
    bracket = content.find("[", at) if at >= 0 else -1
    if bracket == -1:
        return None
    try:
        value, end = json.JSONDecoder().raw_decode(content, bracket)
    except ValueError:
        return None
    if not value or not all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in value):
        return None
    return value, bracket, end


def _shown_blocks(content: str, shown_call) -> str:
    """Each <|tool_call_start|>[...]<|tool_call_end|> block of a (valid, normalised) turn with the shown names."""
    out, position = [], 0
    while (start := content.find(tc.CALL_START, position)) != -1:
        end = content.find(tc.CALL_END, start)
        calls = tc.parse_calls(content[start + len(tc.CALL_START) : end])
        out.append(
            content[position:start] + tc.format_calls([tc.ToolCall(*shown_call(c.name, c.arguments)) for c in calls])
        )
        position = end + len(tc.CALL_END)
    return "".join(out) + content[position:]


def _shown_structured(call, shown_call):
    if not isinstance(call, dict):
        return call
    function = call.get("function", call)
    arguments = function.get("arguments")
    parsed = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else arguments
    if not isinstance(function.get("name"), str) or not isinstance(parsed or {}, dict):
        return call
    name, parsed = shown_call(function["name"], parsed or {})
    shown = {**function, "name": name, "arguments": json.dumps(parsed) if isinstance(arguments, str) else parsed}
    return {**call, "function": shown} if "function" in call else shown
