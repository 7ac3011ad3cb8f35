#!/usr/bin/env python3
"""llama.cpp's own tools on exactly the prompts, model, threads and context of a `spechost bench`
run, next to spechost's numbers from its results.json.

Called by bench/peers.sh (which builds the tools); see there for what is compared. Writes the
prompts with `spechost prompts`, runs the tools, checks every answer with `spechost
check-outputs` (bench's degenerate-output rule), and compares only the requests whose every
answer, each tool's and spechost's plain decoding's, is an answer. Writes peers.md,
best-lookup.md, verify-cost.md, answers.jsonl (every tool run's figures, answer and verdict) and
peers.json into --out and prints the tables.
"""

import argparse
import csv
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
# What each tool run measured, kept in answers.jsonl.
RUN_FIGURES = ("tokens", "seconds", "drafted", "accepted")
# llama-simple takes no thread count: llama.cpp's default context parameters give it 4.
SIMPLE_THREADS = 4


def arguments():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--bench-json", required=True, type=Path, help="results.json of spechost bench")
    p.add_argument("--spechost", required=True, type=Path, help="the spechost binary")
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
    args = p.parse_args()
    args.prompts = args.out / "prompts"  # written by `spechost prompts` (write_prompts)
    return args


class ToolError(RuntimeError):
    pass


def run(command, log):
    """Runs a tool, keeps its output in `log`, returns (its stdout, stdout and stderr)."""
    done = subprocess.run(command, capture_output=True, text=True, errors="replace")
    text = done.stdout + "\n" + done.stderr
    log.write_text(text)
    if done.returncode != 0:
        tail = "\n".join(text.splitlines()[-15:])
        raise ToolError(f"{command[0]} exited {done.returncode} (log {log}):\n{tail}")
    return done.stdout, text


def answer_of(stdout, prompt, log):
    """The generated text: llama.cpp's tools print the prompt's tokens, then the answer's, on
    stdout (statistics go to stderr)."""
    at = stdout.find(prompt)
    if at >= 0:
        return stdout[at + len(prompt):]
    tail = prompt[-64:]
    at = stdout.find(tail)
    if at < 0:
        raise ToolError(f"the prompt's end is not on the tool's stdout (log {log}): "
                        "cannot tell its answer apart")
    return stdout[at + len(tail):]


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


def spechost_settings(bench):
    """spechost's flags that template and cap the prompts exactly as the bench run did."""
    flags = ["--model", bench["model"], "--ctx-size", str(bench["ctx_size"]),
             "--prompt-style", bench.get("prompt_style", "chat")]
    if bench["max_tokens_cap"]:
        flags += ["--max-tokens", str(bench["max_tokens_cap"])]
    for w in bench["workloads"]:
        flags += ["--workload", w["path"]]
    return flags


def write_prompts(args, bench):
    """`spechost prompts` into --out/prompts."""
    run([str(args.spechost), "prompts", *spechost_settings(bench), "--out", str(args.prompts)],
        args.out / "logs" / "spechost-prompts.log")


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


def answer_lengths(bench, bench_dir):
    """On raw prompts, the tokens of spechost's plain answer to each (workload, request id):
    llama.cpp's tools take no stop strings, so they are given that many tokens instead of going
    on to max_tokens past where spechost's answer stopped. Empty for chat prompts (both sides
    stop at the end of the turn)."""
    if bench.get("prompt_style") != "raw":
        return {}
    plain = {c["label"] for w in bench["workloads"] for c in w["configurations"]
             if not c["cascade"]}
    with (bench_dir / "requests.csv").open() as f:
        return {(row["workload"], row["request"]): int(row["generated_tokens"])
                for row in csv.DictReader(f)
                if row["configuration"] in plain and row["pass"] == "1"}


def measure(args, bench, peer_bin):
    """Runs every tool on every request spechost's figures count (its degenerate ones left out),
    interleaved, --repeat times. Returns the tools and, per (workload, tool), one dict per pass
    of request id -> that run's tokens, seconds, draft counts and answer."""
    chosen = tools(args, bench, peer_bin)
    logs = args.out / "logs"
    left_out = degenerate_requests(bench)
    lengths = answer_lengths(bench, args.bench_json.parent)
    results = {}
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
                    n = lengths.get((workload, entry["id"]), entry["max_tokens"])
                    stdout, text = run(command(prompt, n), log)
                    result = parse(text, log)
                    result["answer"] = answer_of(stdout, prompt, log)
                    passes = results.setdefault((workload, name), [])
                    if len(passes) <= pass_index:
                        passes.append({})
                    passes[pass_index][entry["id"]] = result
    return chosen, results


