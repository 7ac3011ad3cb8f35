#!/usr/bin/env python3
"""Replays a `spechost trace` through ArcticInference's suffix decoding cache (the reference
implementation of SuffixDecoding) and prints its rounds next to `spechost simulate`'s.

The replay follows the rule `simulate` uses, so the rounds compare one to one:

* requests of a workload in trace order, through one cache that starts empty for each workload
  and draft length (as `simulate` starts a fresh plugin instance for each);
* the first output token comes from the prompt's forward pass, not from a round: the request
  starts with its prompt, then its first token is added as response;
* each round drafts at most K tokens from the context (prompt and output so far), and no more
  than the request's `max_tokens` leave room for besides the round's own token (as spechost's
  rounds do), accepts the longest prefix equal to the trace's next tokens, and commits it plus
  the trace's next token (fewer where the trace ends); the committed tokens are added to the
  request's response.

The reference's settings are the plugin's defaults: depth 64, 256 cached responses, one token
per token of match (`max_spec_factor` 1, offset 0), `min_token_prob` 0.1, a single path.

Usage: suffix-reference.py --trace TRACE.jsonl --simulation simulation.json --draft-max 8,24
"""

import argparse
import json
import sys

import numpy as np
from arctic_inference.suffix_decoding import SuffixDecodingCache

MAX_DEPTH = 64
MAX_CACHED_REQUESTS = 256
MIN_TOKEN_PROB = 0.1
MAX_SPEC_FACTOR = 1.0
MAX_SPEC_OFFSET = 0.0


def read_trace(path):
    """The trace's requests, grouped by workload in trace order:
    {name: [(prompt, output, max_tokens)]}."""
    workloads = {}
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            record = json.loads(line)
            if record.get("record") != "request":
                continue
            workloads.setdefault(record["workload"], []).append(
                (record["prompt"], record["output"], record["max_tokens"]))
    return workloads


def accepted_prefix(draft, upcoming):
    """How many leading draft tokens equal the trace's next tokens."""
    count = 0
    for drafted, actual in zip(draft, upcoming):
        if drafted != actual:
            break
        count += 1
    return count


def replay_request(cache, request_id, request, max_draft_len):
    """Replays one request, (prompt, output, max_tokens); returns (rounds, drafted, accepted)."""
    prompt, output, max_tokens = request
    rounds = drafted = accepted = 0
    cache.start_request(request_id, prompt)
    if output:
        cache.add_active_response(request_id, output[:1])
    committed = 1
    while committed < len(output):
        context = np.asarray(prompt + output[:committed], dtype=np.int32)
        draft = cache.speculate(
            request_id,
            context,
            max_spec_tokens=min(max_draft_len, max_tokens - committed - 1),
            max_spec_factor=MAX_SPEC_FACTOR,
            max_spec_offset=MAX_SPEC_OFFSET,
            min_token_prob=MIN_TOKEN_PROB,
            use_tree_spec=False,
        ).token_ids
        upcoming = output[committed:]
        n_accepted = accepted_prefix(draft, upcoming)
        new_tokens = upcoming[:n_accepted + 1]
        cache.add_active_response(request_id, new_tokens)
        committed += len(new_tokens)
        rounds += 1
        drafted += len(draft)
        accepted += n_accepted
    cache.stop_request(request_id)
    return rounds, drafted, accepted


def replay_workload(requests, max_draft_len):
    """Replays a workload's requests in order through a fresh cache; returns summed counters."""
    cache = SuffixDecodingCache(max_tree_depth=MAX_DEPTH,
                                max_cached_requests=MAX_CACHED_REQUESTS)
    totals = [0, 0, 0]
    for request_id, request in enumerate(requests):
        counters = replay_request(cache, request_id, request, max_draft_len)
        totals = [total + counter for total, counter in zip(totals, counters)]
    return tuple(totals)


def simulated_rounds(path):
    """`spechost simulate`'s results: {(workload, K): (rounds, drafted, accepted)}."""
    with open(path, encoding="utf-8") as file:
        report = json.load(file)
    return {
        (workload["name"], configuration["draft_max"]):
        (configuration["rounds"], configuration["drafted"], configuration["accepted"])
        for workload in report["workloads"]
        for configuration in workload["configurations"]
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True, help="a trace written by `spechost trace`")
    parser.add_argument("--simulation", required=True,
                        help="simulation.json of `spechost simulate` on the same trace")
    parser.add_argument("--draft-max", default="8,24", help="draft lengths K, comma-separated")
    args = parser.parse_args()
    ours = simulated_rounds(args.simulation)
    print("| workload | K | spechost suffix rounds | reference rounds | difference "
          "| spechost accepted/drafted | reference accepted/drafted |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for name, requests in read_trace(args.trace).items():
        for max_draft_len in (int(k) for k in args.draft_max.split(",")):
            rounds, drafted, accepted = replay_workload(requests, max_draft_len)
            if (name, max_draft_len) not in ours:
                print(f"error: {args.simulation} has no {name} K={max_draft_len}",
                      file=sys.stderr)
                return 1
            our_rounds, our_drafted, our_accepted = ours[(name, max_draft_len)]
            difference = (our_rounds - rounds) / rounds * 100
            print(f"| {name} | {max_draft_len} | {our_rounds} | {rounds} | {difference:+.1f}% "
                  f"| {our_accepted}/{our_drafted} | {accepted}/{drafted} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
