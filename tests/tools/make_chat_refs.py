#!/usr/bin/env python3
"""Writes tests/data/chat_templates/expected.json: every *.jinja template of that
folder rendered over a fixed set of conversations, the way Hugging Face
transformers' apply_chat_template renders them (jinja2 3.1).

    python3 tests/tools/make_chat_refs.py [tests/data/chat_templates]

The environment mirrors transformers (chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols extension and a `{% generation %}` block that renders its body,
a `tojson` filter that does not escape non-ASCII, the globals raise_exception
and strftime_now, and the variables messages, tools=None, documents=None,
add_generation_prompt, bos_token, eos_token. strftime_now reads a fixed clock
(2024-07-26 12:00:00 UTC) so the file is reproducible; the C++ test passes the
same instant through RenderOptions::now_unix.
"""
import datetime
import json
import os
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime.datetime(2024, 7, 26, 12, 0, 0, tzinfo=datetime.timezone.utc)
BOS = "<s>"
EOS = "</s>"

CONVERSATIONS = {
    "user1": [
        {"role": "user", "content": "Hello!"},
    ],
    "sys_user1": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi": [
        {"role": "user", "content": "Hi, who are you?"},
        {"role": "assistant", "content": "I am an assistant."},
        {"role": "user", "content": "  Tell me a joke about \"quotes\" & <tags>.\n"},
    ],
    "sys_multi": [
        {"role": "system", "content": "Be brief.\nAnswer in English."},
        {"role": "user", "content": "Bonjour, ça va ?"},
        {"role": "assistant", "content": "Yes, fine. \u2615"},
        {"role": "user", "content": "And now?"},
    ],
    "ends_assistant": [
        {"role": "user", "content": "Count to three."},
        {"role": "assistant", "content": "1, 2, 3"},
    ],
    "thinking": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "<think>\nSimple sum.\n</think>\n\nIt is 4."},
        {"role": "user", "content": "And 3+3?"},
    ],
    "tool_result": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me check."},
        {"role": "tool", "content": "{\"temperature\": 21, \"unit\": \"C\"}"},
    ],
    "empty_user": [
        {"role": "user", "content": ""},
    ],
}


class GenerationBlock(Extension):
    """transformers' AssistantTracker without the tracking: the body renders as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return FIXED_NOW.strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "data", "chat_templates")
    env = make_env()
    cases = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            source = f.read()
        try:
            template = env.from_string(source)
            compile_error = None
        except Exception as e:  # noqa: BLE001 - any failure is an expected error
            template, compile_error = None, f"{type(e).__name__}: {e}"
        for conv_id, messages in CONVERSATIONS.items():
            for agp in (True, False):
                case = {"template": name, "conversation": conv_id, "add_generation_prompt": agp}
                if compile_error is not None:
                    case["error"] = compile_error
                else:
                    try:
                        case["expected"] = template.render(messages=messages, tools=None, documents=None,
                                                           add_generation_prompt=agp, bos_token=BOS, eos_token=EOS)
                    except Exception as e:  # noqa: BLE001
                        case["error"] = f"{type(e).__name__}: {e}"
                cases.append(case)
    out = {
        "generator": "tests/tools/make_chat_refs.py",
        "jinja2": jinja2.__version__,
        "bos_token": BOS,
        "eos_token": EOS,
        "now_unix": int(FIXED_NOW.timestamp()),
        "conversations": CONVERSATIONS,
        "cases": cases,
    }
    with open(os.path.join(folder, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum(1 for c in cases if "error" in c)
    print(f"{len(cases)} cases, {n_err} errors")


if __name__ == "__main__":
    main()
