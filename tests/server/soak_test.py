#!/usr/bin/env python3
"""Soak test: the real `dsaserve serve --model builtin:demo` on a small KV pool (--kv-pages 24, so requests are
retracted and recomputed) under mixed concurrent traffic for a bounded time (--seconds, default 90): chat and
completions, streamed and not, n > 1, forced tool calls, json_schema, logprobs and echo, priorities, clients
that cancel a stream or disconnect before the answer, and bad requests. Asserts: every valid request is
answered 200 and well formed (streams end with [DONE], tool calls and JSON parse), every bad one gets a 4xx
OpenAI error object, the server never stops serving; afterwards nothing runs or waits, the KV pages in use are
exactly the prefix cache's own, no aborted request is missing from dsaserve_aborted_requests_total, and the
resident memory of the last third of the run stays within a bound of the first third's. Only the standard
library (http.client, sockets)."""
import argparse
import http.client
import json
import random
import socket
import subprocess
import sys
import threading
import time

MODEL = "builtin:demo"
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Tokyo"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}}},
    {"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object", "properties": {
            "zone": {"type": "string", "maxLength": 6}}, "required": ["zone"]}}},
]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}},
          "required": ["a", "b"], "additionalProperties": False}
WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hum old songs".split()


class Failure(Exception):
    pass


def check(cond, what):
    if not cond:
        raise Failure(what)


def prompt(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def request(port, method, path, body=None, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    c.request(method, path, body=data, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    raw = r.read()
    c.close()
    return r.status, raw


def sse(raw):
    events, done = [], False
    for block in raw.decode().split("\n\n"):
        if not block.startswith("data: "):
            continue
        d = block[6:]
        if d == "[DONE]":
            done = True
        else:
            events.append(json.loads(d))
    return events, done


def valid_call(call):
    check(call["type"] == "function" and call["id"], f"tool call {call}")
    a = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "get_weather":
        check(a["city"] in ("Paris", "Tokyo") and 1 <= a["days"] <= 7, f"arguments {a}")
    else:
        check(call["function"]["name"] == "get_time" and isinstance(a["zone"], str), f"call {call}")


# ---- the scenarios: each returns the kind of request it made ----

def chat(port, rng):
    n = rng.randint(1, 3)
    body = {"messages": [{"role": "user", "content": prompt(rng, 2, 60)}], "max_tokens": rng.randint(1, 48),
            "n": n, "temperature": rng.choice([0, 0.7, 1.0]), "seed": rng.randint(0, 1000),
            "priority": rng.randint(-5, 5)}
    if rng.random() < 0.3:
        body["logprobs"], body["top_logprobs"] = True, rng.randint(0, 5)
    status, raw = request(port, "POST", "/v1/chat/completions", body)
    check(status == 200, f"chat: {status} {raw[:300]}")
    r = json.loads(raw)
    check(len(r["choices"]) == n and r["usage"]["completion_tokens"] >= n, f"chat: {r}")
    for ch in r["choices"]:
        check(ch["finish_reason"] in ("stop", "length"), f"chat finish {ch}")
    return "chat"


def chat_stream(port, rng):
    body = {"messages": [{"role": "user", "content": prompt(rng, 2, 80)}], "max_tokens": rng.randint(1, 64),
            "stream": True, "stream_options": {"include_usage": True}, "n": rng.randint(1, 2),
            "priority": rng.randint(-5, 5)}
    status, raw = request(port, "POST", "/v1/chat/completions", body)
    check(status == 200, f"chat stream: {status} {raw[:300]}")
    events, done = sse(raw)
    check(done and events and "usage" in events[-1] and events[-1]["usage"]["completion_tokens"] > 0,
          f"chat stream end: {events[-1:]}")
    return "chat_stream"


def completion(port, rng):
    stream = rng.random() < 0.5
    body = {"prompt": prompt(rng, 1, 100), "max_tokens": rng.randint(1, 40), "stream": stream,
            "echo": rng.random() < 0.3, "priority": rng.randint(-5, 5)}
    if rng.random() < 0.4:
        body["logprobs"] = rng.randint(0, 4)
    if rng.random() < 0.2:
        body["prompt"] = [rng.randint(3, 255) for _ in range(rng.randint(1, 50))]
    status, raw = request(port, "POST", "/v1/completions", body)
    check(status == 200, f"completion: {status} {raw[:300]}")
    if stream:
        events, done = sse(raw)
        check(done and events, "completion stream without [DONE]")
    else:
        r = json.loads(raw)
        check(r["choices"][0]["finish_reason"] in ("stop", "length"), f"completion {r}")
        if "logprobs" in body:
            lp = r["choices"][0]["logprobs"]
            check(len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]), f"logprobs {lp}")
    return "completion"


def tools(port, rng):
    stream = rng.random() < 0.4
    choice = rng.choice(["required", {"type": "function", "function": {"name": "get_time"}}])
    body = {"messages": [{"role": "user", "content": "what now? " + prompt(rng, 1, 10)}], "tools": TOOLS,
            "tool_choice": choice, "max_tokens": rng.choice([24, 64, 160]), "stream": stream,
            "chat_template_kwargs": {"enable_thinking": rng.random() < 0.5}}
    status, raw = request(port, "POST", "/v1/chat/completions", body)
    check(status == 200, f"tools: {status} {raw[:300]}")
    if stream:
        events, done = sse(raw)
        check(done, "tools stream without [DONE]")
        calls, finish = {}, None
        for e in events:
            for ch in e.get("choices", []):
                finish = ch.get("finish_reason") or finish
                for t in ch["delta"].get("tool_calls", []):
                    c = calls.setdefault(t["index"], {"type": "function", "id": "", "function":
                                                      {"name": "", "arguments": ""}})
                    c["id"] = t.get("id", c["id"])
                    c["function"]["name"] += t["function"].get("name", "")
                    c["function"]["arguments"] += t["function"].get("arguments", "")
        calls = list(calls.values())
    else:
        ch = json.loads(raw)["choices"][0]
        finish, calls = ch["finish_reason"], ch["message"].get("tool_calls") or []
    check(finish in ("tool_calls", "length"), f"tools finish {finish}")
    check(finish == "length" or calls, "tools: finish_reason tool_calls without calls")
    for c in calls:  # a call cut by max_tokens is never sent
        valid_call(c)
    return "tools"


def schema(port, rng):
    body = {"messages": [{"role": "user", "content": prompt(rng, 1, 20)}], "max_tokens": 64,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}}
    status, raw = request(port, "POST", "/v1/chat/completions", body)
    check(status == 200, f"schema: {status} {raw[:300]}")
    ch = json.loads(raw)["choices"][0]
    if ch["finish_reason"] == "stop":
        v = json.loads(ch["message"]["content"])
        check(isinstance(v["a"], int) and isinstance(v["b"], bool), f"schema value {v}")
    return "schema"


