"""Differential test: `dsaserve chat-template --jsonl` against Python jinja2 configured like transformers.

Usage: jinja_diff_test.py DSASERVE_BINARY [FIXTURES_DIR] [--seed N] [--show N]
Generates template/data pairs that cover the language (statements, filters, tests, operators, whitespace
control, macros, loops, errors) plus random chat requests for the fixture templates, renders each through
both, and fails on any difference in output (or in error class when both fail).
"""
import json
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jinja_reference as ref  # noqa: E402

CTX = {
    "s": "Hello World", "e": "", "u": "héllo wörld 你好", "ws": "  padded\t\n", "n": 7, "m": -3, "f": 2.5,
    "z": 0, "t": True, "no": False, "nil": None, "l": [3, 1, 2], "sl": ["b", "A", "c", "a"],
    "d": {"b": 1, "a": 2, "items": "x"}, "nested": {"x": {"y": [10, 20, {"z": "deep"}]}},
    "users": [{"name": "ann", "age": 31, "tags": ["a"]}, {"name": "Bob", "age": 25},
              {"name": "cy", "age": 31, "active": True}],
    "text": "line one\nline two\n\nline four", "html": "<a href=\"x\">&'</a>", "words": "one, two three-four",
    "pairs": [[1, "a"], [2, "b"]], "num_str": "42", "float_str": "3.75", "bad_num": "4x", "big": 123456789012,
    "tree": [{"name": "a", "kids": [{"name": "b", "kids": [{"name": "c"}]}, {"name": "d"}]}, {"name": "e"}],
    "tiny": 1e-7, "huge": 1.5e20, "neg_f": -0.5, "msgs": [{"role": "user", "content": "hi"},
                                                           {"role": "assistant", "content": None}],
}

