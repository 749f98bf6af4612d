"""What every block's model of the YAML contract shares (config/schema.py and its schema_*.py blocks): unknown keys
refused, assignments validated, numbers checked as numbers."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from leap_finetune.config.numbers import check_field


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*", mode="before")
    @classmethod
    def check_numbers(cls, value, info):
        """`true` or `.nan` where a number is expected is refused (pydantic would read `true` as 1)."""
        return check_field(value, cls.model_fields[info.field_name])


def block_model(name: str) -> type[StrictModel] | None:
    """The block's model of this class name (pydantic's error title), wherever it is declared."""
    found, todo = {}, [StrictModel]
    while todo:
        cls = todo.pop()
        found[cls.__name__] = cls
        todo += cls.__subclasses__()
    return found.get(name)


FIX_MARK = "\x1f"  # (between a validator's message and its fix: validate/keys.py pydantic_error splits them)


def with_fix(message: str, fix: str) -> str:
    """A schema validator's ValueError text that carries its own fix, shown as the error's `fix:` line instead of
    the generic pointer to docs/config.md."""
    return f"{message}{FIX_MARK}{fix}"
