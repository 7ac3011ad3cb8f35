#!/usr/bin/env python3
"""Overload test of a running `spechost serve`: offers a multiple of its capacity and reports.

Steps, in order:
  1. fetches the expected answer: the fixed request with `"speculative": {"cascade": "none"}`
     (plain decoding, greedy);
  2. measures capacity: the fixed request, one at a time, for --calibrate-seconds (at least
     --calibrate-requests requests); capacity = completed requests/s of one slot x slots
     (from /health);
  3. offers --factor x capacity for --seconds: requests start on a fixed schedule (open loop),
     each on its own client thread (at most --clients at once; a start that finds none free is
     counted as "not sent"), and run to their end (or --timeout);
  4. samples the server's RSS (VmRSS of /proc/PID/status) every --rss-interval throughout;
  5. meanwhile holds --idle connections that send nothing and --slowloris connections that send
     a request's headers one byte every --slowloris-interval seconds, and records when the
     server closed each (they must not outlast its --header-timeout); all are closed by this
     script when the load ends;
  6. prints a markdown summary: offered and completed requests/s, counts by status (200, 429,
     503, other, connection errors), p50/p99 latency of completed requests, RSS min/max, how
     many idle and slowloris connections the server closed and the longest one stayed open,
     and whether every completed output equals the plain-decoding answer; --json writes the
     same as JSON.

The server's own cascade and policy draft the load requests (the request names none), so the
last check is that speculation under overload still gives the plain-decoding text.

Python 3 standard library only. Example:
  python3 bench/overload.py --base-url http://127.0.0.1:8080 --pid "$(pidof spechost)" --seconds 30
"""

import argparse
import http.client
import json
import math
import socket
import sys
import threading
import time
import urllib.parse

PROMPT = "def fibonacci(n):"
MAX_TOKENS = 24


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8080")
    parser.add_argument("--pid", type=int, help="server process id, for its RSS (Linux /proc)")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long to offer load")
    parser.add_argument("--factor", type=float, default=4.0, help="offered rate / capacity")
    parser.add_argument("--clients", type=int, default=64, help="most requests in flight")
    parser.add_argument("--calibrate-seconds", type=float, default=5.0)
    parser.add_argument("--calibrate-requests", type=int, default=3)
    parser.add_argument("--prompt", default=PROMPT, help="prompt of every request")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    parser.add_argument("--rss-interval", type=float, default=0.1, help="seconds")
    parser.add_argument("--idle", type=int, default=0,
                        help="connections held open without sending anything")
    parser.add_argument("--slowloris", type=int, default=0,
                        help="connections that send their headers a byte at a time")
    parser.add_argument("--slowloris-interval", type=float, default=0.5,
                        help="seconds between two bytes of a slowloris connection")
    parser.add_argument("--json", help="also write the results as JSON to this file")
    return parser.parse_args()