SNIPPETS = [
    # output and literals
    "{{ s }}|{{ n }}|{{ f }}|{{ t }}|{{ nil }}|{{ l }}|{{ d }}|{{ undefined_name }}|",
    "{{ 'a' 'b' }}{{ \"q\\\"x\" }}{{ 'tab\\tnl\\n\\u00e9\\x41' }}", "{{ (1, 2) }}{{ (1,) }}{{ () }}{{ [] }}{{ {} }}",
    "{{ 1.0 }} {{ 1e3 }} {{ 1_000 }} {{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-5 }} {{ tiny }} {{ huge }} {{ 2.0 ** 70 }}",
    "{{ True }}{{ False }}{{ None }}{{ true }}{{ none }}", "{{ [1, 'a', none, true, 2.5, [3], {'k': 'v'}] }}",
    "{{ {'a': 1, 'b': [1, 2], 3: 'x'} }}", "{{ u }}{{ u|length }}{{ u[1] }}{{ u[-2:] }}{{ u|upper }}",
    # arithmetic and precedence
    "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }}",
    "{{ 7 / 2 }} {{ 6 / 3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 ** -1 }} {{ 10 - 3 - 2 }} {{ 2 * 3 % 4 }}",
    "{{ 1 + 2 ~ 3 }} {{ 'a' ~ 1 + 2 }} {{ n ~ f ~ nil ~ t }} {{ 'x' * 3 }} {{ [1] * 2 }} {{ [1] + [2] }}",
    "{{ not t and no }} {{ not (t and no) }} {{ t or no and no }} {{ nil or 'dflt' }} {{ 0 and 1 }} {{ '' or [] }}",
    "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 1 != '1' }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 2 >= 2 <= 3 }}",
    "{{ 'a' in 'cat' }} {{ 2 in l }} {{ 'b' in d }} {{ 5 not in l }} {{ 'z' not in s }} {{ not 2 in l }}",
    "{{ 'yes' if t else 'no' }} {{ 'yes' if no else 'no' }} [{{ 'x' if no }}] {{ 1 if no else 2 if t else 3 }}",
    "{{ n is odd }} {{ n is even }} {{ not n is odd }} {{ n is not odd }} {{ 1 + 1 is even }} {{ -n is odd }}",
    "{{ l[0] }}{{ l[-1] }}{{ l[1:] }}{{ l[:-1] }}{{ l[::-1] }}{{ l[::2] }}{{ s[1:4] }}{{ s[::-2] }}{{ l[5] }}|",
    "{{ nested.x.y[2].z }} {{ nested['x']['y'][0] }} {{ d['items'] }} {{ users[1].name }} {{ l.0 }}",
    "{{ d.missing }}|{{ d.missing is defined }}|{{ nil.attr }}|{{ l.missing }}|{{ s.nope }}|",
    "{{ -n }} {{ +n }} {{ -f }} {{ - - n }} {{ -n|abs }} {{ (-n)|abs }}",
    # strings methods
    "{{ s.upper() }} {{ s.lower() }} {{ s.split() }} {{ s.split('o') }} {{ s.split('o', 1) }} {{ words.split(', ') }}",
    "[{{ ws.strip() }}] [{{ ws.lstrip() }}] [{{ ws.rstrip() }}] [{{ 'xxhixx'.strip('x') }}] [{{ '  a b  '.split() }}]",
    "{{ s.startswith('He') }} {{ s.endswith('ld') }} {{ s.startswith(('x', 'H')) }} {{ s.replace('o', '0') }} {{ s.replace('l', 'L', 2) }}",
    "{{ s.title() }} {{ 'hello wORLD'.capitalize() }} {{ s.find('o') }} {{ s.rfind('o') }} {{ s.count('l') }} {{ '-'.join(sl) }}",
    "{{ text.splitlines() }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ s.rsplit(' ', 1) }} {{ 'a,b,,c'.split(',') }}",
    # dict/list methods
    "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{{ d.keys()|list }}{{ d.values()|list }}",
    "{{ d.get('a') }} {{ d.get('zz') }} {{ d.get('zz', 'dflt') }} {{ l.index(2) }} {{ l.count(3) }}",
    "{% set x = l.append(4) %}{{ l }}", "{% set x = d.update({'q': 1}) %}{{ d }}", "{{ l.pop() }}",
    # filters
    "{{ d|tojson }} {{ l|tojson }} {{ u|tojson }} {{ u|tojson(ensure_ascii=True) }} {{ nil|tojson }} {{ f|tojson }}",
    "{{ users|tojson(indent=2) }}", "{{ d|tojson(sort_keys=True) }} {{ d|tojson(separators=(',', ':')) }}",
    "{{ nested|tojson(indent=4, sort_keys=True) }}{{ 'a\"b\\\\c\\n\\x01'|tojson }}{{ [[], {}]|tojson(indent=1) }}",
    "{{ l|length }} {{ s|length }} {{ d|count }} {{ l|first }} {{ l|last }} {{ s|first }} {{ s|last }} {{ []|first }}|",
    "{{ undefined_name|default('dv') }} {{ nil|default('dv') }} {{ nil|default('dv', true) }} {{ ''|d('e', boolean=true) }}",
    "[{{ ws|trim }}] [{{ 'xxyxx'|trim('x') }}] {{ l|join(', ') }} {{ users|join('/', attribute='name') }} {{ sl|join }}",
    "{{ s|upper }} {{ s|lower }} {{ 'hello-world (foo bar)'|title }} {{ 'hELLO'|capitalize }} {{ n|upper }}",
    "{{ s|replace('l', 'L') }} {{ s|replace('l', '', 1) }} {{ d|items|list }} {{ 'abc'|list }} {{ d|list }}",
    "{{ users|map(attribute='name')|list }} {{ users|map(attribute='active', default=false)|list }} {{ sl|map('upper')|join }}",
    "{{ l|select('odd')|list }} {{ l|reject('odd')|list }} {{ [0, 1, '', 'a', none]|select|list }} {{ l|select('gt', 1)|list }}",
    "{{ users|selectattr('active')|map(attribute='name')|list }} {{ users|rejectattr('age', 'eq', 31)|map(attribute='name')|list }}",
    "{{ users|selectattr('age', 'equalto', 31)|list|length }} {{ users|selectattr('name', 'in', ['ann', 'cy'])|list|length }}",
    "{{ sl|unique|list }} {{ sl|unique(case_sensitive=true)|list }} {{ [1, 2, 1, 3]|unique|list }} {{ users|unique(attribute='age')|list|length }}",
    "{{ sl|sort }} {{ sl|sort(case_sensitive=true) }} {{ l|sort(reverse=true) }} {{ users|sort(attribute='age')|map(attribute='name')|join }}",
    "{{ n|string }} {{ l|string }} {{ num_str|int + 1 }} {{ float_str|int }} {{ bad_num|int }} {{ bad_num|int(-1) }} {{ f|int }} {{ '0x1A'|int(0, 16) }}",
    "{{ num_str|float }} {{ bad_num|float }} {{ n|float }} {{ 2.567|round(2) }} {{ 2.5|round }} {{ 3.5|round }} {{ 7|round }} {{ 2.1|round(0, 'ceil') }} {{ 2.9|round(method='floor') }}",
    "{{ m|abs }} {{ neg_f|abs }} {{ html|e }} {{ html|escape }} {{ html|safe }} {{ 5|e }}",
    "{{ text|indent }}|{{ text|indent(2, true) }}|{{ text|indent('> ', blank=true) }}|{{ ''|indent }}",
    "{{ words|wordcount }} {{ u|wordcount }} {{ l|reverse|list }} {{ s|reverse }} {{ l|sum }} {{ l|min }} {{ l|max }} {{ sl|max }}",
    "{{ users|sum(attribute='age') }} {{ d|dictsort }} {{ d|dictsort(by='value', reverse=true) }} {{ 'ab'|center(6) }}|",
    "{{ l|map('string')|join('-') }} {{ users|map(attribute='tags.0')|list }} {{ pairs|map(attribute=1)|join }}",
    # tests
    "{{ s is string }} {{ n is number }} {{ f is number }} {{ t is number }} {{ n is integer }} {{ f is float }} {{ t is boolean }} {{ n is boolean }}",
    "{{ d is mapping }} {{ l is mapping }} {{ l is iterable }} {{ s is iterable }} {{ n is iterable }} {{ l is sequence }} {{ d is sequence }} {{ n is sequence }}",
    "{{ nil is none }} {{ nope is defined }} {{ nope is undefined }} {{ n is defined }} {{ t is true }} {{ 1 is true }} {{ no is false }} {{ 0 is false }}",
    "{{ 2 is in l }} {{ 9 is in l }} {{ n is eq 7 }} {{ n is ne 7 }} {{ n is lt 8 }} {{ n is ge 7 }} {{ 9 is divisibleby 3 }} {{ l is sameas l }}",
    "{{ 'abc' is lower }} {{ 'ABC' is upper }} {{ 'upper' is filter }} {{ 'odd' is test }} {{ nope is string }} {{ range is callable }}",
    # statements
    "{% if n > 5 %}big{% elif n > 2 %}mid{% else %}small{% endif %}|{% if z %}x{% elif nil %}y{% else %}z{% endif %}",
    "{% for x in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }} {% endfor %}",
    "{% for x in [] %}a{% else %}empty{% endfor %}{% for x in l if x > 5 %}a{% else %}none{% endfor %}",
    "{% for x in l if x > 1 %}{{ loop.index }}/{{ loop.length }}:{{ x }} {% endfor %}",
    "{% for a, b in pairs %}{{ a }}{{ b }}{% endfor %}{% for k, v in d|items %}{{ k }}{{ v }}{% endfor %}{% for (a, b) in pairs %}{{ b }}{% endfor %}",
    "{% for x in l %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for x in l %}{{ loop.cycle('odd', 'even') }}{{ loop.previtem }}{{ loop.nextitem }},{% endfor %}",
    "{% for x in [1, 1, 2] %}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}{% for c in 'ab' %}{{ c }}{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
    "{% for i in range(3) %}{% for j in range(i) %}{{ i }}{{ j }}{{ loop.index }} {% endfor %}{{ loop.index }}|{% endfor %}",
    "{% for n in tree recursive %}[{{ n.name }}{{ loop.depth }}{{ loop.depth0 }}{% if n.kids %}{{ loop(n.kids) }}{% endif %}]{% endfor %}",
    "{% for i in range(2, 10, 3) %}{{ i }}{% endfor %}{% for i in range(5, 0, -2) %}{{ i }}{% endfor %}{{ range(3)|list }}",
    "{% for x in l|sort %}{{ x }}{% endfor %}{% for u in users|selectattr('age', 'gt', 26) %}{{ u.name }}{% endfor %}",
    "{% set x = 5 %}{{ x }}{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set y %}block {{ x }}{% endset %}[{{ y }}]",
    "{% set y | upper %}shout {{ s }}{% endset %}{{ y }}{% set t2 = (1, 2) %}{{ t2 }}",
    "{% set ns = namespace(count=0, found=false) %}{% for x in l %}{% set ns.count = ns.count + x %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }}{{ ns.found }}",
    "{% set x = 1 %}{% for i in l %}{% set x = i %}{{ x }}{% endfor %}{{ x }}",
    "{% for i in range(3) %}{% if i == 0 %}{% set v = 'a' %}{% endif %}[{{ v }}]{% endfor %}",
    "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('ann') }} {{ greet('bob', 'Hi') }} {{ greet(greeting='Yo', name='cy') }}",
    "{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k=4) }}",
    "{% macro outer() %}<{{ caller() }}>{% endmacro %}{% call outer() %}inside {{ n }}{% endcall %}",
    "{% macro lst(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) lst(l) %}[{{ x * 2 }}]{% endcall %}",
    "{% macro r(k) %}{% if k > 0 %}{{ k }}{{ r(k - 1) }}{% endif %}{% endmacro %}{{ r(3) }}",
    "{% set g = 'global' %}{% macro show() %}{{ g }}{% endmacro %}{% set g = 'changed' %}{{ show() }}",
    "{% filter upper %}some {{ s }} text{% endfilter %}{% filter replace('a', 'b')|upper %}banana{% endfilter %}",
    "{% with a = 1, b = n %}{{ a }}{{ b }}{% endwith %}{{ a }}|",
    "{% raw %}{{ not rendered }}{% if %}{% endraw %}", "{# comment #}x{# multi\nline #}y",
    "{{ raise_exception('boom') }}", "{% if nope.attr %}x{% endif %}", "{{ nope + 1 }}", "{{ 1 + 'a' }}",
    "{{ 1 / 0 }}", "{{ l.append }}|", "{% for x in n %}{% endfor %}", "{{ [1, 2] | tojson(indent=none) }}",
    "{{ 'a' < 1 }}", "{% set a, b = l %}", "{{ nope() }}", "{{ n() }}", "{{ strftime_now('%Y') | length }}",
    "{{ '%s-%d|%5.2f|%r|%x|%%|%-4s|' % (s, n, f, s, 255, 'ab') }}{{ '%(a)s+%(b)03d' % {'a': 'x', 'b': 7} }}{{ 'v=%s' % n }}",
    "{{ '%s and %s'|format('a', 2) }}{{ '%s' % [1] }}{{ 'x' % [] }}{{ '%(k)s'|format(k='v') }}",
    "{{ '%s %s' % (1,) }}", "{{ 'x' % 5 }}", "{{ '%d' % 'a' }}",
    "{{ dict(a=1, b=2) }} {{ dict({'z': 0}, y=1) }} {{ namespace(a=1).a }}",
    "{{ msgs|selectattr('content', 'none')|list|length }} {{ msgs|map(attribute='role')|join(',') }}",
    "{% if msgs[0].role == 'user' and msgs[1].content is none %}ok{% endif %}{{ msgs[-1]['content'] is none }}",
    # syntax errors
    "{% if t %}unclosed", "{{ 1 + }}", "{% for x in %}{% endfor %}", "{{ x | nofilter }}", "{% endif %}",
    "{{ 'unterminated }}", "{% set = 1 %}", "{{ x is notatest }}", "{% foo %}", "{{ (1, 2 }}", "{{ a.  }}",
    "line1\nline2 {{ 1 +* 2 }}", "{% break %}",
    # whitespace control
    "a  {%- if t %}  b  {% endif -%}  c", "a\n  {% if t %}\n  b\n  {% endif %}\n c\n",
    "x\n    {% for i in l %}\n    {{ i }}\n    {% endfor %}\ny", "a {{- s -}} b {{ s }} c", "  {{ s }}  \n  {# c #}  \nz",
    "a\n\t {%+ if t %}b{% endif +%}\nc", "a\n{% if t -%}\n\n  b\n{%- endif %}\n\nc", "{% if t %}\r\nwin\r\n{% endif %}\r\n",
    "  {% raw %}  x  {% endraw %}\n  y", "a\n  {#- c -#}\n  b", "\n\n{% if t %}\n{% endif %}\n\n", "text\n",
    "text\n\n", "  {%- if t %}x{% endif %}", "{% if t %}   {% endif %}|", "a   {% if t %}b{% endif %}\n  {% if t %}c\n{% endif %}",
]

