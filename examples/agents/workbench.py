"""The tools of the agents example (examples/agents_grpo.yaml): a calculator and a key-value store.

A stateful environment: leap-finetune makes one Workbench per episode, calls reset(row) with the dataset row, and
offers the public methods to the model as tools (described by their type hints and docstrings).
"""

import ast
import operator

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _evaluate(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        return OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    raise ValueError("only whole numbers and + - * // are allowed")


class Workbench:
    def reset(self, row):
        # the row's hidden facts: the model can only learn them through lookup()
        self.store = {item["key"]: item["value"] for item in row.get("store") or []}

    def calculator(self, expression: str) -> str:
        """Compute with whole numbers.

        Args:
            expression: e.g. "7 * 48"
        """
        return str(_evaluate(ast.parse(expression, mode="eval").body))

    def lookup(self, key: str) -> str:
        """Read a stored value.

        Args:
            key: e.g. "door"
        """
        if key not in self.store:
            raise KeyError(f"no key {key!r}; the keys are: {', '.join(sorted(self.store))}")
        return self.store[key]
