#!/usr/bin/env python3
"""llama.cpp's own tools on exactly the prompts, model, threads and context of a `spechost bench`
run, next to spechost's numbers from its results.json.

Called by bench/peers.sh (which builds the tools and writes the prompts with `spechost prompts`);
see there for what is compared. Writes peers.md, verify-cost.md and peers.json into --out and
prints both tables.
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

LLAMA_BENCH_SIZES = [1, 2, 4, 8, 16, 32]
# spechost's numerics (docs/exactness.md), for llama-bench's cost curve.
SAME_NUMERICS = ["-fa", "1", "-ctk", "q8_0", "-ctv", "q8_0", "--repack", "0"]
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
EVAL = re.compile(r"llama_perf_context_print:\s+eval time =\s+([\d.]+) ms /\s+(\d+) runs")
DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")
# llama-simple takes no thread count: llama.cpp's default context parameters give it 4.
SIMPLE_THREADS = 4


def arguments():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bench-json", required=True, type=Path, help="results.json of spechost bench")
    p.add_argument("--prompts", required=True, type=Path, help="directory of spechost prompts")
    p.add_argument("--bin", required=True, type=Path, help="llama.cpp's bin directory")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--draft-max", default="8",
                   type=lambda text: [int(k) for k in text.split(",")],
                   help="K of llama-lookup, comma-separated (its best is compared with every "
                        "spechost cascade); the largest is the draft row's")
    p.add_argument("--draft-model", type=Path, help="draft GGUF for llama-speculative-simple")
    p.add_argument("--draft-cascade", default="draft", help="spechost cascade next to it")
    p.add_argument("--requests", type=int, help="only the first N requests of each workload")
    p.add_argument("--repeat", type=int, default=1, help="interleaved passes; medians")
    p.add_argument("--no-simple", action="store_true", help="skip llama-simple")
    return p.parse_args()


class ToolError(RuntimeError):
    pass


def run(command, log):
    """Runs a tool, keeps its output in `log`, returns the output."""
    done = subprocess.run(command, capture_output=True, text=True, errors="replace")
    text = done.stdout + "\n" + done.stderr
    log.write_text(text)
    if done.returncode != 0:
        tail = "\n".join(text.splitlines()[-15:])
        raise ToolError(f"{command[0]} exited {done.returncode} (log {log}):\n{tail}")
    return text


def parse_decoded(text, log):
    """Tokens and seconds of llama-lookup / llama-speculative-simple, and their draft counts."""
    match = DECODED.search(text)
    if not match:
        raise ToolError(f"no `decoded N tokens in T seconds` line in {log}")
    drafted = DRAFTED.search(text)
    accepted = ACCEPTED.search(text)
    return {
        "tokens": int(match.group(1)),
        "seconds": float(match.group(2)),
        "drafted": int(drafted.group(1)) if drafted else 0,
        "accepted": int(accepted.group(1)) if accepted else 0,
    }


def parse_simple(text, log):
    """Tokens and seconds of llama-simple's single-token evals (its prompt eval excluded)."""
    match = EVAL.search(text)
    if not match:
        raise ToolError(f"no `eval time = X ms / N runs` line in {log}")
    return {
        "tokens": int(match.group(2)),
        "seconds": float(match.group(1)) / 1e3,
        "drafted": 0,
        "accepted": 0,
    }


def tools(args, bench, peer_bin):
    """(name, spechost label it compares with, command builder, parser) of each tool to run."""
    k = max(args.draft_max)
    common = ["-m", bench["model"], "-t", str(bench["threads"]), "-c", str(bench["ctx_size"]),
              "--temp", "0", "--no-escape"]

    def lookup(n_max):
        return lambda prompt, n: [str(peer_bin / "llama-lookup"), *common, "-n", str(n),
                                  "--spec-draft-n-max", str(n_max), "-p", prompt]

    chosen = []
    if not args.no_simple:
        chosen.append(("llama-simple", "plain",
                       lambda prompt, n: [str(peer_bin / "llama-simple"), "-m", bench["model"],
                                          "-n", str(n), prompt],
                       parse_simple))
    chosen.append(("llama-lookup K=0", "plain", lookup(0), parse_decoded))
    for lookup_k in args.draft_max:
        chosen.append((f"llama-lookup K={lookup_k}", f"lookup K={lookup_k}", lookup(lookup_k),
                       parse_decoded))
    if args.draft_model:
        chosen.append((f"llama-speculative-simple K={k}", f"{args.draft_cascade} K={k}",
                       lambda prompt, n: [str(peer_bin / "llama-speculative-simple"), *common,
                                          "-md", str(args.draft_model),
                                          "--spec-type", "draft-simple", "-n", str(n),
                                          "--spec-draft-n-max", str(k), "-p", prompt],
                       parse_decoded))
    return chosen


