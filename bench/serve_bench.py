#!/usr/bin/env python3
"""Serving benchmark for `dsaserve serve`: N concurrent streaming clients send M requests of random prompt and
output lengths to /v1/completions; reports request throughput, output tokens/s, TTFT and ITL percentiles, and
the scheduler's own CPU time per engine step (from /metrics). Standard library only.

  python3 bench/serve_bench.py --dsaserve build/src/cli/dsaserve -- --model builtin --kv-pages 1024
  python3 bench/serve_bench.py --url http://127.0.0.1:30000      # an already running server
  # GPU, one server, batch 1/8/32/64 (4 requests per client each):
  python3 bench/serve_bench.py --dsaserve build/src/cli/dsaserve --device cuda --concurrency-list 1,8,32,64 \
      --requests-per-client 4 -- --model ../shared/fixtures/models/realdims --tokenizer builtin:bytes
"""
import argparse
import concurrent.futures as cf
import json
import random
import subprocess
import sys
import threading
import time
import urllib.request


def metrics(url):
    out = {}
    for line in urllib.request.urlopen(url + "/metrics").read().decode().splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def one(url, prompt, max_tokens):
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
                       "temperature": 0}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    times = []
    with urllib.request.urlopen(req) as r:
        for raw in r:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                if json.loads(line[6:])["choices"][0]["text"] or not times:
                    times.append(time.perf_counter())
    ttft = times[0] - t0 if times else float("nan")
    itl = [b - a for a, b in zip(times, times[1:])]
    return ttft, itl, max_tokens, times[-1] - t0 if times else 0.0


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--dsaserve", help="start this binary (serve args after --)")
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=256, help="max prompt characters (uniform 1..N)")
    ap.add_argument("--output-len", type=int, default=64, help="max output tokens (uniform 1..N)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", help="with --dsaserve: serve --device (cpu or cuda)")
    ap.add_argument("--concurrency-list", help="comma-separated concurrencies, one run each on the same server")
    ap.add_argument("--requests-per-client", type=int, help="requests = this x concurrency (else --requests)")
    args, serve_args = ap.parse_known_args()
    serve_args = [a for a in serve_args if a != "--"]
    if args.device:
        serve_args += ["--device", args.device]
    proc = None
    url = args.url
    if args.dsaserve:
        proc = subprocess.Popen([args.dsaserve, "serve", "--port", "0", *serve_args], stdout=subprocess.PIPE, text=True)
        for line in proc.stdout:
            print("serve: " + line.rstrip(), file=sys.stderr)  # start-up log (device, KV cache, timings)
            if "listening on http://" in line:
                url = "http://" + line.split("http://")[1].split()[0]
                break
        # Keep draining its stdout so that it never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    if not url:
        if proc:
            proc.kill()
        sys.exit("give --url or --dsaserve (the server did not start)")
    try:
        levels = [int(x) for x in args.concurrency_list.split(",")] if args.concurrency_list else [args.concurrency]
        reports = []
        for c in levels:
            n = args.requests_per_client * c if args.requests_per_client else args.requests
            reports.append(run(url, args, c, n))
            print(json.dumps(reports[-1], indent=1), flush=True)
        if len(reports) > 1:
            print("concurrency  req/s  out_tok/s  ttft_p50_ms  ttft_p99_ms  itl_p50_ms  itl_p99_ms  step_ms  sched_ms/step")
            for r in reports:
                print(f"{r['concurrency']:11d}  {r['request_throughput_per_s']:5.2f}  {r['output_tokens_per_s']:9.1f}  "
                      f"{r['ttft_ms'][50]:11.2f}  {r['ttft_ms'][99]:11.2f}  {r['itl_ms'][50]:10.2f}  "
                      f"{r['itl_ms'][99]:10.2f}  {r['step_ms'] or 0:7.3f}  {r['scheduler_ms_per_step'] or 0:13.4f}")
    finally:
        if proc:
            proc.terminate()
            proc.wait()


def run(url, args, concurrency, requests):
    rng = random.Random(args.seed)
    work = [("".join(rng.choice("abcdefghij klmnop") for _ in range(rng.randint(1, args.prompt_len))),
             rng.randint(1, args.output_len)) for _ in range(requests)]
    m0 = metrics(url)
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(concurrency) as ex:
        res = list(ex.map(lambda w: one(url, *w), work))
    wall = time.perf_counter() - t0
    m1 = metrics(url)
    ttft = [r[0] for r in res]
    itl = [x for r in res for x in r[1]]
    out_tokens = sum(r[2] for r in res)
    steps = m1["dsaserve_engine_steps_total"] - m0["dsaserve_engine_steps_total"]
    sched = m1["dsaserve_scheduler_seconds_total"] - m0["dsaserve_scheduler_seconds_total"]
    busy = m1["dsaserve_engine_busy_seconds_total"] - m0["dsaserve_engine_busy_seconds_total"]
    gap_name = "dsaserve_engine_launch_gap_seconds_total"
    gap = m1.get(gap_name, 0.0) - m0.get(gap_name, 0.0)
    report = {
        "requests": requests, "concurrency": concurrency, "wall_s": round(wall, 3),
        "request_throughput_per_s": round(requests / wall, 3),
        "output_tokens_per_s": round(out_tokens / wall, 1),
        "ttft_ms": {p: round(pct(ttft, p) * 1e3, 2) for p in (50, 90, 99)},
        "itl_ms": {p: round(pct(itl, p) * 1e3, 2) for p in (50, 90, 99)},
        "engine_steps": int(steps),
        "scheduler_ms_per_step": round(sched / steps * 1e3, 4) if steps else None,
        "scheduler_share_of_step": round(sched / busy, 4) if busy else None,
        "step_ms": round(busy / steps * 1e3, 3) if steps else None,
        "launch_gap_ms_per_step": round(gap / steps * 1e3, 4) if steps else None,
    }
    return report


if __name__ == "__main__":
    main()
