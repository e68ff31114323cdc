"""The reference renderer: Python jinja2 configured like transformers' apply_chat_template.

ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols extension,
transformers' tojson (json.dumps, ensure_ascii=False by default), raise_exception and strftime_now.
"""
import json
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError, UndefinedError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def _raise_exception(message):
    raise TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format):
    return datetime.now().strftime(format)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


ENV = make_env()


def error_kind(e):
    """The error class names the C++ renderer reports (see chat/template_error.h)."""
    if isinstance(e, (TemplateSyntaxError, SyntaxError)):
        return "syntax"
    if isinstance(e, UndefinedError):
        return "undefined"
    if isinstance(e, SecurityError):
        return "security"
    if type(e) is TemplateError:
        return "raised"
    return "runtime"


def render(source, context):
    """Returns {"rendered": str} or {"error": kind, "message": str}."""
    try:
        return {"rendered": ENV.from_string(source).render(**context)}
    except Exception as e:  # noqa: BLE001 - every failure is compared by class
        return {"error": error_kind(e), "message": f"{type(e).__name__}: {e}"}


def render_chat(source, request, special_tokens):
    context = dict(special_tokens)
    context.update(messages=request["messages"], tools=request.get("tools"), documents=request.get("documents"),
                   add_generation_prompt=request.get("add_generation_prompt", False))
    context.update(request.get("chat_template_kwargs") or {})
    return render(source, context)
