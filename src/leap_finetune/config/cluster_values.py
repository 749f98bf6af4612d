"""`ray:` and `slurm:` values that Ray or sbatch would misread, refused when the config is read (`validate` included).

Ray: `resources_per_worker` holds amounts that Ray Train reserves per worker; Ray itself takes a negative or NaN
amount and then waits forever or fails with a traceback. What the cluster can give is checked when the run starts
(launch/ray_resources.py). SLURM: every `#SBATCH` value is one line of the job script, and sbatch reads that line
with rules of its own (quotes, backslashes, `#` comments; `sbatch_words`), so a newline would start a shell line of
the script and a stray quote would end the script's parsing with sbatch's "Unmatched" error.
"""

from __future__ import annotations

import itertools
import math

from leap_finetune.errors import LeapError

# Names Ray spells with capitals (or lower case): a different case is another, custom, resource nobody has.
RAY_NAMES = {name.lower(): name for name in ("CPU", "GPU", "TPU", "memory", "object_store_memory")}
SBATCH_KEYS = ("partition", "account", "time", "mem", "job_name")


def check_ray_values(ray: dict, where: str) -> None:
    resources = ray.get("resources_per_worker")
    if resources is None:
        return
    key = "ray.resources_per_worker"
    if not isinstance(resources, dict) or not resources:
        raise LeapError(
            f"{key} is {resources!r}: expected a mapping of Ray resource names to amounts per worker",
            where=where,
            fix="write e.g. resources_per_worker: {CPU: 8, GPU: 1} (or leave it "
            "out: 1 GPU per worker on GPUs, 1 CPU otherwise)",
        )
    for name, amount in resources.items():
        _check_resource(name, amount, key, where)


def _check_resource(name, amount, key: str, where: str) -> None:
    if not isinstance(name, str) or not name.strip():
        raise LeapError(
            f"{key} has the name {name!r}: expected a Ray resource name (CPU, GPU, memory, or a custom "
            "resource of the cluster)",
            where=where,
            fix="name each resource, e.g. {CPU: 8}",
        )
    at = f"{key}.{name}"
    usual = RAY_NAMES.get(name.lower())
    if usual is not None and usual != name:
        raise LeapError(
            f"{at}: Ray's resource names are case-sensitive, and '{name}' would be a custom resource that no node has",
            where=where,
            fix=f"write {usual}",
        )
    if name == "TPU":
        raise LeapError(
            f"{at}: Ray Train reserves TPUs only for its TPU runs (use_tpu with a TPU topology), and "
            "leap-finetune's workers train on GPUs or CPUs",
            where=where,
            fix="remove TPU (GPU workers: GPU: 1; CPU workers: CPU: N)",
        )
    if name == "object_store_memory":
        raise LeapError(
            f"{at}: Ray does not reserve object store memory for a worker (it is deprecated in "
            "placement groups and only warns)",
            where=where,
            fix="remove it; memory: BYTES reserves a worker's own memory",
        )
    number = isinstance(amount, (int, float)) and not isinstance(amount, bool)
    if not number or not math.isfinite(amount) or amount < 0:
        shown = (
            {True: "true", False: "false"}.get(amount, repr(amount))
            if isinstance(amount, bool)
            else (
                amount
                if not isinstance(amount, float) or math.isfinite(amount)
                else ".nan"
                if math.isnan(amount)
                else ".inf"
                if amount > 0
                else "-.inf"
            )
        )
        raise LeapError(
            f"{at} is {shown}: expected a finite number >= 0 (the amount Ray reserves for each worker"
            + ("; memory is in bytes" if name == "memory" else "")
            + ")",
            where=where,
            fix=f"give {at} an amount such as 1 (0 reserves none; 0.5 lets two workers share one)"
            if name != "memory"
            else f"give {at} a number of bytes, e.g. 16e9",
        )