def requests(args):
    """The prompts index, grouped by workload in order, cut to --requests per workload."""
    by_workload = {}
    for line in (args.prompts / "index.jsonl").read_text().splitlines():
        entry = json.loads(line)
        group = by_workload.setdefault(entry["workload"], [])
        if args.requests is None or len(group) < args.requests:
            group.append(entry)
    return by_workload


def degenerate_requests(bench):
    """(workload, request id) of every request spechost's figures leave out as degenerate."""
    return {(w["name"], d["request"]) for w in bench["workloads"] for d in w["degenerate"]}


def measure(args, bench, peer_bin):
    """Runs every tool on every request spechost's figures count (its degenerate ones left out,
    so both sides measure the same requests), interleaved, --repeat times; sums per workload."""
    chosen = tools(args, bench, peer_bin)
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    left_out = degenerate_requests(bench)
    totals = {}  # (workload, tool) -> one sum per pass
    for workload, entries in requests(args).items():
        entries = [entry for entry in entries if (workload, entry["id"]) not in left_out]
        for pass_index in range(args.repeat):
            for entry in entries:
                prompt = (args.prompts / entry["file"]).read_text()
                for name, _, command, parse in chosen:
                    slug = re.sub(r"[^A-Za-z0-9=.-]+", "_", f"{workload}-{entry['id']}-{name}")
                    log = logs / f"{slug}-pass{pass_index + 1}.log"
                    print(f"  {workload} · {entry['id']} · {name} · pass {pass_index + 1}",
                          file=sys.stderr)
                    result = parse(run(command(prompt, entry["max_tokens"]), log), log)
                    passes = totals.setdefault((workload, name), [])
                    if len(passes) <= pass_index:
                        passes.append({"tokens": 0, "seconds": 0.0, "drafted": 0,
                                       "accepted": 0, "requests": 0})
                    sums = passes[pass_index]
                    for key in ("tokens", "seconds", "drafted", "accepted"):
                        sums[key] += result[key]
                    sums["requests"] += 1
    return chosen, totals


def summarise(passes):
    rates = [p["tokens"] / p["seconds"] for p in passes if p["seconds"] > 0]
    drafted = sum(p["drafted"] for p in passes)
    return {
        "tokens_per_second": statistics.median(rates) if rates else None,
        "acceptance": sum(p["accepted"] for p in passes) / drafted if drafted else None,
        "requests": passes[0]["requests"],
        "passes": passes,
    }


def spechost_configuration(bench, workload, label):
    for w in bench["workloads"]:
        if w["name"] == workload:
            for c in w["configurations"]:
                if c["label"] == label:
                    return c
    return None


def fmt(value, pattern):
    return "–" if value is None else pattern.format(value)


