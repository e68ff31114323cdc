#!/usr/bin/env python3
"""The official OpenAI Python client against `dsaserve serve --model builtin:demo` (random weights: the text is
noise, the protocol is what is checked). A second server with --tool-call-parser glm45 --reasoning-parser glm45
shows grammar-constrained decoding: forced tool calls (named and required, streamed and not) parsed into
tool_calls after reasoning_content, and a json_schema response that json.loads parses. Exit 77 (skipped) when
the `openai` package is missing."""
import argparse
import json
import os
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


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Tokyo"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}}},
    {"type": "function", "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 6}},
                       "required": ["zone"]}}},
]


def check_call(call, name=None):
    assert call.type == "function" and call.id, call
    if name:
        assert call.function.name == name, call
    a = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert a["city"] in ("Paris", "Tokyo") and 1 <= a["days"] <= 7, a
    else:
        assert call.function.name == "get_time" and isinstance(a["zone"], str) and len(a) == 1, a


def constrained(c):
    """tool_choice named / required and response_format json_schema, enforced by the grammar (random weights)."""
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    # A named function, greedy: the reasoning block, then exactly that call.
    r = c.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=300, temperature=0,
                                  tool_choice={"type": "function", "function": {"name": "get_weather"}})
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert len(ch.message.tool_calls) == 1, ch.message
    check_call(ch.message.tool_calls[0], "get_weather")
    reasoning = ch.message.model_extra.get("reasoning_content")
    assert isinstance(reasoning, str) and reasoning, ch.message
    assert not ch.message.content, ch.message
    # "required", seeded sampling at temperature 1, streamed: the same call as not streamed.
    kw = dict(model=MODEL, messages=msgs, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
              max_tokens=300, temperature=1.0, seed=11)
    whole = c.chat.completions.create(**kw).choices[0]
    assert whole.finish_reason == "tool_calls" and len(whole.message.tool_calls) == 1, whole
    check_call(whole.message.tool_calls[0])
    name, arguments, streamed_reasoning, finish = None, "", "", None
    for chunk in c.chat.completions.create(stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        streamed_reasoning += (d.model_extra or {}).get("reasoning_content") or ""
        for t in d.tool_calls or []:
            assert t.index == 0
            if t.function and t.function.name:
                name = t.function.name
            if t.function and t.function.arguments:
                arguments += t.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls", finish
    assert name == whole.message.tool_calls[0].function.name, (name, whole.message.tool_calls)
    assert json.loads(arguments) == json.loads(whole.message.tool_calls[0].function.arguments)
    assert streamed_reasoning == (whole.message.model_extra.get("reasoning_content") or "")
    # response_format json_schema (thinking off): the content is JSON of the schema.
    schema = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 12},
                                               "score": {"type": "integer", "minimum": 0, "maximum": 10}},
              "required": ["answer", "score"]}
    for seed in (1, 2):
        r = c.chat.completions.create(model=MODEL, messages=msgs, max_tokens=200, temperature=1.0, seed=seed,
                                      response_format={"type": "json_schema",
                                                       "json_schema": {"name": "rating", "schema": schema}},
                                      extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert r.choices[0].finish_reason == "stop", r.choices[0]
        v = json.loads(r.choices[0].message.content)
        assert isinstance(v["answer"], str) and len(v["answer"]) <= 12 and 0 <= v["score"] <= 10, v
    try:
        c.chat.completions.create(model=MODEL, messages=msgs, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}})
        raise AssertionError("bad schema accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "response_format.json_schema.schema", e.body


def tool_round_trip(c):
    """A forced call's reply appended as the SDK's own message object, then the tool's result: the next request
    renders that turn with GLM's chat template, which walks the arguments as an object (the SDK sends them as
    JSON text and the content as null)."""
    msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = c.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=300, temperature=0,
                                      tool_choice={"type": "function", "function": {"name": "get_weather"}})
    call_msg = first.choices[0].message
    assert call_msg.tool_calls and isinstance(call_msg.tool_calls[0].function.arguments, str), call_msg
    msgs.append(call_msg)
    msgs.append({"role": "tool", "tool_call_id": call_msg.tool_calls[0].id, "content": "sunny, 21 C"})
    second = c.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, max_tokens=2, temperature=0)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens, second.usage
    # A tool result without its call id is OpenAI's 400.
    try:
        c.chat.completions.create(model=MODEL, messages=msgs[:-1] + [{"role": "tool", "content": "x"}], max_tokens=1)
        raise AssertionError("tool message without tool_call_id accepted")
    except openai.BadRequestError as e:
        assert e.body["param"] == "messages[2].tool_call_id", e.body


def fixtures_dir():
    env = os.environ.get("DSASERVE_FIXTURES")
    here = os.path.dirname(os.path.abspath(__file__))
    return env or os.path.join(here, "..", "..", "..", "shared", "fixtures")


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
    p, port = start(args.dsaserve, "--tool-call-parser", "glm45", "--reasoning-parser", "glm45")
    try:
        constrained(openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0))
    finally:
        stop(p)
    glm_template = os.path.join(fixtures_dir(), "templates", "glm_4_6.jinja")
    if os.path.exists(glm_template):
        p, port = start(args.dsaserve, "--tool-call-parser", "glm45", "--reasoning-parser", "glm45",
                        "--chat-template", glm_template)
        try:
            tool_round_trip(openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0))
        finally:
            stop(p)
    else:
        print(f"{glm_template} missing: the tool round trip through GLM's template is skipped")
    print("openai client test: ok")


if __name__ == "__main__":
    main()