SCALARS = ["0", "1", "2", "3", "-1", "2.5", "0.5", "'a'", "'bc'", "''", "true", "false", "none", "n", "f", "s", "l",
           "[1, 2]", "(3,)", "{'k': 1}", "nil", "t", "z"]
BINOPS = ["+", "-", "*", "/", "//", "%", "**", "~", "==", "!=", "<", "<=", ">", ">=", "and", "or", "in", "not in"]
FILTERS = ["length", "string", "upper", "lower", "first", "last", "list", "tojson", "int", "float", "abs", "trim",
           "join", "reverse|list", "sort", "unique|list", "default(7)", "round", "wordcount", "e", "capitalize"]
TESTS = ["defined", "none", "string", "number", "integer", "iterable", "mapping", "odd", "even", "true", "false",
         "sequence", "boolean", "float"]


def random_expr(rng, depth):
    if depth <= 0 or rng.random() < 0.25:
        return rng.choice(SCALARS)
    r = rng.random()
    if r < 0.45:
        op = rng.choice(BINOPS)
        a, b = random_expr(rng, depth - 1), random_expr(rng, depth - 1)
        if op == "**":
            b = rng.choice(["0", "1", "2", "3", "-1"])
        return f"{a} {op} {b}"
    if r < 0.55:
        return f"not {random_expr(rng, depth - 1)}"
    if r < 0.65:
        return f"({random_expr(rng, depth - 1)})"
    if r < 0.75:
        return f"{random_expr(rng, depth - 1)}|{rng.choice(FILTERS)}"
    if r < 0.85:
        neg = "not " if rng.random() < 0.3 else ""
        return f"{random_expr(rng, depth - 1)} is {neg}{rng.choice(TESTS)}"
    if r < 0.92:
        return f"{random_expr(rng, depth - 1)} if {random_expr(rng, depth - 1)} else {random_expr(rng, depth - 1)}"
    return f"-{random_expr(rng, depth - 1)}"