def peers_table(args, bench, chosen, totals):
    rows = []
    lines = [
        "| workload | requests | llama.cpp tool | tok/s | speedup | acceptance "
        "| spechost | tok/s | speedup | acceptance | spechost / llama.cpp |",
        "|---|--:|---|--:|--:|--:|---|--:|--:|--:|--:|",
    ]
    # A workload whose every request is degenerate has nothing to compare.
    workloads = [w for w in requests(args) if (w, "llama-lookup K=0") in totals]
    for workload in workloads:
        baseline = summarise(totals[(workload, "llama-lookup K=0")])["tokens_per_second"]
        for name, label, _, _ in chosen:
            theirs = summarise(totals[(workload, name)])
            ours = spechost_configuration(bench, workload, label)
            their_rate = theirs["tokens_per_second"]
            plain = label == "plain"
            their_speedup = None if plain or not baseline or their_rate is None \
                else their_rate / baseline
            our_rate = ours["tokens_per_second"]["median"] if ours else None
            our_speedup = ours["speedup"] if ours and not plain else None
            if plain:
                ratio = (f"{our_rate / their_rate:.3f} (tok/s)"
                         if our_rate and their_rate else "–")
            else:
                ratio = (f"**{our_speedup / their_speedup:.2f}** (speedup)"
                         if our_speedup and their_speedup else "–")
            tool = name + (f" ({SIMPLE_THREADS} threads)" if name == "llama-simple" else "")
            lines.append(
                f"| {workload} | {theirs['requests']} | {tool} | {fmt(their_rate, '{:.1f}')} "
                f"| {fmt(their_speedup, '{:.2f}x')} "
                f"| {fmt(None if theirs['acceptance'] is None else 100 * theirs['acceptance'], '{:.1f}%')} "
                f"| {label if ours else label + ' (not measured)'} | {fmt(our_rate, '{:.1f}')} "
                f"| {fmt(our_speedup, '{:.2f}x')} "
                f"| {fmt(ours['acceptance'] * 100 if ours and not plain else None, '{:.1f}%')} "
                f"| {ratio} |")
            rows.append({"workload": workload, "tool": name, "spechost": label,
                         "llama": theirs, "llama_speedup": their_speedup,
                         "spechost_tokens_per_second": our_rate,
                         "spechost_speedup": our_speedup})
    counts = {w["name"]: w["requests"] - len(w["degenerate"]) for w in bench["workloads"]}
    partial = [w for w in workloads
               if summarise(totals[(w, "llama-lookup K=0")])["requests"] < counts.get(w, 0)]
    notes = [
        "",
        f"llama.cpp's tools from the `llama-cpp-python==0.3.36` sdist (bench/llama-peer.sh), "
        f"greedy (`--temp 0`), {bench['threads']} threads, context {bench['ctx_size']}, each "
        f"request's max_tokens as in spechost bench, with their default numerics; "
        f"{args.repeat} interleaved pass(es), medians, over the requests spechost's figures "
        f"count (its degenerate ones left out on both sides). tok/s: generated tokens over "
        f"generation time, prompt excluded, summed over the workload's requests. The speedup of "
        f"a llama.cpp tool is over `llama-lookup K=0` (the same tool and settings, no drafts); "
        f"spechost's is over its plain decoding. `spechost / llama.cpp` is the ratio of tok/s "
        f"for plain decoding and of speedups otherwise.",
    ]
    if partial:
        notes.append(
            f"\nllama.cpp ran only the first {args.requests} request(s) of {', '.join(partial)}; "
            f"spechost's numbers cover every request, so those rows compare different samples.")
    return "\n".join(lines + notes) + "\n", rows


def best_lookup_table(args, bench, totals):
    """Every spechost cascade against llama-lookup at its best K on each workload."""
    lines = [
        "| workload | llama-lookup best K | its speedup | spechost configuration | speedup "
        "| spechost / llama-lookup | degenerate requests (left out) "
        "| tokens per pass, llama-lookup K=0 / spechost plain |",
        "|---|--:|--:|---|--:|--:|--:|--:|",
    ]
    rows = []
    for w in bench["workloads"]:
        name = w["name"]
        if (name, "llama-lookup K=0") not in totals:
            continue
        baseline_passes = totals[(name, "llama-lookup K=0")]
        baseline = summarise(baseline_passes)["tokens_per_second"]
        plain = next((c for c in w["configurations"] if not c["cascade"]), None)
        tokens = (f"{statistics.median(p['tokens'] for p in baseline_passes):.0f} / "
                  f"{fmt(plain['generated_tokens'] if plain else None, '{}')}")
        speedups = {}
        for k in args.draft_max:
            rate = summarise(totals[(name, f"llama-lookup K={k}")])["tokens_per_second"]
            if baseline and rate:
                speedups[k] = rate / baseline
        if not speedups:
            continue
        best_k = max(speedups, key=speedups.get)
        theirs = speedups[best_k]
        share = f"{len(w['degenerate'])}/{w['requests']} ({100 * w['degenerate_share']:.0f}%)"
        for c in w["configurations"]:
            if not c["cascade"]:
                continue
            ours = c["speedup"]
            ratio = ours / theirs if ours else None
            lines.append(f"| {name} | {best_k} | {theirs:.2f}x | {c['label']} "
                         f"| {fmt(ours, '{:.2f}x')} | {fmt(ratio, '**{:.2f}**')} | {share} "
                         f"| {tokens} |")
            rows.append({"workload": name, "llama_lookup_k": best_k,
                         "llama_lookup_speedup": theirs, "spechost": c["label"],
                         "spechost_speedup": ours, "ratio": ratio})
    lines += [
        "",
        f"llama-lookup's speedup is over itself at K=0, at the best of K = "
        f"{', '.join(map(str, args.draft_max))} on each workload; spechost's is over its plain "
        f"decoding in the bench run. Both over the same requests: those whose spechost output is "
        f"not degenerate (the degenerate ones are listed in results.md and kept in requests.csv; "
        f"llama-lookup does not run them). Unequal token counts mean the two decode different "
        f"text (llama.cpp's default numerics can change a greedy answer).",
    ]
    return "\n".join(lines) + "\n", rows


