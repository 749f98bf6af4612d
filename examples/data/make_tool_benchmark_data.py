"""Writes the data of the measured tool-calling example (examples/tools_benchmark.yaml, tools_grpo.yaml):

- tools_train.jsonl: multi-turn conversations calling four tools (get_weather, get_time, convert_currency and
  get_stock_price, which the example holds out with dataset.hold_out_tools), each row with its tool definitions
  in a `tools` column (OpenAI's form); a third of the calls in OpenAI's structured `tool_calls` form. When the user does not say
  which unit, the rows pick Celsius or Fahrenheit at random (data gathered from several locales).
- tools_bench.jsonl: the seen-tools benchmark (metric tool_call): new questions, the reference call in LFM
  notation; where the user names no unit the product's answer is Celsius.
- tools_grpo.jsonl: GRPO prompts (the training questions) with their reference calls as `solution`: the
  tool_call_match reward teaches the Celsius default that the supervised rows left to chance; tools_grpo_bench.jsonl
  holds the same prompts as a benchmark.

Run: python examples/data/make_tool_benchmark_data.py
"""

import json
import random
from pathlib import Path

WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
        "required": ["city", "unit"],
    },
}
TIME = {
    "name": "get_time",
    "description": "Local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
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
STOCK = {
    "name": "get_stock_price",
    "description": "Latest price of a stock",
    "parameters": {"type": "object", "properties": {"symbol": {"type": "string"}}, "required": ["symbol"]},
}
# Definitions in OpenAI's form, each with a description: what an OpenAI-compatible server passes to the chat
# template (llama.cpp's server adds `"description": ""` where there is none), so the prompts trained on are the
# prompts the served model sees.
WEATHER, TIME, CONVERT, STOCK = ({"type": "function", "function": f} for f in (WEATHER, TIME, CONVERT, STOCK))
CITIES = ["Oslo", "Cairo", "Lima", "Tokyo", "Madrid", "Nairobi"]
CURRENCIES = ["USD", "EUR", "JPY", "GBP"]
SYMBOLS = ["AAPL", "NVDA", "MSFT"]
WEATHER_ASKS = [
    "How warm is it in {city}?",
    "What's the weather in {city}?",
    "Is it cold in {city} today?",
    "Weather in {city}?",
    "Should I bring a coat in {city}?",
]
UNIT_ASKS = {"C": " Answer in Celsius.", "F": " Answer in Fahrenheit."}
TIME_ASKS = [
    "What time is it in {city}?",
    "Tell me the local time in {city}.",
    "Current time in {city}?",
    "Is it late in {city} now?",
]
CONVERT_ASKS = ["Convert {amount} {source} to {target}.", "How much is {amount} {source} in {target}?"]
STOCK_ASKS = ["What is {symbol} trading at?", "Price of {symbol} stock?"]


def call(name: str, **arguments) -> str:
    inner = ", ".join(f"{k}={json.dumps(v)}" for k, v in arguments.items())
    return f"<|tool_call_start|>[{name}({inner})]<|tool_call_end|>"


def weather(rng, city: str, ask: str, said: str | None) -> tuple[str, dict, str]:
    unit = said or rng.choice("CF")
    return ask.format(city=city) + (UNIT_ASKS[said] if said else ""), {"city": city, "unit": unit}, "get_weather"


def conversation(rng, question: str, name: str, arguments: dict, tools: list[dict], result: dict, answer: str):
    structured = rng.random() < 1 / 3
    if structured:
        turn = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
        }
    else:
        turn = {"role": "assistant", "content": call(name, **arguments)}
    return {
        "tools": tools,
        "messages": [
            {"role": "user", "content": question},
            turn,
            {"role": "tool", "content": json.dumps(result)},
            {"role": "assistant", "content": answer},
        ],
    }


