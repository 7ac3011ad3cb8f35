#!/usr/bin/env python3
"""Gives every request of the sample chat workloads a raw-completion form for base models.

Each line of examples/workloads/{edit,summarize,extract,code}.jsonl keeps its `messages` (for
instruction-tuned models) and gains `prompt` and `stop`: the same task, from the same source
text, written as text for a pretrained model to continue. `spechost bench --prompt-style auto`
sends a model with a chat template the messages and a model without one the prompt.

- extract: few-shot extraction, one worked line (not among the requests) then the request's line;
- summarize: the document, then "TL;DR:";
- code: the HumanEval prompt as is (the model writes the body), with HumanEval's stop strings;
- edit: the function, then a comment announcing it with type hints and its `def` to continue.

Idempotent: rerun it after editing a chat request. Usage: bench/raw-prompts.py [DIR]
"""
import json
import sys
from pathlib import Path

EXTRACT_HEAD = (
    'Lines of the IANA protocol numbers table as JSON objects with the keys "name", "number", '
    '"aliases", "comment".\n\n'
    "Line: ospf\t89\tOSPFIGP\t\t# Open Shortest Path First IGP\n"
    'JSON: {"name": "ospf", "number": 89, "aliases": ["OSPFIGP"], '
    '"comment": "Open Shortest Path First IGP"}\n\n'
)
HUMANEVAL_STOPS = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]


def body(content: str) -> str:
    """The source text of a chat request: everything after its one-paragraph instruction."""
    return content.split("\n\n", 1)[1]


def fenced(text: str) -> str:
    """The code inside a ```python fence."""
    text = text.strip()
    if not (text.startswith("```python\n") and text.endswith("```")):
        raise ValueError(f"expected a fenced python block, got {text[:40]!r}")
    return text[len("```python\n") : -len("```")]


def raw_form(workload: str, content: str) -> tuple[str, list[str]]:
    """The prompt and stop strings of one request of `workload`."""
    if workload == "extract":
        return EXTRACT_HEAD + f"Line: {body(content)}\nJSON:", ["\n"]
    if workload == "summarize":
        return body(content).rstrip() + "\n\nTL;DR:", ["\n\n"]
    if workload == "code":
        return fenced(body(content)), HUMANEVAL_STOPS
    if workload == "edit":
        function = fenced(body(content))
        return (
            f"# Before:\n{function}\n"
            "# After: the same function with type hints on its signature, "
            "every other line unchanged:\n",
            ["\n# ", "\n\n\n"],
        )
    raise ValueError(f"no raw form for workload {workload!r}")


def main() -> None:
    directory = Path(sys.argv[1] if len(sys.argv) > 1 else "examples/workloads")
    for workload in ["edit", "summarize", "extract", "code"]:
        path = directory / f"{workload}.jsonl"
        requests = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        for request in requests:
            request["prompt"], request["stop"] = raw_form(workload, request["messages"][0]["content"])
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in requests))
        print(f"{path}: {len(requests)} requests")


if __name__ == "__main__":
    main()