def judge(args, bench, results):
    """Every answer's verdict by bench's rule (`spechost check-outputs`), kept with the run's
    figures in answers.jsonl; returns the (workload, request id) pairs with a degenerate answer."""
    answers = args.out / "answers.jsonl"
    with answers.open("w") as f:
        for (workload, tool), passes in results.items():
            for pass_index, by_id in enumerate(passes):
                for request, result in by_id.items():
                    f.write(json.dumps({"workload": workload, "id": request, "tool": tool,
                                        "pass": pass_index + 1, "text": result["answer"]}
                                       | {key: result[key] for key in RUN_FIGURES}) + "\n")
    stdout, _ = run([str(args.spechost), "check-outputs", *spechost_settings(bench),
                     "--outputs", str(answers)], args.out / "logs" / "spechost-check-outputs.log")
    judged = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    answers.write_text("".join(json.dumps(j) + "\n" for j in judged))
    return {(j["workload"], j["id"]) for j in judged if j["degenerate"]}


def kept_requests(args, bench, theirs_degenerate):
    """Per workload, the request ids both sides count: spechost's plain answer and every llama.cpp
    answer are answers (neither echoes nor loops)."""
    ours = degenerate_requests(bench)
    return {workload: [e["id"] for e in entries
                       if (workload, e["id"]) not in ours | theirs_degenerate]
            for workload, entries in requests(args).items()}


def totals_over(passes, kept):
    """One sum per pass of tokens, seconds and draft counts over the kept requests."""
    sums = []
    for by_id in passes:
        chosen = [by_id[r] for r in kept if r in by_id]
        sums.append({key: sum(r[key] for r in chosen)
                     for key in RUN_FIGURES} | {"requests": len(chosen)})
    return sums


# requests.csv's column of each of RUN_FIGURES.
REQUESTS_CSV_COLUMNS = {"tokens": "generated_tokens", "seconds": "generation_seconds",
                        "drafted": "drafted", "accepted": "accepted"}


def spechost_over(bench, bench_dir, workload, kept):
    """spechost's configurations over the kept requests, from the bench run's requests.csv:
    per label, its passes summarised as llama.cpp's are, with its speedup over plain's median
    tok/s. Returns them and plain decoding's label."""
    by_label = {}  # label -> pass -> sums
    with (bench_dir / "requests.csv").open() as f:
        for row in csv.DictReader(f):
            if row["workload"] != workload or row["request"] not in kept:
                continue
            sums = by_label.setdefault(row["configuration"], {}).setdefault(
                row["pass"], {key: 0 for key in RUN_FIGURES} | {"requests": 0})
            for key, column in REQUESTS_CSV_COLUMNS.items():
                sums[key] += float(row[column])
            sums["requests"] += 1
    figures = {label: summarise(list(passes.values())) for label, passes in by_label.items()}
    plain = next((c["label"] for w in bench["workloads"] if w["name"] == workload
                  for c in w["configurations"] if not c["cascade"]), None)
    base = figures.get(plain, {}).get("tokens_per_second")
    for f in figures.values():
        rate = f["tokens_per_second"]
        f["speedup"] = rate / base if base and rate else None
    return figures, plain


def summarise(passes):
    rates = [p["tokens"] / p["seconds"] for p in passes if p["seconds"] > 0]
    drafted = sum(p["drafted"] for p in passes)
    return {
        "tokens_per_second": statistics.median(rates) if rates else None,
        "tokens": statistics.median(p["tokens"] for p in passes) if passes else 0,
        "acceptance": sum(p["accepted"] for p in passes) / drafted if drafted else None,
        "requests": passes[0]["requests"] if passes else 0,
        "passes": passes,
    }


def fmt(value, pattern):
    return "–" if value is None else pattern.format(value)