class Client:
    """POSTs JSON to one server; a new connection per request."""

    def __init__(self, base_url, timeout):
        url = urllib.parse.urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            sys.exit(f"error: --base-url {base_url}: give http://HOST:PORT")
        self.host = url.hostname
        self.port = url.port or 80
        self.timeout = timeout

    def request(self, method, path, body=None):
        """Returns (status, parsed JSON body or None); raises OSError or HTTPException when the
        connection fails."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read()
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = None
            return response.status, parsed
        finally:
            connection.close()


def completion_body(args, plain):
    body = {"prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": 0}
    if plain:
        body["speculative"] = {"cascade": "none"}
    return body


def completion_text(body):
    try:
        return body["choices"][0]["text"]
    except (KeyError, IndexError, TypeError):
        return None


class RssSampler(threading.Thread):
    """Reads VmRSS of a process every `interval` seconds until stopped."""

    def __init__(self, pid, interval):
        super().__init__(daemon=True)
        self.path = f"/proc/{pid}/status"
        self.interval = interval
        self.samples = []
        self.stopped = threading.Event()

    def read(self):
        try:
            with open(self.path) as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
        return None

    def run(self):
        while not self.stopped.is_set():
            rss = self.read()
            if rss is not None:
                self.samples.append(rss)
            self.stopped.wait(self.interval)


class HeldConnection(threading.Thread):
    """One connection that sends nothing (idle) or trickles a request's headers (slowloris)
    until the server closes it or `stopped` is set; `held` is how long it stayed open and
    `closed_by_server` whether the server ended it."""

    def __init__(self, client, slow, interval, stopped):
        super().__init__(daemon=True)
        self.client = client
        self.slow = slow
        self.interval = interval
        self.stopped = stopped
        self.held = None
        self.closed_by_server = False

    def run(self):
        started = time.monotonic()
        headers = (
            f"POST /v1/completions HTTP/1.1\r\nHost: {self.client.host}\r\n"
            "Content-Type: application/json\r\nX-Padding: " + "a" * 4096
        ).encode()
        try:
            with socket.create_connection((self.client.host, self.client.port), timeout=5) as s:
                s.settimeout(self.interval)
                sent = 0
                while not self.stopped.is_set():
                    if self.slow and sent < len(headers):
                        try:
                            s.sendall(headers[sent:sent + 1])
                        except OSError:
                            self.closed_by_server = True
                            break
                        sent += 1
                    try:
                        if s.recv(4096) == b"":
                            self.closed_by_server = True
                            break
                    except socket.timeout:
                        continue
                    except OSError:
                        self.closed_by_server = True
                        break
        except OSError:
            self.closed_by_server = True
        self.held = time.monotonic() - started


def hold_connections(client, args, stopped):
    """Starts the idle and slowloris connections; returns their threads."""
    held = [HeldConnection(client, False, args.slowloris_interval, stopped)
            for _ in range(args.idle)]
    held += [HeldConnection(client, True, args.slowloris_interval, stopped)
             for _ in range(args.slowloris)]
    for connection in held:
        connection.start()
    return held


def calibrate(client, args, expected):
    """Completed requests/s of one slot, one request at a time."""
    started = time.monotonic()
    done = 0
    while done < args.calibrate_requests or time.monotonic() - started < args.calibrate_seconds:
        status, body = client.request("POST", "/v1/completions", completion_body(args, False))
        if status != 200:
            sys.exit(f"error: calibration request answered {status}: {body}")
        if completion_text(body) != expected:
            sys.exit(f"error: calibration output differs from plain decoding: {body}")
        done += 1
    return done / (time.monotonic() - started)


class Load:
    """Open-loop load: request starts on a fixed schedule, results kept per request."""

    def __init__(self, client, args, expected):
        self.client = client
        self.args = args
        self.expected = expected
        self.slots = threading.BoundedSemaphore(args.clients)
        self.lock = threading.Lock()
        self.results = []  # (status or "error", latency seconds, output correct or None)
        self.not_sent = 0
        self.threads = []

    def one(self):
        started = time.monotonic()
        try:
            status, body = self.client.request(
                "POST", "/v1/completions", completion_body(self.args, False)
            )
            correct = completion_text(body) == self.expected if status == 200 else None
            result = (status, time.monotonic() - started, correct)
        except (OSError, http.client.HTTPException) as error:
            result = ("error", time.monotonic() - started, None)
            print(f"connection error: {error}", file=sys.stderr)
        finally:
            self.slots.release()
        with self.lock:
            self.results.append(result)

    def run(self, rate):
        interval = 1.0 / rate
        started = time.monotonic()
        n = 0
        while True:
            due = started + n * interval
            if due - started >= self.args.seconds:
                break
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            n += 1
            if not self.slots.acquire(blocking=False):
                self.not_sent += 1
                continue
            thread = threading.Thread(target=self.one, daemon=True)
            thread.start()
            self.threads.append(thread)
        offered_seconds = time.monotonic() - started
        for thread in self.threads:
            thread.join(self.args.timeout)
        return offered_seconds, time.monotonic() - started


def percentile(values, fraction):
    """Nearest-rank percentile of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def summarize(args, capacity, slots, load, offered_seconds, total_seconds, rss, held):
    counts = {"200": 0, "429": 0, "503": 0, "other": 0, "error": 0}
    for status, _, _ in load.results:
        key = str(status) if str(status) in counts else "other"
        counts[key] += 1
    completed = [r for r in load.results if r[0] == 200]
    latencies = [latency for _, latency, _ in completed]
    return {
        "prompt": args.prompt,
        "max_tokens": args.max_tokens,
        "slots": slots,
        "capacity_rps": capacity,
        "factor": args.factor,
        "seconds": args.seconds,
        "sent": len(load.results),
        "not_sent": load.not_sent,
        "offered_rps": (len(load.results) + load.not_sent) / offered_seconds,
        "completed": len(completed),
        "completed_rps": len(completed) / total_seconds,
        "status_counts": counts,
        "latency_p50_s": percentile(latencies, 0.5) if latencies else None,
        "latency_p99_s": percentile(latencies, 0.99) if latencies else None,
        "wrong_outputs": sum(1 for _, _, correct in completed if not correct),
        "rss_min_bytes": min(rss) if rss else None,
        "rss_max_bytes": max(rss) if rss else None,
        "idle": args.idle,
        "idle_closed_by_server": sum(1 for c in held if not c.slow and c.closed_by_server),
        "slowloris": args.slowloris,
        "slowloris_closed_by_server": sum(1 for c in held if c.slow and c.closed_by_server),
        "held_longest_s": max((c.held for c in held if c.held is not None), default=None),
    }