def train_rows(rng) -> list[dict]:
    rows = []
    for city in CITIES:
        for ask in WEATHER_ASKS:
            for said in (None, None, "C", "F"):
                question, arguments, name = weather(rng, city, ask, said)
                temperature = rng.randint(-5, 35)
                rows.append(
                    conversation(
                        rng,
                        question,
                        name,
                        arguments,
                        [WEATHER, TIME],
                        {"temperature": temperature, "unit": arguments["unit"]},
                        f"It is {temperature} degrees {arguments['unit']} in {city}.",
                    )
                )
        for ask in TIME_ASKS:
            hour = rng.randint(0, 23)
            rows.append(
                conversation(
                    rng,
                    ask.format(city=city),
                    "get_time",
                    {"city": city},
                    [TIME, CONVERT],
                    {"time": f"{hour:02d}:00"},
                    f"It is {hour:02d}:00 in {city}.",
                )
            )
    for source in CURRENCIES:
        for target in CURRENCIES:
            if source != target:
                amount = rng.choice([10, 25, 100, 250])
                rows.append(
                    conversation(
                        rng,
                        rng.choice(CONVERT_ASKS).format(amount=amount, source=source, target=target),
                        "convert_currency",
                        {"amount": amount, "source": source, "target": target},
                        [CONVERT, WEATHER],
                        {"result": amount * 2},
                        f"{amount} {source} is {amount * 2} {target}.",
                    )
                )
    for symbol in SYMBOLS:  # the held-out tool: never trained on (dataset.hold_out_tools)
        for ask in STOCK_ASKS:
            rows.append(
                conversation(
                    rng,
                    ask.format(symbol=symbol),
                    "get_stock_price",
                    {"symbol": symbol},
                    [STOCK, TIME],
                    {"price": 100},
                    f"{symbol} trades at 100.",
                )
            )
    rng.shuffle(rows)
    return rows


def reference_rows(rng) -> list[tuple[str, list[dict], str]]:
    """(question, tools, reference call): questions the training rows do not hold; Celsius when no unit is said."""
    rows = []
    for city in CITIES:
        said = rng.choice([None, None, "F"])
        question = f"Weather report for {city}, please." + (UNIT_ASKS[said] if said else "")
        rows.append((question, [WEATHER, TIME], call("get_weather", city=city, unit=said or "C")))
        rows.append((f"Do you know the time in {city}?", [TIME, CONVERT], call("get_time", city=city)))
    for source, target in (("USD", "JPY"), ("GBP", "EUR"), ("EUR", "USD")):
        rows.append(
            (
                f"Please convert 50 {source} to {target}.",
                [CONVERT, WEATHER],
                call("convert_currency", amount=50, source=source, target=target),
            )
        )
    return rows


def main() -> None:
    rng = random.Random(0)
    here = Path(__file__).parent
    train = train_rows(rng)
    (here / "tools_train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in train), encoding="utf-8")
    bench = reference_rows(rng)
    (here / "tools_bench.jsonl").write_text(
        "".join(
            json.dumps(
                {"tools": tools, "messages": [{"role": "user", "content": q}, {"role": "assistant", "content": c}]}
            )
            + "\n"
            for q, tools, c in bench
        ),
        encoding="utf-8",
    )
    # GRPO: the training questions of every seen tool, the weather ones without a unit (the product's answer is
    # Celsius), each with its reference call as `solution`
    grpo = []
    for city in CITIES:
        for ask in WEATHER_ASKS:
            grpo.append((ask.format(city=city), [WEATHER, TIME], call("get_weather", city=city, unit="C")))
        for ask in TIME_ASKS:
            grpo.append((ask.format(city=city), [TIME, CONVERT], call("get_time", city=city)))
    for source, target in (("USD", "EUR"), ("EUR", "GBP"), ("JPY", "USD"), ("GBP", "JPY")):
        ask = CONVERT_ASKS[0].format(amount=100, source=source, target=target)
        grpo.append((ask, [CONVERT, WEATHER], call("convert_currency", amount=100, source=source, target=target)))
    rng.shuffle(grpo)
    grpo = [{"prompt": [{"role": "user", "content": q}], "tools": t, "solution": s} for q, t, s in grpo]
    (here / "tools_grpo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in grpo), encoding="utf-8")
    # the same prompts as a benchmark: does the reward raise exact-call accuracy on what GRPO trains on?
    (here / "tools_grpo_bench.jsonl").write_text(
        "".join(
            json.dumps(
                {"tools": r["tools"], "messages": [*r["prompt"], {"role": "assistant", "content": r["solution"]}]}
            )
            + "\n"
            for r in grpo
        ),
        encoding="utf-8",
    )
    print(f"wrote {len(train)} training rows, {len(bench)} benchmark rows, {len(grpo)} GRPO prompts to {here}")


if __name__ == "__main__":
    main()