SEQS = ["s", "u", "l", "sl", "'abcdef'", "[1, 2, 3, 4, 5]", "''", "[]", "ws", "text", "(1, 2, 3)"]
STR_ARGS = ["'l'", "'o'", "' '", "'\\n'", "'ab'", "'é'", "'x'", "'lo'"]


def random_access(rng):
    """Slices, indexing and str/list/dict method calls with random arguments."""
    seq = rng.choice(SEQS)
    r = rng.random()
    if r < 0.35:
        parts = [rng.choice(["", "", "0", "1", "-1", "2", "-3", "10", "-10"]) for _ in range(2)]
        step = rng.choice(["", "", ":1", ":2", ":-1", ":-2", ":3"])
        return f"{seq}[{parts[0]}:{parts[1]}{step}]"
    if r < 0.5:
        return f"{seq}[{rng.choice(['0', '1', '-1', '-2', '5', '-9'])}]"
    if r < 0.85:
        s = rng.choice(["s", "u", "ws", "text", "words", "'a,b,,c'", "'  x  y  '", "'AbC dEf'"])
        m = rng.choice(["split", "rsplit", "strip", "lstrip", "rstrip", "startswith", "endswith", "replace",
                        "upper", "lower", "title", "capitalize", "find", "rfind", "count", "splitlines"])
        if m in ("split", "rsplit"):
            args = rng.choice(["", rng.choice(STR_ARGS), f"{rng.choice(STR_ARGS)}, {rng.randint(-1, 2)}",
                               f"none, {rng.randint(0, 2)}"])
        elif m in ("strip", "lstrip", "rstrip"):
            args = rng.choice(["", rng.choice(STR_ARGS), "' lx'"])
        elif m in ("startswith", "endswith", "find", "rfind", "count"):
            args = rng.choice(STR_ARGS + ["('x', 'H')", "''"])
        elif m == "replace":
            args = f"{rng.choice(STR_ARGS)}, {rng.choice(STR_ARGS)}" + rng.choice(["", ", 1", ", 0", ", -1"])
        else:
            args = ""
        return f"{s}.{m}({args})"
    d = rng.choice(["d", "nested.x", "users[0]", "{}"])
    return rng.choice([f"{d}.get('a')", f"{d}.get('zz', 5)", f"{d}.keys()|list", f"{d}.values()|list",
                       f"{d}.items()|list", f"{d}|length", f"{d}|tojson(sort_keys=true)"])