def llama_bench_curve(bench, peer_bin, args):
    """llama-bench's batch costs at the first workload's curve depth, spechost's numerics."""
    depth = bench["workloads"][0]["verify_cost"]["context_tokens"]
    command = [str(peer_bin / "llama-bench"), "-m", bench["model"], "-t", str(bench["threads"]),
               "-p", ",".join(map(str, LLAMA_BENCH_SIZES)), "-n", "0", "-d", str(depth),
               "-r", "5", "-o", "json", *SAME_NUMERICS]
    print("  llama-bench " + " ".join(command[1:]), file=sys.stderr)
    text = run(command, args.out / "logs" / "llama-bench.log")
    start = text.index("[")
    results = json.loads(text[start:text.rindex("]") + 1])
    return depth, {r["n_prompt"]: r["avg_ns"] / 1e3 for r in results if r["n_prompt"] > 0}


def verify_cost_table(bench, depth, theirs):
    workload = bench["workloads"][0]
    ours = {p["tokens"]: p["micros"] for p in workload["verify_cost"]["points"]}
    lines = [
        f"`{workload['name']}`: context of {depth} tokens, {bench['threads']} threads.",
        "",
        "| tokens | spechost verify µs (logits at every position) | relative to 1 "
        "| llama-bench µs (logits at the last position) | relative to 1 | spechost / llama-bench |",
        "|--:|--:|--:|--:|--:|--:|",
    ]
    for n in LLAMA_BENCH_SIZES:
        mine, other = ours.get(n), theirs.get(n)
        lines.append(
            f"| {n} | {fmt(mine, '{:.0f}')} | {fmt(mine / ours[1] if mine and ours.get(1) else None, '{:.2f}')} "
            f"| {fmt(other, '{:.0f}')} | {fmt(other / theirs[1] if other and theirs.get(1) else None, '{:.2f}')} "
            f"| {fmt(mine / other if mine and other else None, '{:.2f}')} |")
    lines += [
        "",
        "Both with flash attention over a Q8_0 KV cache and no weight repacking (spechost's "
        "batch-invariant numerics); llama-bench `-p N -n 0 -d D -r 5` computes logits only at "
        "the last position, spechost's verify batch at every position (the output layer runs on "
        "every row), so the gap between the columns is the price of verifying every position.",
    ]
    return "\n".join(lines) + "\n"


def main():
    args = arguments()
    bench = json.loads(args.bench_json.read_text())
    bench["model"] = str(bench["model"])
    peer_bin = args.bin
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        chosen, totals = measure(args, bench, peer_bin)
        peers, rows = peers_table(args, bench, chosen, totals)
        best, best_rows = best_lookup_table(args, bench, totals)
        depth, theirs = llama_bench_curve(bench, peer_bin, args)
    except ToolError as error:
        sys.exit(f"error: {error}")
    cost = verify_cost_table(bench, depth, theirs)
    (args.out / "peers.md").write_text(peers)
    (args.out / "best-lookup.md").write_text(best)
    (args.out / "verify-cost.md").write_text(cost)
    (args.out / "peers.json").write_text(json.dumps(
        {"rows": rows, "best_lookup": best_rows, "llama_bench_micros": theirs, "llama_bench_depth": depth}, indent=2) + "\n")
    print(peers)
    print(best)
    print(cost)


if __name__ == "__main__":
    main()