def comparison_note(args, bench, kept, theirs_degenerate):
    """Which requests each workload's rows compare, and why others are left out."""
    notes = []
    ours = degenerate_requests(bench)
    for workload, entries in requests(args).items():
        ids = [e["id"] for e in entries]
        mine = [r for r in ids if (workload, r) in ours]
        theirs = [r for r in ids if (workload, r) in theirs_degenerate]
        notes.append(f"- `{workload}`: {len(kept[workload])} of {len(ids)} requests compared"
                     + (f"; spechost's plain answer degenerate: {', '.join(mine)}" if mine else "")
                     + (f"; a llama.cpp answer degenerate: {', '.join(theirs)}" if theirs else ""))
    return notes


def peers_table(args, bench, chosen, results, kept, theirs_degenerate):
    rows = []
    lines = [
        "| workload | requests | llama.cpp tool | tok/s | speedup | acceptance "
        "| spechost | tok/s | speedup | acceptance | spechost / llama.cpp |",
        "|---|--:|---|--:|--:|--:|---|--:|--:|--:|--:|",
    ]
    for workload in requests(args):
        if not kept[workload]:
            continue  # nothing both sides answered
        ours_all, _ = spechost_over(bench, args.bench_json.parent, workload, set(kept[workload]))
        baseline = summarise(totals_over(results[(workload, "llama-lookup K=0")],
                                         kept[workload]))["tokens_per_second"]
        for name, label, _, _ in chosen:
            theirs = summarise(totals_over(results[(workload, name)], kept[workload]))
            ours = ours_all.get(label)
            their_rate = theirs["tokens_per_second"]
            plain = label == "plain"
            their_speedup = None if plain or not baseline or their_rate is None \
                else their_rate / baseline
            our_rate = ours["tokens_per_second"] if ours else None
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
                f"| {fmt(ours['acceptance'] * 100 if ours and ours['acceptance'] is not None and not plain else None, '{:.1f}%')} "
                f"| {ratio} |")
            rows.append({"workload": workload, "tool": name, "spechost": label,
                         "llama": theirs, "llama_speedup": their_speedup,
                         "spechost_tokens_per_second": our_rate,
                         "spechost_speedup": our_speedup, "requests": kept[workload]})
    notes = [
        "",
        f"llama.cpp's tools from the `llama-cpp-python==0.3.36` sdist (bench/llama-peer.sh), "
        f"greedy (`--temp 0`), {bench['threads']} threads, context {bench['ctx_size']}, each "
        f"request's max_tokens as in spechost bench (on raw prompts, which they cannot stop at "
        f"stop strings, the length of spechost's plain answer), with their default numerics; "
        f"{args.repeat} interleaved pass(es), medians. Both sides over the same requests: those "
        f"whose every answer is an answer by bench's degenerate-output rule (spechost's plain "
        f"decoding's, and every llama.cpp tool's in every pass: llama.cpp's default numerics "
        f"change its greedy answers with K, and an answer that loops is trivially predicted); "
        f"spechost's figures recomputed over them from the bench run's requests.csv. tok/s: "
        f"generated tokens over generation time, prompt excluded, summed over the workload's "
        f"requests. The speedup of a llama.cpp tool is over `llama-lookup K=0` (the same tool "
        f"and settings, no drafts); spechost's is over its plain decoding. `spechost / "
        f"llama.cpp` is the ratio of tok/s for plain decoding and of speedups otherwise.",
        "",
        *comparison_note(args, bench, kept, theirs_degenerate),
    ]
    if args.requests is not None:
        notes.append(f"\nOnly the first {args.requests} request(s) of each workload ran (a "
                     "quick check, not for publishing).")
    return "\n".join(lines + notes) + "\n", rows