# SLURM's own formats (sbatch(1)), checked here too: on a machine without sbatch, `leap-finetune slurm` writes the
# script without `sbatch --test-only`, and `time: forever` would only fail on the cluster, after the queue
NAME = r"[A-Za-z0-9_.\-]+"
FORMATS = {
    "partition": (rf"{NAME}(,{NAME})*", "a partition name (letters, digits, _ . -), or several separated by commas"),
    "account": (NAME, "an account name (letters, digits, _ . -)"),
    "mem": (r"\d+[KMGTkmgt]?", "a whole amount with K, M, G or T (megabytes without one), e.g. 200G; 0 = all of it"),
    "gres": (
        r"[A-Za-z0-9_\-/]+(:[A-Za-z0-9_.\-]+)?(:\d+[KMGTkmgt]?)?(,[A-Za-z0-9_\-/]+(:[A-Za-z0-9_.\-]+)?(:\d+[KMGTkmgt]?)?)*",
        "generic resources as name[:type][:count], several separated by commas, e.g. gpu:4 or gpu:a100:2",
    ),
}
FORMATS["count"] = (r"\d+", "a whole number")
FORMATS["gpus"] = (r"([A-Za-z0-9_\-]+:)?\d+", "a number of GPUs, or type:number, e.g. 4 or a100:4")
EXAMPLES = {
    "time": "04:00:00",
    "partition": "gpu",
    "account": "my-lab",
    "mem": "200G",
    "gres": "gpu:4",
    "count": "8",
    "gpus": "4",
}
# extra_sbatch options whose values have a format checked here as the slurm: keys' are (the key whose format it is)
CHECKED_OPTIONS = {
    "--time": "time",
    "-t": "time",
    "--mem": "mem",
    "--mem-per-cpu": "mem",
    "--mem-per-gpu": "mem",
    "--partition": "partition",
    "-p": "partition",
    "--gres": "gres",
    "--cpus-per-task": "count",
    "-c": "count",
    "--ntasks": "count",
    "-n": "count",
    "--gpus": "gpus",
    "-G": "gpus",
    "--gpus-per-task": "gpus",
    "--gpus-per-node": "gpus",
}
# The #SBATCH lines the script writes from the slurm: keys (launch/slurm.py _directives): the same option again in
# extra_sbatch would override the key without a word (sbatch takes the last), or contradict the Ray set-up the
# script makes (one task per node, the log it points to). (option spellings, the key that owns it or None: always)
OWNED_OPTIONS = [
    (("--job-name", "-J"), "job_name", True),
    (("--nodes", "-N"), "nodes", True),
    (("--ntasks-per-node",), None, True),
    (("--time", "-t"), "time", True),
    (("--output", "-o"), None, True),
    (("--gpus-per-node",), "gpus_per_node", False),
    (("--partition", "-p"), "partition", False),
    (("--account", "-A"), "account", False),
    (("--mem",), "mem", False),
    (("--cpus-per-task", "-c"), "cpus_per_task", False),
    (("--signal",), "stop_before_time_limit_s", False),
]


def check_slurm_values(slurm: dict, where: str) -> None:
    """Each `#SBATCH` value on one line, in SLURM's format; each `extra_sbatch` entry options sbatch reads as
    written."""
    for key in SBATCH_KEYS:
        value = slurm.get(key)
        if isinstance(value, str):
            _one_line(value, f"slurm.{key}", where)
            _slurm_format(key, value, f"slurm.{key}", where)
    entries = slurm.get("extra_sbatch")
    if not isinstance(entries, list):
        return  # (the schema says what it must be)
    for index, entry in enumerate(entries):
        if isinstance(entry, str):
            _check_extra(entry, f"slurm.extra_sbatch[{index}]", where)
            _not_owned(entry, slurm, f"slurm.extra_sbatch[{index}]", where)


def _not_owned(entry: str, slurm: dict, key: str, where: str) -> None:
    """An option the script already writes from a slurm: key (or always, for its own set-up) is refused."""
    words, _ = sbatch_words(entry.strip().removeprefix("#SBATCH").strip())
    given = {w.split("=", 1)[0] if w.startswith("--") else w[:2] for w in words if w.startswith("-")}
    for spellings, owner, always in OWNED_OPTIONS:
        found = next((o for o in spellings if o in given), None)
        if found is None or not (always or slurm.get(owner)):
            continue
        fix = f"set slurm.{owner} instead" if owner else "remove it: the script's Ray set-up needs its own"
        raise LeapError(
            f"{key} sets {found}, which the job script already writes"
            + (f" from slurm.{owner}" if owner else "")
            + " (sbatch would take the last one)",
            where=where,
            fix=f"{fix} (docs/distributed.md)",
        )


def check_eval_sbatch_values(sbatch: dict, where: str) -> None:
    """async_eval.sbatch: partition and account are #SBATCH lines of each evaluation job's script (its extra_args
    go to sbatch's command line as they are)."""
    for key in ("partition", "account"):
        if isinstance(sbatch.get(key), str):
            _one_line(sbatch[key], f"async_eval.sbatch.{key}", where)
            _slurm_format(key, sbatch[key], f"async_eval.sbatch.{key}", where)


