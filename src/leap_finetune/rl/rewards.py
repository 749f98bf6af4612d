"""Built-in reward helpers.

`tool_call_is_valid(completion, tools=None) -> bool`: the completion holds LFM tool calls that
parse, with balanced markers, and (given a tool list) only known function names. Use it as a
format reward, e.g. `float(tool_call_is_valid(text, tools))`.
"""

from leap_finetune.data.tool_calls import tool_call_is_valid

__all__ = ["tool_call_is_valid"]
