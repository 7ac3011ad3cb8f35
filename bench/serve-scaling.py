#!/usr/bin/env python3
"""One summary of bench/serve-scaling.sh's runs: every row of every `spechost bench --clients`
result (serve-results.json) in one markdown table, a tok/s-by-clients table, and the in-process
run's single-stream comparison.

--runs is a TSV of `system<TAB>configuration<TAB>results dir` lines, one per bench run. A run of
the in-process server (configuration empty) holds every configuration and client count, checked
against its plain decoding at the fewest clients by bench itself. A run of a server at --url
holds one configuration at one client count (the server is restarted with -np/--parallel C); its
answers are compared here with the same system's first configuration (no speculation) at the
fewest clients, through the reference texts each run records: `identical` is `yes` only when
the run found no difference within itself and every reference equals that one.
"""
import argparse
import json
from pathlib import Path


def load(runs_tsv):
    runs = []
    for line in Path(runs_tsv).read_text().splitlines():
        if not line.strip():
            continue
        system, configuration, directory = line.split("\t")
        results = json.loads((Path(directory) / "serve-results.json").read_text())
        runs.append({"system": system, "configuration": configuration, "results": results})
    return runs


def references(results):
    return {(r["workload"], r["request"]): r["text"] for r in results["references"]}


def rows(runs):
    """One dict per level: system, configuration, clients, figures, identical."""
    out = []
    # The reference of each system: its first configuration's run at the fewest clients.
    first_configuration = {}
    for run in runs:
        if run["configuration"]:
            first_configuration.setdefault(run["system"], run["configuration"])
    reference_runs = {}
    for run in runs:
        if run["configuration"] and run["configuration"] == first_configuration[run["system"]]:
            clients = min(row["clients"] for row in run["results"]["rows"])
            if run["system"] not in reference_runs or clients < reference_runs[run["system"]][0]:
                reference_runs[run["system"]] = (clients, run)
    for run in runs:
        results = run["results"]
        same = True
        if run["configuration"]:
            expected = references(reference_runs[run["system"]][1]["results"])
            got = references(results)
            same = all(expected.get(key, text) == text for key, text in got.items())
        for row in results["rows"]:
            configuration = run["configuration"] or row["configuration"]
            out.append({
                "system": run["system"],
                "configuration": configuration,
                "clients": row["clients"],
                "figures": row["figures"],
                "identical": row["identical"] and same,
            })
    return out


def fmt(value, digits=1):
    return "–" if value is None else f"{value:.{digits}f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", required=True, help="system<TAB>configuration<TAB>dir lines")
    p.add_argument("--model", required=True)
    p.add_argument("--threads", required=True)
    p.add_argument("--ctx-size", required=True)
    args = p.parse_args()
    runs = load(args.runs)
    levels = rows(runs)
    counts = sorted({level["clients"] for level in levels})
    names = []
    for level in levels:
        name = (level["system"], level["configuration"])
        if name not in names:
            names.append(name)
    rate = {(l["system"], l["configuration"], l["clients"]): l["figures"]["tokens_per_second"]
            for l in levels}

    first = runs[0]["results"]["settings"] if runs else {}
    print(f"Server scaling on {args.model} ({first.get('prompt_style', '?')} prompts, greedy, "
          f"{first.get('requests_per_client', '?')} requests per client per level after one warm-up, "
          f"streamed, {first.get('passes', 1)} pass(es) of each level; {args.threads} threads, "
          f"{args.ctx_size} tokens of context per slot). tok/s: all clients' completion tokens over "
          "the pass's wall time, the median pass.\n")
    columns = [f"{c} client{'s' if c > 1 else ''}" for c in counts]
    print("| system | configuration | " + " | ".join(columns) + f" | {counts[-1]} / 1 |")
    print("|---|---|" + "--:|" * (len(counts) + 1))
    for system, configuration in names:
        cells = [fmt(rate.get((system, configuration, c))) for c in counts]
        one, most = rate.get((system, configuration, 1)), rate.get((system, configuration, counts[-1]))
        scale = f"{most / one:.2f}x" if one and most else "–"
        print(f"| {system} | {configuration} | " + " | ".join(cells) + f" | {scale} |")

    print("\n| system | configuration | clients | tok/s | vs 1 client | TTFT p50 ms | TTFT p95 ms "
          "| per-token p50 ms | per-token p95 ms | identical |")
    print("|---|---|--:|--:|--:|--:|--:|--:|--:|---|")
    for level in levels:
        f = level["figures"]
        one = rate.get((level["system"], level["configuration"], 1))
        ttft = f.get("time_to_first_token") or {}
        tpot = f.get("time_per_output_token") or {}
        print(f"| {level['system']} | {level['configuration']} | {level['clients']} "
              f"| {f['tokens_per_second']:.1f} "
              f"| {fmt(f['tokens_per_second'] / one, 2) + 'x' if one else '–'} "
              f"| {fmt(ttft.get('p50_ms'))} | {fmt(ttft.get('p95_ms'))} "
              f"| {fmt(tpot.get('p50_ms'))} | {fmt(tpot.get('p95_ms'))} "
              f"| {'yes' if level['identical'] else '**no**'} |")

    for run in runs:
        single = run["results"].get("single_stream") or []
        if not single:
            continue
        print(f"\nOne stream ({run['system']}): `run` through the engine next to `serve` with one "
              "client on the same requests, generation tok/s (prompt excluded):\n")
        print("| configuration | run tok/s | serve tok/s | serve / run |")
        print("|---|--:|--:|--:|")
        for s in single:
            print(f"| {s['configuration']} | {s['run_tokens_per_second']:.1f} "
                  f"| {fmt(s['serve_tokens_per_second'])} "
                  f"| {fmt(s['serve_over_run'], 2) + 'x' if s['serve_over_run'] else '–'} |")
    print("\nidentical: every answer equals the same system's answer without speculation at the "
          "fewest clients (spechost in-process: its plain decoding at one client).")


if __name__ == "__main__":
    main()