def raw_send(port, body, read_bytes):
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(data)).encode() + b"\r\n\r\n" + data)
    got = b""
    while len(got) < read_bytes:
        chunk = s.recv(4096)
        if not chunk:
            break
        got += chunk
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # reset
    s.close()
    return got


def cancel(port, rng):
    body = {"messages": [{"role": "user", "content": prompt(rng, 5, 80)}], "max_tokens": 400, "stream": True,
            "n": rng.randint(1, 3), "ignore_eos": True}
    got = raw_send(port, body, rng.randint(200, 1500))
    check(got.startswith(b"HTTP/1.1 200"), f"cancel: {got[:200]}")
    return "aborted"


def disconnect(port, rng):
    body = {"messages": [{"role": "user", "content": prompt(rng, 5, 80)}], "max_tokens": 100}
    raw_send(port, body, 0)
    return "disconnect"


BAD = [
    ("POST", "/v1/chat/completions", b"{not json"),
    ("POST", "/v1/chat/completions", {"messages": "hi"}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": -1}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 99}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 10 ** 9}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS,
                                      "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "response_format":
                                      {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}}),
    ("POST", "/v1/completions", {"prompt": [10 ** 7]}),
    ("POST", "/v1/completions", {"prompt": "x", "logprobs": 50}),
    ("POST", "/v1/completions", {"prompt": "x", "model": "other"}),
    ("GET", "/v1/chat/completions", None),
    ("GET", "/no/such/route", None),
]


