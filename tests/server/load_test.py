#!/usr/bin/env python3
"""Load test for an OpenAI-compatible server: concurrent streaming clients.

Starts llm-server itself, or targets any server already running (llama.cpp's
llama-server, for a comparison on the same model):

    python3 tests/server/load_test.py --server build/bin/llm-server --model MODEL.gguf
    python3 tests/server/load_test.py --url http://127.0.0.1:8080

For each concurrency level (default 1, 4, 16) that many clients each send
--requests streaming chat completions one after another (--max-tokens
tokens, default 48, with ignore_eos so every request generates them all; both
llm-server and llama-server understand it). Reported per level: requests
completed and lost (an HTTP error, a broken stream, a stream without a finish
reason or [DONE]), aggregate generated tokens per second (all tokens / wall
time of the level), and p50/p99 of time to first token (request sent to first
content) and of inter-token latency (gaps between content events; a server
that sends several tokens in one event shows fewer, longer gaps).
Only the standard library is used.
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse


def percentile(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def one_request(url, args, prompt_no):
    """Streams one chat completion; returns a dict of timings or raises."""
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=args.timeout)
    body = {
        "model": args.model_name,
        "messages": [{"role": "user", "content": "%s (%d)" % (args.prompt, prompt_no)}],
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    if args.model_name is None:
        del body["model"]
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = "Bearer " + args.api_key
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError("HTTP %d: %s" % (resp.status, resp.read()[:200]))
    times, n_tokens, finish, done = [], None, None, False
    while True:
        line = resp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            done = True
            break
        ev = json.loads(data)
        if "error" in ev:
            raise RuntimeError("stream error: %s" % ev["error"])
        if ev.get("usage"):
            n_tokens = ev["usage"].get("completion_tokens")
        for ch in ev.get("choices") or []:
            if (ch.get("delta") or {}).get("content"):
                times.append(time.perf_counter())
            if ch.get("finish_reason"):
                finish = ch["finish_reason"]
    conn.close()
    if not done or not finish or not times:
        raise RuntimeError("incomplete stream (done=%s, finish=%s, events=%d)" % (done, finish, len(times)))
    return {
        "ttft": times[0] - t0,
        "itl": [b - a for a, b in zip(times, times[1:])],
        "tokens": n_tokens if n_tokens is not None else len(times),
    }


def run_level(url, args, clients):
    results, errors, lock = [], [], threading.Lock()

    def client(i):
        for r in range(args.requests):
            try:
                out = one_request(url, args, i * 1000 + r)
                with lock:
                    results.append(out)
            except Exception as e:  # noqa: BLE001 - counted as lost
                with lock:
                    errors.append(repr(e))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    ttft = [r["ttft"] for r in results]
    itl = [x for r in results for x in r["itl"]]
    return {
        "clients": clients, "requests": clients * args.requests, "ok": len(results), "lost": len(errors),
        "tokens": tokens, "wall": wall, "tps": tokens / wall if wall > 0 else 0.0,
        "ttft50": percentile(ttft, 50), "ttft99": percentile(ttft, 99),
        "itl50": percentile(itl, 50), "itl99": percentile(itl, 99), "errors": errors[:3],
    }


def start_server(args, parallel):
    cmd = [args.server, "-m", args.model, "--port", "0", "--parallel", str(parallel),
           "--queue", str(max(32, parallel * 2))]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.chat_template_file:
        cmd += ["--chat-template-file", args.chat_template_file]
    if args.api_key:
        cmd += ["--api-key", args.api_key]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(1)
    proc.kill()
    sys.exit("load_test: the server did not start")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="target this running server instead of starting llm-server")
    ap.add_argument("--server", help="llm-server binary to start")
    ap.add_argument("--model", help="model file for the started server")
    ap.add_argument("--chat-template-file", help="passed to the started server")
    ap.add_argument("--threads", type=int, default=0, help="passed to the started server")
    ap.add_argument("--model-name", default=None, help="'model' field of the requests (default: none sent)")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--clients", default="1,4,16", help="concurrency levels (default 1,4,16)")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per level (default 2)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--prompt", default="Write a short story about a robot who learns to paint.")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    levels = [int(x) for x in args.clients.split(",") if x]

    proc = None
    url = args.url
    if not url:
        if not args.server or not args.model:
            ap.error("give --url, or --server and --model")
        proc, url = start_server(args, max(levels))
    try:
        rows = []
        for c in levels:
            row = run_level(url, args, c)
            rows.append(row)
            print("clients %2d done: %d ok, %d lost%s" % (c, row["ok"], row["lost"],
                                                          (" " + "; ".join(row["errors"])) if row["lost"] else ""),
                  file=sys.stderr, flush=True)
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)

    print("target: %s, %d-token streamed chat completions, %d per client" % (
        args.url or os.path.basename(args.model), args.max_tokens, args.requests))
    print("| clients | requests | lost | tokens | wall s | agg tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms |")
    print("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for r in rows:
        print("| %d | %d | %d | %d | %.2f | %.1f | %.1f | %.1f | %.2f | %.2f |" % (
            r["clients"], r["requests"], r["lost"], r["tokens"], r["wall"], r["tps"], r["ttft50"] * 1e3,
            r["ttft99"] * 1e3, r["itl50"] * 1e3, r["itl99"] * 1e3))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if any(r["lost"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
