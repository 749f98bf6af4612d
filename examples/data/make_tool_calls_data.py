"""Writes tool_calls.jsonl: multi-turn tool-use conversations in every accepted shape - LFM
bracket notation in the content, OpenAI-style structured `tool_calls`, tool definitions in the
system prompt or in a `tools` column. Run: python examples/data/make_tool_calls_data.py"""

import json
import random
from pathlib import Path

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city"],
    },
}
CONVERT = {
    "name": "convert_currency",
    "description": "Convert an amount between currencies",
    "parameters": {
        "type": "object",
        "properties": {"amount": {"type": "number"}, "source": {"type": "string"}, "target": {"type": "string"}},
        "required": ["amount", "source", "target"],
    },
}
CITIES = {"Oslo": -3, "Cairo": 31, "Lima": 19, "Tokyo": 12, "Madrid": 24, "Nairobi": 22}
RATES = {("USD", "EUR"): 0.92, ("EUR", "JPY"): 162.5, ("GBP", "USD"): 1.27}


def weather_row(city: str, temp: int, structured: bool, tools_column: bool) -> dict:
    call = {"city": city, "unit": "C"}
    assistant_call = (
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": json.dumps(call)}}],
        }
        if structured
        else {
            "role": "assistant",
            "content": f'<|tool_call_start|>[get_weather(city="{city}", unit="C")]<|tool_call_end|>',
        }
    )
    messages = [
        {"role": "user", "content": f"How warm is it in {city} right now?"},
        assistant_call,
        {"role": "tool", "content": json.dumps({"city": city, "temperature": temp, "unit": "C"})},
        {"role": "assistant", "content": f"It is {temp} °C in {city}."},
    ]
    row = {"messages": messages}
    if tools_column:
        row["tools"] = [WEATHER, CONVERT]
    else:
        tool_list = json.dumps([WEATHER, CONVERT])
        messages.insert(
            0, {"role": "system", "content": f"List of tools: <|tool_list_start|>{tool_list}<|tool_list_end|>"}
        )
    return row


def convert_row(amount: float, source: str, target: str, rate: float) -> dict:
    result = round(amount * rate, 2)
    return {
        "tools": [WEATHER, CONVERT],
        "messages": [
            {"role": "user", "content": f"Convert {amount} {source} to {target}."},
            {
                "role": "assistant",
                "content": f'<|tool_call_start|>[convert_currency(amount={amount}, source="{source}", '
                f'target="{target}")]<|tool_call_end|>',
            },
            {"role": "tool", "content": json.dumps({"result": result})},
            {"role": "assistant", "content": f"{amount} {source} is {result} {target}."},
            {"role": "user", "content": "Thanks!"},
            {"role": "assistant", "content": "You're welcome."},
        ],
    }


def main() -> None:
    rows = []
    for _i, (city, temp) in enumerate(CITIES.items()):
        for variant in range(4):
            rows.append(weather_row(city, temp + variant, structured=variant % 2 == 1, tools_column=variant >= 2))
    for (source, target), rate in RATES.items():
        for amount in (10, 25.5, 100):
            rows.append(convert_row(amount, source, target, rate))
    random.Random(0).shuffle(rows)
    out = Path(__file__).with_name("tool_calls.jsonl")
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    main()
