"""`environment.augment_tools`: each training episode is shown the tools under other names, with other argument names,
in another order and with reworded descriptions, so that the model learns to read a tool list rather than memorise
one (a model shipped to an app meets tool lists it was never trained on). The calls it makes are mapped back to the
real tools before anything runs; evaluation episodes see the real list.

The prompt was rendered once by the driver with the real definitions; an episode's prompt is that text with the tool
list replaced (the chat template writes each definition as its JSON, joined by ", " - checked at the run's start)."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass

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
