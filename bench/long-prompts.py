#!/usr/bin/env python3
"""Summarisation requests with long prompts, for time-to-first-token benchmarks (issue 25).

Each request asks for a summary of a different passage of the license texts every Debian system
ships (/usr/share/common-licenses), cut to CHARS characters (about 4.5 characters per token for
both default models' tokenizers: 8,600 characters are 1,750-1,900 tokens). Every prompt differs
from its first line on, so no server can reuse another request's prompt cache. Writes the
workload format of examples/workloads (chat messages and a raw-completion prompt) to stdout.

Usage: bench/long-prompts.py [CHARS] [COUNT] > long.jsonl   (defaults: 8600, 8)
"""
import json
import pathlib
import sys

LICENSES = pathlib.Path("/usr/share/common-licenses")
CHARS = int(sys.argv[1]) if len(sys.argv) > 1 else 8600
COUNT = int(sys.argv[2]) if len(sys.argv) > 2 else 8

if not LICENSES.is_dir():
    sys.exit(f"error: {LICENSES} is missing; install Debian's base-files or give another corpus")
texts = []
for path in sorted(p for p in LICENSES.iterdir() if not p.is_symlink()):
    text = path.read_text(errors="replace")
    # Passages of CHARS characters, each starting on a line of its own.
    start = 0
    while start + CHARS <= len(text):
        texts.append((f"{path.name}@{start}", text[start : start + CHARS]))
        start = text.find("\n", start + CHARS) + 1
        if start <= 0:
            break
if len(texts) < COUNT:
    sys.exit(f"error: only {len(texts)} passages of {CHARS} characters; ask for fewer or shorter")
for number, (name, passage) in enumerate(texts[:COUNT]):
    # The passage first: prompts share no prefix.
    request = f"{passage}\n\nSummarize the document above in a few sentences."
    print(json.dumps({
        "id": f"long-{number}-{name}",
        "category": "summarize",
        "messages": [{"role": "user", "content": request}],
        "max_tokens": 16,
        # No stop strings: every answer streams text, so every request has a time to first token.
        "prompt": f"{passage}\n\nTL;DR:",
    }))