def random_whitespace_template(rng):
    parts = []
    open_blocks = 0
    for _ in range(rng.randint(2, 9)):
        parts.append(rng.choice(["", " ", "  ", "\t", "\n", " \n", "\n  ", "x", "y\n", "\n\n", " z "]))
        sign_l = rng.choice(["", "", "-", "+"])
        sign_r = rng.choice(["", "", "-", "+"])
        kind = rng.random()
        if kind < 0.3:
            parts.append(f"{{%{sign_l} if t {sign_r}%}}")
            open_blocks += 1
        elif kind < 0.5 and open_blocks:
            parts.append(f"{{%{sign_l} endif {sign_r}%}}")
            open_blocks -= 1
        elif kind < 0.7:
            parts.append(f"{{{{{'-' if sign_l == '-' else ''} n {'-' if sign_r == '-' else ''}}}}}")
        elif kind < 0.85:
            parts.append(f"{{#{sign_l} c {sign_r}#}}")
        else:
            parts.append(f"{{%{sign_l} set q = 1 {sign_r}%}}")
    while open_blocks:
        parts.append(rng.choice(["", "\n", "  "]) + rng.choice(["{% endif %}", "{%- endif %}", "{% endif -%}"]))
        open_blocks -= 1
    parts.append(rng.choice(["", "\n", "  \n", "end\n"]))
    return "".join(parts)


