#!/usr/bin/env python3
"""Talks to `spechost serve` with the official `openai` Python client (pip install openai).

    spechost serve --model smollm2 --cascade lookup --port 8080 &
    python3 examples/openai_client.py --base-url http://127.0.0.1:8080/v1

Lists the models, asks for a chat completion with per-request speculation settings
(`extra_body={"speculative": ...}`), streams the same request and checks that both answers are
the same text (greedy decoding), then asks for a plain text completion. Prints what speculation
did. Exits non-zero on any mismatch; `tests/server.rs` runs it against a test server.
"""

import argparse
import sys

import openai

PROMPT = (
    "Rewrite this function with type hints, keeping every other line as it is:\n\n"
    "def area(width, height):\n"
    "    return width * height\n"
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    args = parser.parse_args()

    # spechost needs no API key; the client insists on one.
    client = openai.OpenAI(base_url=args.base_url, api_key="unused")

    models = client.models.list()
    model = models.data[0].id
    print(f"model: {model}")

    request = dict(
        model=model,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=48,
        temperature=0,
        extra_body={"speculative": {"cascade": "lookup", "draft_max": 4}},
    )
    whole = client.chat.completions.create(**request)
    text = whole.choices[0].message.content
    speculative = (whole.model_extra or {}).get("speculative") or {}
    print(f"chat ({whole.choices[0].finish_reason}, {whole.usage.completion_tokens} tokens):")
    print(text)
    print(
        "speculation: cascade {cascade}, acceptance {acceptance:.1f}%, "
        "mean accepted length {mean:.2f}".format(
            cascade=",".join(speculative.get("cascade", [])),
            acceptance=speculative.get("acceptance_percent", 0.0),
            mean=speculative.get("mean_accepted_length", 0.0),
        )
    )
    if speculative.get("draft_max") != 4:
        print(f"error: speculative.draft_max is not 4: {speculative}", file=sys.stderr)
        return 1

    pieces = []
    usage = None
    for chunk in client.chat.completions.create(
        **request, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage = chunk.usage
    streamed = "".join(pieces)
    if streamed != text:
        print(f"error: streamed text differs:\n{streamed!r}\n!=\n{text!r}", file=sys.stderr)
        return 1
    if usage is None or usage.completion_tokens != whole.usage.completion_tokens:
        print(f"error: streamed usage {usage} != {whole.usage}", file=sys.stderr)
        return 1
    print("stream: same text")

    completion = client.completions.create(
        model=model, prompt="def fibonacci(n):", max_tokens=24, temperature=0
    )
    print(f"completion: {completion.choices[0].text!r}")
    if not completion.choices[0].text:
        print("error: empty completion", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