def bad(port, rng):
    method, path, body = rng.choice(BAD)
    status, raw = request(port, method, path, body)
    check(400 <= status < 500, f"bad request {path} {body}: {status}")
    check("error" in json.loads(raw) and json.loads(raw)["error"]["message"], f"error body {raw[:200]}")
    return "bad"


SCENARIOS = [(chat, 4), (chat_stream, 3), (completion, 3), (tools, 2), (schema, 1), (cancel, 1),
             (disconnect, 1), (bad, 2)]


def metrics(port):
    status, raw = request(port, "GET", "/metrics")
    check(status == 200, "metrics")
    out = {}
    for line in raw.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsaserve", required=True)
    ap.add_argument("--seconds", type=float, default=90)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    p = subprocess.Popen([args.dsaserve, "serve", "--model", MODEL, "--port", "0", "--kv-pages", "24",
                          "--max-running-requests", "16", "--tool-call-parser", "glm45", "--reasoning-parser",
                          "glm45", "--enable-priority-scheduling", "--check-integrity"],
                         stdout=subprocess.PIPE, text=True)
    port = None
    for line in p.stdout:
        if "listening on http://127.0.0.1:" in line:
            port = int(line.split("127.0.0.1:")[1].split()[0])
            break
    assert port, "the server did not start"
    threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()

    counts, failures, lock = {}, [], threading.Lock()
    stop_at = time.monotonic() + args.seconds
    rss = []

    def worker(k):
        rng = random.Random(args.seed * 1000 + k)
        names, weights = zip(*SCENARIOS)
        while time.monotonic() < stop_at and not failures:
            fn = rng.choices(names, weights)[0]
            try:
                kind = fn(port, rng)
            except Exception as e:  # noqa: BLE001 (a failure of any kind is reported)
                with lock:
                    failures.append(f"{fn.__name__}: {type(e).__name__}: {e}")
                return
            with lock:
                counts[kind] = counts.get(kind, 0) + 1

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(args.workers)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        rss.append((time.monotonic(), rss_kb(p.pid)))
        time.sleep(1)
    for t in threads:
        t.join()
    try:
        if failures:
            raise Failure("; ".join(failures[:5]))
        check(p.poll() is None, "the server exited")
        # Quiescent: nothing runs, waits or is being answered; every used KV page is the prefix cache's.
        deadline = time.monotonic() + 60
        while True:
            m = metrics(port)
            idle = (m["dsaserve_num_running_requests"] == 0 and m["dsaserve_num_waiting_requests"] == 0
                    and m["dsaserve_active_http_requests"] == 0)
            if idle or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        check(idle, f"not idle after the run: {m}")
        check(m["dsaserve_kv_pages_used"] == m["dsaserve_prefix_cache_pages"],
              f"{m['dsaserve_kv_pages_used']} KV pages used, the prefix cache holds "
              f"{m['dsaserve_prefix_cache_pages']}: pages leaked")
        aborted = sum(v for k, v in m.items() if k.startswith("dsaserve_aborted_requests_total"))
        check(aborted >= counts.get("aborted", 0),
              f"{counts.get('aborted', 0)} cancelled streams, {aborted} counted as aborted")
        # Steady memory: the last third's peak within 1.5x + 64 MiB of the first third's.
        third = len(rss) // 3
        first = max(r for _, r in rss[:max(third, 1)])
        last = max(r for _, r in rss[-max(third, 1):])
        check(last <= first * 1.5 + 65536, f"RSS grew from {first} kB to {last} kB")
        status, _ = request(port, "GET", "/health")
        check(status == 200, "health after the run")
        total = sum(counts.values())
        print(f"soak: {total} requests in {args.seconds:.0f} s ({json.dumps(counts, sort_keys=True)}), "
              f"retractions {m['dsaserve_retractions_total']:.0f}, aborted {aborted:.0f}, "
              f"RSS {first} -> {last} kB, prefix-cache pages {m['dsaserve_prefix_cache_pages']:.0f}")
    except Failure as e:
        print(f"FAIL: {e}")
        p.kill()
        return 1
    p.terminate()
    rc = p.wait(timeout=60)
    if rc != 0:
        print(f"FAIL: SIGTERM exit status {rc}")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