WORDS = ["hello", "世界", "{{ not a tag }}", "{% raw %}", "</think>", "<think>", "a\nb", "  spaced  ", "emoji 😀",
         "quote \" and ' ", "back\\slash", "/nothink", "tab\tsep", ""]


def random_text(rng):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 4)))


def random_tool(rng, i):
    return {"type": "function", "function": {
        "name": f"tool_{i}", "description": random_text(rng),
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": random_text(rng)},
            "days": {"type": "integer"}, "flag": {"type": "boolean"}}, "required": ["city"]}}}


def random_request(rng, family):
    msgs = []
    if rng.random() < 0.4:
        msgs.append({"role": "system", "content": random_text(rng)})
    for _ in range(rng.randint(1, 4)):
        user_content = random_text(rng)
        if family == "glm" and rng.random() < 0.2:
            user_content = [{"type": "text", "text": random_text(rng)}, {"type": "text", "text": random_text(rng)}]
        msgs.append({"role": "user", "content": user_content})
        r = rng.random()
        if r < 0.5:
            m = {"role": "assistant", "content": random_text(rng)}
            if family == "glm" and rng.random() < 0.4:
                m["reasoning_content"] = random_text(rng)
            msgs.append(m)
        elif r < 0.8:
            calls = []
            for k in range(rng.randint(1, 2)):
                args = {"city": random_text(rng), "days": rng.randint(0, 9), "flag": rng.random() < 0.5,
                        "opts": {"u": "C"}}
                if family == "ds":
                    args = json.dumps(args, ensure_ascii=False)
                calls.append({"type": "function", "function": {"name": f"tool_{k}", "arguments": args}})
            msgs.append({"role": "assistant", "content": None if family == "ds" else "", "tool_calls": calls})
            for _ in calls:
                msgs.append({"role": "tool", "content": random_text(rng)})
            if family == "ds" or rng.random() < 0.5:
                msgs.append({"role": "assistant", "content": random_text(rng)})
    req = {"messages": msgs, "add_generation_prompt": rng.random() < 0.7}
    if family == "glm":
        if rng.random() < 0.4:
            req["tools"] = [random_tool(rng, i) for i in range(rng.randint(1, 2))]
        if rng.random() < 0.4:
            req["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
    return req


def build_cases(rng):
    cases = []  # (label, jsonl input line, reference result)
    for i, src in enumerate(SNIPPETS):
        cases.append((f"snippet {i}: {src!r}", {"template": src, "context": CTX}, ref.render(src, CTX)))
    for i in range(150):
        src = "{{ " + random_expr(rng, 3) + " }}"
        cases.append((f"expr {i}: {src!r}", {"template": src, "context": CTX}, ref.render(src, CTX)))
    for i in range(120):
        src = "{{ " + random_access(rng) + " }}"
        cases.append((f"access {i}: {src!r}", {"template": src, "context": CTX}, ref.render(src, CTX)))
    for i in range(120):
        src = random_whitespace_template(rng)
        cases.append((f"whitespace {i}: {src!r}", {"template": src, "context": CTX}, ref.render(src, CTX)))
    return cases


def chat_cases(rng, fixtures):
    cases = []
    config = json.load(open(os.path.join(fixtures, "tokenizers/deepseek_v3/tokenizer_config.json")))
    special = {k: (v["content"] if isinstance(v, dict) else v) for k, v in config.items()
               if k in ("bos_token", "eos_token", "unk_token", "pad_token") and v is not None}
    for name, family in (("glm_4_6", "glm"), ("deepseek_v3", "ds")):
        source = open(os.path.join(fixtures, "templates", name + ".jinja")).read()
        batch = []
        for i in range(100):
            req = random_request(rng, family)
            batch.append((f"{name} request {i}: {json.dumps(req, ensure_ascii=False)[:300]}", {"request": req},
                          ref.render_chat(source, req, special)))
        cases.append((os.path.join(fixtures, "templates", name + ".jinja"), batch))
    return cases


def run_binary(binary, args, inputs):
    text = "".join(json.dumps(x, ensure_ascii=False) + "\n" for x in inputs)
    out = subprocess.run([binary, "chat-template", "--jsonl", *args], input=text, capture_output=True, text=True,
                         timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"dsaserve failed ({out.returncode}): {out.stderr}")
    results = [json.loads(line) for line in out.stdout.splitlines()]
    if len(results) != len(inputs):
        raise SystemExit(f"expected {len(inputs)} results, got {len(results)}")
    return results


def compare(label, want, got, failures):
    if "error" in want:
        if got.get("error") != want["error"]:
            failures.append(f"{label}\n  jinja2: error {want['error']} ({want['message']})\n  dsaserve: {got}")
    elif got.get("rendered") != want["rendered"]:
        failures.append(f"{label}\n  jinja2:   {want['rendered']!r}\n  dsaserve: {got}")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    seed = 1234
    show = 20
    for a in sys.argv[1:]:
        if a.startswith("--seed="):
            seed = int(a.split("=")[1])
        if a.startswith("--show="):
            show = int(a.split("=")[1])
    binary = args[0]
    here = os.path.dirname(os.path.abspath(__file__))
    fixtures = args[1] if len(args) > 1 else os.environ.get(
        "DSASERVE_FIXTURES", os.path.join(here, "..", "..", "..", "shared", "fixtures"))
    rng = random.Random(seed)
    failures = []
    total = 0
    cases = build_cases(rng)
    results = run_binary(binary, [], [c[1] for c in cases])
    for (label, _, want), got in zip(cases, results):
        compare(label, want, got, failures)
    total += len(cases)
    n_errors = sum(1 for c in cases if "error" in c[2])
    if os.path.isdir(fixtures):
        for path, batch in chat_cases(rng, fixtures):
            results = run_binary(binary, ["--template", path, "--tokenizer",
                                          os.path.join(fixtures, "tokenizers/deepseek_v3")], [c[1] for c in batch])
            for (label, _, want), got in zip(batch, results):
                compare(label, want, got, failures)
            total += len(batch)
            # The plain mode (one request on stdin, the prompt on stdout), with and without --template.
            tokenizer = os.path.join(fixtures, "tokenizers/deepseek_v3")
            modes = [["--template", path]] + ([[]] if "deepseek" in path else [])
            for extra in modes:
                for label, item, want in batch[:10]:
                    out = subprocess.run([binary, "chat-template", "--tokenizer", tokenizer, *extra],
                                         input=json.dumps(item["request"]), capture_output=True, text=True, timeout=60)
                    got = {"rendered": out.stdout} if out.returncode == 0 else {"error": "failed " + out.stderr}
                    compare(f"plain mode {extra}: {label}", want, got, failures)
                    total += 1
    else:
        print(f"fixtures not found at {fixtures}: chat-template requests skipped (set DSASERVE_FIXTURES)")
    for f in failures[:show]:
        print("MISMATCH", f)
    print(f"{total - len(failures)}/{total} identical ({n_errors} language cases are errors in jinja2)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