def _slurm_format(key: str, value: str, name: str, where: str, option: str | None = None) -> None:
    """`value` of slurm.KEY (or of the extra_sbatch `option` in SLURM's format of KEY), in that format."""
    import re

    from leap_finetune.config.schema_cluster import slurm_seconds

    if key == "time":
        if value.strip().upper() in ("UNLIMITED", "INFINITE") or slurm_seconds(value) is not None:
            return
        expected = "a SLURM time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (or UNLIMITED)"
    elif key in FORMATS and not re.fullmatch(FORMATS[key][0], value.strip()):
        expected = FORMATS[key][1]
    else:
        return
    example = EXAMPLES[key] if option or key != "time" else f"'{EXAMPLES[key]}'"
    raise LeapError(
        f"{name} is {value!r}: expected {expected}",
        where=where,
        fix=(
            f"e.g. {option}{'=' if option.startswith('--') else ' '}{example}" if option else f"e.g. {name}: {example}"
        ),
    )


def _one_line(value: str, key: str, where: str) -> None:
    bad = next((c for c in value if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        name = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab"}.get(bad, f"the control character {bad!r}")
        raise LeapError(
            f"{key} holds {name} ({value!r}): it is written into one #SBATCH line of the job script, where "
            "a new line would be a shell command of the job",
            where=where,
            fix=f"write {key} on one line without control characters"
            + (" (one option per extra_sbatch entry)" if "extra_sbatch" in key else ""),
        )


def _check_extra(entry: str, key: str, where: str) -> None:
    _one_line(entry, key, where)
    text = entry.strip().removeprefix("#SBATCH").strip()
    try:
        words, comment = sbatch_words(text)
    except ValueError as err:
        raise LeapError(
            f"{key} is {entry!r}: sbatch would stop with {err}",
            where=where,
            fix='close the quote, or escape it with a backslash (e.g. --comment="it\'s mine")',
        ) from None
    if comment:
        raise LeapError(
            f"{key} is {entry!r}: sbatch reads '#{comment}' as a comment and drops it",
            where=where,
            fix='put the value in double quotes, e.g. --comment="run #2"',
        )
    if not words or not words[0].startswith("-"):
        raise LeapError(
            f"{key} is {entry!r}: expected sbatch options (e.g. --qos=high)",
            where=where,
            fix="write each entry as sbatch's command-line options, starting with - or --",
        )
    for before, word in itertools.pairwise(words):
        if not word.startswith("-") and (not before.startswith("-") or "=" in before):
            raise LeapError(
                f"{key} is {entry!r}: sbatch would read '{word}' as a directive of its own (sbatch "
                "splits a #SBATCH line at spaces outside quotes) and refuse the script",
                where=where,
                fix=f"quote the value that holds spaces, e.g. "
                f'{before.split("=", 1)[0]}="{before.split("=", 1)[-1]} {word}"',
            )
    # (where sbatch is installed, `sbatch --test-only` checks them too; where not, the job would fail in the queue)
    for option, value in _option_values(words):
        _slurm_format(CHECKED_OPTIONS[option], value, f"{key} {option}", where, option)


def _option_values(words: list[str]):
    """(option, value) of each option in CHECKED_OPTIONS: --time=V, --time V, -t V and -tV, as sbatch reads them."""
    for index, word in enumerate(words):
        following = words[index + 1] if index + 1 < len(words) and not words[index + 1].startswith("-") else None
        if word.startswith("--"):
            option, equals, value = word.partition("=")
            value = value if equals else following
        elif word.startswith("-") and len(word) > 1:
            option, value = word[:2], word[2:] or following
        else:
            continue
        if option in CHECKED_OPTIONS and value is not None:
            yield option, value


def sbatch_words(line: str) -> tuple[list[str], str]:
    """The arguments sbatch reads from what follows `#SBATCH` on a line, and the comment it ignores.

    SLURM's own rules (src/sbatch/opt.c, `_get_argument`; checked with sbatch 22.05): spaces outside quotes end an
    argument, single or double quotes group (and are removed), a backslash takes the next character as it is, an
    unquoted `#` starts a comment, and an unmatched quote is fatal (ValueError here)."""
    words, word, quote, escaped, started = [], [], "", False, False
    for index, char in enumerate(line):
        if escaped:
            word.append(char)
            escaped = False
        elif char == "\\":
            escaped = started = True
        elif quote:
            if char == quote:
                quote = ""
            else:
                word.append(char)
        elif char in "\"'":
            quote, started = char, True
        elif char == "#":
            if started:
                words.append("".join(word))
            return words, line[index + 1 :]
        elif char.isspace():
            if started:
                words.append("".join(word))
            word, started = [], False
        else:
            word.append(char)
            started = True
    if quote:
        raise ValueError(f'"Unmatched `{quote}`"')
    if started:
        words.append("".join(word))
    return words, ""


def sbatch_value(value: str) -> str:
    """A value as one argument of an `#SBATCH` line: as it is when sbatch reads it so, else in double quotes with
    backslashes and double quotes escaped (sbatch keeps spaces, `#` and quotes inside them)."""
    if value and not any(char.isspace() or char in "\"'\\#" for char in value):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
