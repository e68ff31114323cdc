#!/usr/bin/env python3
"""The official OpenAI Python client against `dsaserve serve --model builtin:demo` (random weights: the text is
noise, the protocol is what is checked). Exit 77 (skipped) when the `openai` package is missing."""
import argparse
import json
import subprocess
import sys
import urllib.error
import urllib.request

MODEL = "builtin:demo"  # the built-in model's name (alias: builtin)

try:
    import openai
except ImportError:
    print("openai is not installed (pip install openai): skipping")
    sys.exit(77)


def start(binary, *extra):
    p = subprocess.Popen([binary, "serve", "--model", MODEL, "--port", "0", "--kv-pages", "64", *extra],
                         stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        if "listening on http://127.0.0.1:" in line:
            port = int(line.split("127.0.0.1:")[1].split()[0])
            return p, port
    raise RuntimeError("server did not start")


def stop(p):
    p.terminate()
    assert p.wait(timeout=60) == 0, "SIGTERM should exit 0"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsaserve", required=True)
    args = ap.parse_args()
    p, port = start(args.dsaserve, "--api-key", "k1")
    try:
        c = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k1", max_retries=0)
        models = c.models.list()
        assert models.data[0].id == MODEL

        msgs = [{"role": "user", "content": "Hello!"}]
        r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0,
                                      extra_body={"ignore_eos": True})
        assert r.choices[0].message.role == "assistant"
        assert r.choices[0].finish_reason == "length"
        assert r.usage.completion_tokens == 8 and r.usage.total_tokens == r.usage.prompt_tokens + 8
        assert r.usage.prompt_tokens_details.cached_tokens == 0

        chunks = list(c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8, temperature=0,
                                                stream=True, stream_options={"include_usage": True},
                                                extra_body={"ignore_eos": True}))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        assert text == r.choices[0].message.content, (text, r.choices[0].message.content)
        assert chunks[-1].usage.completion_tokens == 8

        r2 = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, n=2, seed=7, temperature=1.0,
                                       logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
        assert len(r2.choices) == 2 and r2.usage.completion_tokens == 10
        lp = r2.choices[0].logprobs.content
        assert len(lp) == 5 and len(lp[0].top_logprobs) == 2 and all(x.logprob <= 0 for x in lp)
        r3 = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=5, n=2, seed=7, temperature=1.0,
                                       extra_body={"ignore_eos": True})
        assert [x.message.content for x in r3.choices] == [x.message.content for x in r2.choices]

        comp = c.completions.create(model=MODEL, prompt="once upon a time", max_tokens=30, temperature=0,
                                    extra_body={"ignore_eos": True})
        full = comp.choices[0].text
        stop_s = next(full[i:i + 2] for i in range(3, len(full) - 2) if full[i:i + 2].isalpha())
        comp2 = c.completions.create(model=MODEL, prompt="once upon a time", max_tokens=30, temperature=0,
                                     stop=[stop_s])
        assert comp2.choices[0].text == full[:full.index(stop_s)] and comp2.choices[0].finish_reason == "stop"

        # Errors.
        for kwargs, param in [({"temperature": "hot"}, "temperature"), ({"top_p": 5}, "top_p"),
                              ({"max_tokens": 100000}, "max_tokens")]:
            try:
                c.chat.completions.create(model=MODEL, messages=msgs, **kwargs)
                raise AssertionError(f"{kwargs} accepted")
            except openai.BadRequestError as e:
                assert e.body["param"] == param, e.body
        try:
            c.completions.create(model=MODEL, prompt="x" * 20000)
            raise AssertionError("too-long prompt accepted")
        except openai.BadRequestError as e:
            assert e.body["code"] == "context_length_exceeded", e.body
        try:
            c.chat.completions.create(model="other", messages=msgs)
            raise AssertionError("unknown model accepted")
        except openai.NotFoundError:
            pass
        bad = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0)
        try:
            bad.models.list()
            raise AssertionError("wrong API key accepted")
        except openai.AuthenticationError:
            pass
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=b"{bad json",
                                     headers={"Authorization": "Bearer k1", "Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req)
            raise AssertionError("bad JSON accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 400 and "error" in json.loads(e.read())
    finally:
        stop(p)
    print("openai client test: ok")


if __name__ == "__main__":
    main()