def best_lookup_table(args, bench, results, kept, theirs_degenerate):
    """Every spechost cascade against llama-lookup at its best K on each workload."""
    lines = [
        "| workload | requests compared | llama-lookup best K | its speedup "
        "| spechost configuration | speedup | spechost / llama-lookup "
        "| tokens per pass, llama-lookup K=0 / spechost plain |",
        "|---|--:|--:|--:|---|--:|--:|--:|",
    ]
    rows = []
    for w in bench["workloads"]:
        name = w["name"]
        if not kept.get(name):
            continue
        ours, plain = spechost_over(bench, args.bench_json.parent, name, set(kept[name]))
        baseline = summarise(totals_over(results[(name, "llama-lookup K=0")], kept[name]))
        speedups = {}
        for k in args.draft_max:
            rate = summarise(totals_over(results[(name, f"llama-lookup K={k}")],
                                         kept[name]))["tokens_per_second"]
            if baseline["tokens_per_second"] and rate:
                speedups[k] = rate / baseline["tokens_per_second"]
        if not speedups:
            continue
        best_k = max(speedups, key=speedups.get)
        theirs = speedups[best_k]
        tokens = (f"{baseline['tokens']:.0f} / "
                  f"{fmt(ours[plain]['tokens'] if plain in ours else None, '{:.0f}')}")
        compared = f"{len(kept[name])}/{len(requests(args)[name])}"
        for c in w["configurations"]:
            if not c["cascade"] or c["label"] not in ours:
                continue
            speedup = ours[c["label"]]["speedup"]
            ratio = speedup / theirs if speedup else None
            lines.append(f"| {name} | {compared} | {best_k} | {theirs:.2f}x | {c['label']} "
                         f"| {fmt(speedup, '{:.2f}x')} | {fmt(ratio, '**{:.2f}**')} | {tokens} |")
            rows.append({"workload": name, "llama_lookup_k": best_k,
                         "llama_lookup_speedup": theirs, "spechost": c["label"],
                         "spechost_speedup": speedup, "ratio": ratio,
                         "requests": kept[name]})
    lines += [
        "",
        f"llama-lookup's speedup is over itself at K=0, at the best of K = "
        f"{', '.join(map(str, args.draft_max))} on each workload; spechost's is over its plain "
        f"decoding in the bench run, recomputed from its requests.csv over the same requests: "
        f"those whose every answer, spechost's plain decoding's and every llama.cpp tool's in "
        f"every pass, is an answer by bench's degenerate-output rule (answers.jsonl holds "
        f"llama.cpp's answers and their verdicts). Unequal token counts mean the two decode "
        f"different text (llama.cpp's default numerics can change a greedy answer)"
        + (". On raw prompts llama.cpp's tools, which take no stop strings, are given as many "
           "tokens as spechost's plain answer has (where its stop strings ended it)."
           if bench.get("prompt_style") == "raw" else "."),
        "",
        *comparison_note(args, bench, kept, theirs_degenerate),
    ]
    return "\n".join(lines) + "\n", rows


def llama_bench_curve(bench, peer_bin, args):
    """llama-bench's batch costs at the first workload's curve depth, spechost's numerics."""
    depth = bench["workloads"][0]["verify_cost"]["context_tokens"]
    command = [str(peer_bin / "llama-bench"), "-m", bench["model"], "-t", str(bench["threads"]),
               "-p", ",".join(map(str, LLAMA_BENCH_SIZES)), "-n", "0", "-d", str(depth),
               "-r", "5", "-o", "json", *SAME_NUMERICS]
    print("  llama-bench " + " ".join(command[1:]), file=sys.stderr)
    _, text = run(command, args.out / "logs" / "llama-bench.log")
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
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    try:
        write_prompts(args, bench)
        chosen, results = measure(args, bench, peer_bin)
        theirs_degenerate = judge(args, bench, results)
        kept = kept_requests(args, bench, theirs_degenerate)
        peers, rows = peers_table(args, bench, chosen, results, kept, theirs_degenerate)
        best, best_rows = best_lookup_table(args, bench, results, kept, theirs_degenerate)
        depth, theirs = llama_bench_curve(bench, peer_bin, args)
    except ToolError as error:
        sys.exit(f"error: {error}")
    cost = verify_cost_table(bench, depth, theirs)
    (args.out / "peers.md").write_text(peers)
    (args.out / "best-lookup.md").write_text(best)
    (args.out / "verify-cost.md").write_text(cost)
    (args.out / "peers.json").write_text(json.dumps(
        {"rows": rows, "best_lookup": best_rows, "llama_bench_micros": theirs,
         "llama_bench_depth": depth}, indent=2) + "\n")
    print(peers)
    print(best)
    print(cost)


if __name__ == "__main__":
    main()
