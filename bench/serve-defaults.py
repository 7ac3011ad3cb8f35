#!/usr/bin/env python3
"""A running `spechost serve` with its defaults against plain decoding, side by side.

For each request of a workload file (chat requests, `../shared/workloads/*.jsonl`), in order,
over --passes passes: the request as a client sends it (no `speculative` block: the server's
default cascade and policy) and the same request with `"speculative": {"cascade": "none"}`
(plain decoding), one after the other, alternating which goes first from request to request so
slow drift of a shared machine touches both alike. Greedy; every pair of outputs must be equal.

Prints a markdown table: per pass, generated tokens per second of each, end to end (tokens over
the wall time of the requests as the client saw them, prompt processing included) and while
generating (the server's own `speculative.tokens_per_second`, weighted by tokens), and their
ratios; then the median ratios over the passes. --json writes the same as JSON.

Python 3 standard library only. Example (`bench/serve-defaults.sh` starts the server):
  python3 bench/serve-defaults.py --base-url http://127.0.0.1:8080 \\
      --workload ../shared/workloads/summarize.jsonl --passes 3
"""

import argparse
import http.client
import json
import statistics
import sys
import time
import urllib.parse


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8080")
    parser.add_argument("--workload", required=True, help="a JSONL file of chat requests")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--limit", type=int, default=0, help="only the first N requests (0: all)")
    parser.add_argument("--max-tokens", type=int, default=0,
                        help="override each request's max_tokens (0: keep)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per request, seconds")
    parser.add_argument("--json", help="also write the results as JSON to this file")
    return parser.parse_args()


def post(base_url, body, timeout):
    url = urllib.parse.urlsplit(base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout)
    try:
        started = time.monotonic()
        connection.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        raw = response.read()
        elapsed = time.monotonic() - started
    finally:
        connection.close()
    if response.status != 200:
        sys.exit(f"error: the server answered {response.status}: {raw[:500]!r}")
    return json.loads(raw), elapsed


def read_workload(path, limit):
    requests = []
    with open(path) as lines:
        for line in lines:
            if line.strip():
                requests.append(json.loads(line))
    return requests[:limit] if limit else requests


def main():
    args = parse_args()
    requests = read_workload(args.workload, args.limit)
    passes = []
    for number in range(args.passes):
        # tokens, wall seconds, generation seconds
        totals = {"defaults": [0, 0.0, 0.0], "plain": [0, 0.0, 0.0]}
        policies = set()
        for index, request in enumerate(requests):
            body = {
                "messages": request["messages"],
                "max_tokens": args.max_tokens or request.get("max_tokens", 256),
                "temperature": 0,
            }
            plain_body = dict(body, speculative={"cascade": "none"})
            order = [("defaults", body), ("plain", plain_body)]
            if index % 2 == 1:
                order.reverse()
            texts = {}
            for name, sent in order:
                answer, elapsed = post(args.base_url, sent, args.timeout)
                tokens = answer["usage"]["completion_tokens"]
                totals[name][0] += tokens
                totals[name][1] += elapsed
                totals[name][2] += tokens / max(answer["speculative"]["tokens_per_second"], 1e-9)
                texts[name] = answer["choices"][0]["message"]["content"]
                if name == "defaults":
                    policies.add(str(answer.get("speculative", {}).get("policy")))
            if texts["defaults"] != texts["plain"]:
                sys.exit(f"error: request {request.get('id', index)}: the default cascade's "
                         "output differs from plain decoding")
        rate = {name: tokens / wall for name, (tokens, wall, _) in totals.items()}
        generating = {name: tokens / gen for name, (tokens, _, gen) in totals.items()}
        passes.append({
            "pass": number + 1,
            "defaults_tok_s": rate["defaults"],
            "plain_tok_s": rate["plain"],
            "ratio": rate["defaults"] / rate["plain"],
            "defaults_generation_tok_s": generating["defaults"],
            "plain_generation_tok_s": generating["plain"],
            "generation_ratio": generating["defaults"] / generating["plain"],
            "tokens": totals["plain"][0],
            "policies": sorted(policies),
        })
        print(f"pass {number + 1}: end to end {passes[-1]['ratio']:.3f}, generating "
              f"{passes[-1]['generation_ratio']:.3f}", file=sys.stderr)
    summary = {
        "workload": args.workload,
        "requests": len(requests),
        "passes": passes,
        "median_ratio": statistics.median(p["ratio"] for p in passes),
        "median_generation_ratio": statistics.median(p["generation_ratio"] for p in passes),
    }
    lines = [
        f"`{args.workload}`, {len(requests)} requests in order, greedy, outputs identical",
        "",
        "| pass | end to end: defaults / plain tok/s | ratio | generating: defaults / plain "
        "tok/s | ratio |",
        "|---|--:|--:|--:|--:|",
    ]
    lines += [f"| {p['pass']} | {p['defaults_tok_s']:.1f} / {p['plain_tok_s']:.1f} | "
              f"{p['ratio']:.3f} | {p['defaults_generation_tok_s']:.1f} / "
              f"{p['plain_generation_tok_s']:.1f} | {p['generation_ratio']:.3f} |"
              for p in passes]
    lines += ["", f"Median ratios: end to end **{summary['median_ratio']:.3f}**, generating "
              f"**{summary['median_generation_ratio']:.3f}** "
              f"(default policy: {', '.join(passes[0]['policies'])})"]
    print("\n".join(lines))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(summary, out, indent=2)


if __name__ == "__main__":
    main()