def markdown(summary):
    def mib(value):
        return "n/a (no --pid)" if value is None else f"{value / (1 << 20):.0f} MiB"

    def secs(value):
        return "n/a" if value is None else f"{value:.2f} s"

    counts = summary["status_counts"]
    correct = summary["completed"] - summary["wrong_outputs"]
    rows = [
        ("capacity (measured, one request at a time)",
         f"{summary['capacity_rps']:.2f} req/s ({summary['slots']} slot(s))"),
        ("offered",
         f"{summary['offered_rps']:.2f} req/s ({summary['factor']:g}x capacity for "
         f"{summary['seconds']:g} s; {summary['sent']} sent, {summary['not_sent']} not sent: "
         "no free client)"),
        ("completed",
         f"{summary['completed_rps']:.2f} req/s ({summary['completed']} requests; over the "
         "offered time plus the drain of what was queued)"),
        ("answers 200 / 429 / 503 / other / connection errors",
         f"{counts['200']} / {counts['429']} / {counts['503']} / {counts['other']} / "
         f"{counts['error']}"),
        ("latency of completed requests, p50 / p99",
         f"{secs(summary['latency_p50_s'])} / {secs(summary['latency_p99_s'])}"),
        ("server RSS, min / max",
         f"{mib(summary['rss_min_bytes'])} / {mib(summary['rss_max_bytes'])}"),
        ("idle / slowloris connections closed by the server",
         f"{summary['idle_closed_by_server']} of {summary['idle']} / "
         f"{summary['slowloris_closed_by_server']} of {summary['slowloris']} "
         f"(longest held {secs(summary['held_longest_s'])})"),
        ("completed outputs equal to plain decoding",
         f"{correct} / {summary['completed']}"),
    ]
    lines = [
        f"Overload: `{summary['prompt']}`, max_tokens {summary['max_tokens']}, greedy",
        "",
        "| | |",
        "|---|---|",
    ]
    lines += [f"| {name} | {value} |" for name, value in rows]
    return "\n".join(lines)


def main():
    args = parse_args()
    client = Client(args.base_url, args.timeout)
    status, health = client.request("GET", "/health")
    if status != 200:
        sys.exit(f"error: {args.base_url}/health answered {status}; is spechost serve running?")
    slots = int(health.get("slots", 1))
    rss = RssSampler(args.pid, args.rss_interval) if args.pid else None
    if rss:
        rss.start()

    status, body = client.request("POST", "/v1/completions", completion_body(args, True))
    expected = completion_text(body)
    if status != 200 or expected is None:
        sys.exit(f"error: the plain-decoding request answered {status}: {body}")
    capacity = calibrate(client, args, expected) * slots
    stop_holding = threading.Event()
    held = hold_connections(client, args, stop_holding)
    load = Load(client, args, expected)
    offered_seconds, total_seconds = load.run(args.factor * capacity)
    stop_holding.set()
    for connection in held:
        connection.join(5 + args.slowloris_interval)
    if rss:
        rss.stopped.set()
        rss.join()

    summary = summarize(
        args, capacity, slots, load, offered_seconds, total_seconds,
        rss.samples if rss else [], held,
    )
    print(markdown(summary))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(summary, out, indent=2)
    status, _ = client.request("GET", "/health")
    if status != 200:
        sys.exit(f"error: the server no longer answers /health ({status})")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (OSError, http.client.HTTPException) as error:
        sys.exit(f"error: {error}; is the server at --base-url running?")
