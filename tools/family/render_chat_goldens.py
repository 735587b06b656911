#!/usr/bin/python3
# Renders the released Jinja chat templates of the Kimi family (K2-Instruct, K2-Thinking,
# Kimi-Linear, ...) over one fixed list of conversations and writes the exact prompt texts to
# tests/data/chat/<family>/cases.json, the goldens the C++ renderers for those models are tested
# against (docs/FAMILY.md, "Chat formats and tokenizers", describes the formats in our words).
#
# Why it is built this way:
# - The templates are the models' own released data files under the models' licence, so none is
#   in this repository and this script holds no template text: it reads them from a folder named
#   on the command line (the developer fetches each from the source recorded below) and checks
#   each file's sha256 against the pinned copy, so a golden always names the exact bytes it came
#   from. The cases file records where the template came from (released origin, the pinned copy's
#   repository, path and commit, sha256) next to the rendered texts.
# - The templates are written for Hugging Face transformers' apply_chat_template, so they are
#   rendered the way it renders them: a sandboxed Jinja environment with trim_blocks,
#   lstrip_blocks and the loop-controls extension ({% break %}), a tojson filter that is
#   json.dumps with ensure_ascii=False (not Jinja's HTML-safe, key-sorting tojson), and the
#   raise_exception / strftime_now globals. Only Debian's python3-jinja2 is needed.
# - Every template variable must be one the family's spec supplies; a template that reads any
#   other input (a special token, a kwarg we do not model) is refused by name instead of being
#   rendered with that input silently empty.
# - A conversation the template cannot render (it raises) is kept as an expected_error case: the
#   engine must refuse it (or the family's doc must say what it does instead).
#
# Use: save each family's template as <family>.jinja in one folder (k2-instruct.jinja is
# llama.cpp's models/templates/moonshotai-Kimi-K2.jinja at 02f4a631, k2-thinking.jinja its
# models/templates/moonshotai-Kimi-K2-Thinking.jinja at 0c3c896e; see FAMILIES), then run
#   /usr/bin/python3 tools/family/render_chat_goldens.py FOLDER           (rewrite the goldens)
#   /usr/bin/python3 tools/family/render_chat_goldens.py FOLDER --check   (compare, write nothing)
# A newer release of a template (not the pinned copy) renders with --origin-revision FAMILY=REV.
#
# Output shape (an extension of tests/data/chat/cases.json, which is a bare array of cases): an
# object {"family", "models", "template": {...provenance...}, "renderer", "cases": [...]}, where
# every case has the K3 case keys (name, messages, tools when present, expected or
# expected_error), add_generation_prompt always explicit (transformers' default is false, K3's
# is true), and chat_template_kwargs for any other template variable a case sets.
import argparse
import datetime
import hashlib
import json
import os
import sys
import tempfile

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.utils
import jinja2.sandbox

# ---------------------------------------------------------------------------------------------
# Families. `origin` is where the model publishes the template; `pinned` is the exact copy the
# committed goldens were rendered from (repository, path, commit), with the sha256 of its bytes
# and of its text with CRLF line ends turned into LF (Jinja normalizes line ends, so either form
# renders the same). A family without a pin renders only with --origin-revision FAMILY=REV,
# which records what the developer fetched.

FAMILIES = {
    "k2-instruct": {
        "models": ["moonshotai/Kimi-K2-Instruct"],
        "file": "k2-instruct.jinja",
        "origin": {
            "repo": "huggingface.co/moonshotai/Kimi-K2-Instruct",
            "path": "tokenizer_config.json (chat_template)",
            "revision": "the July 2025 release, as fetched by llama.cpp's scripts/get_chat_template.py",
        },
        "pinned": {
            "repo": "github.com/ggml-org/llama.cpp",
            "path": "models/templates/moonshotai-Kimi-K2.jinja",
            "commit": "02f4a631678bc435c5cea7a54ab4222ee32e8453",
            "sha256": "c09b71f54381a817333ae386f6fc3c1bfa5eaa1dc2baf9a649c106169edefbca",
            "sha256_lf": "0d19c3a601c02d8f788799efcaceee9f0cda955e165b9c137ea9f7198fea4d37",
        },
        "notes": (
            "The first K2-Instruct template: it ignores tool_calls, tool_call_id, name and "
            "reasoning_content, and its default system prompt is 'You are a helpful assistant'. "
            "Later K2-Instruct revisions and Kimi-K2-Instruct-0905 ship a different template "
            "(tool calls rendered as <|tool_calls_section_begin|> sections, tool results as "
            "'## Return of ID'); no verbatim copy of that one was available, so it has no goldens "
            "yet (render it with --origin-revision once fetched)."
        ),
        "kwargs": [],
    },
    "k2-thinking": {
        "models": ["moonshotai/Kimi-K2-Thinking"],
        "file": "k2-thinking.jinja",
        "origin": {
            "repo": "huggingface.co/moonshotai/Kimi-K2-Thinking",
            "path": "chat_template.jinja",
            "revision": "as fetched by llama.cpp's scripts/get_chat_template.py for the pinned commit",
        },
        "pinned": {
            "repo": "github.com/ggml-org/llama.cpp",
            "path": "models/templates/moonshotai-Kimi-K2-Thinking.jinja",
            "commit": "0c3c896ea80643608b4e961eec7e1efcd844e109",
            "sha256": "833d0c375531149a922a0f2addf9a66cce8e4503c500fe4ca6a95e9d1ed3c75a",
            "sha256_lf": "833d0c375531149a922a0f2addf9a66cce8e4503c500fe4ca6a95e9d1ed3c75a",
        },
        "notes": (
            "This copy declares tools with `tools | tojson()` (separators ', ' and ': '); the "
            "current Hugging Face revision (6126819, 'fix-default-system-prompt (#12)') declares "
            "them with tojson(separators=(',', ':')) and may differ in the default system prompt. "
            "Re-render with that file (--origin-revision) before relying on the tool_declare bytes."
        ),
        "kwargs": [],
    },
    "kimi-linear": {
        "models": ["moonshotai/Kimi-Linear-48B-A3B-Instruct"],
        "file": "kimi-linear.jinja",
        "origin": {
            "repo": "huggingface.co/moonshotai/Kimi-Linear-48B-A3B-Instruct",
            "path": "chat_template.jinja or tokenizer_config.json (chat_template)",
            "revision": None,
        },
        "pinned": None,
        "notes": "No verbatim copy was pinned; the developer records the revision fetched.",
        "kwargs": [],
    },
    "k2.5": {
        "models": ["moonshotai/Kimi-K2.5"],
        "file": "k2.5.jinja",
        "origin": {
            "repo": "huggingface.co/moonshotai/Kimi-K2.5",
            "path": "chat_template.jinja",
            "revision": None,
        },
        "pinned": None,
        "notes": (
            "The K2.5 template also reads `thinking` and `tools_ts_str` (a TypeScript-style tool "
            "declaration its tokenization_kimi.py computes in Python); cases that set them must "
            "pass them in chat_template_kwargs."
        ),
        "kwargs": ["thinking", "tools_ts_str", "preserve_thinking"],
    },
}

# Variables transformers supplies to every template; the family's kwargs are added to these.
BASE_VARIABLES = {"messages", "tools", "add_generation_prompt", "documents"}


# ---------------------------------------------------------------------------------------------
# The transformers chat-template environment.


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers replaces Jinja's tojson (HTML-escaping, key-sorting) with plain json.dumps.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(fmt):
    return datetime.datetime.now().strftime(fmt)


class RecordingUndefined(jinja2.Undefined):
    # Renders like Jinja's default Undefined (empty text, falsy) and remembers every top-level
    # name the template looked up and did not get, so render_family can refuse unmodelled inputs.
    missing_names = set()

    def __init__(self, hint=None, obj=jinja2.utils.missing, name=None, exc=jinja2.exceptions.UndefinedError):
        super().__init__(hint, obj, name, exc)
        if obj is jinja2.utils.missing and name is not None:
            RecordingUndefined.missing_names.add(name)


def make_environment():
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols], undefined=RecordingUndefined
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(template, case):
    kwargs = dict(case.get("chat_template_kwargs", {}))
    kwargs["messages"] = case["messages"]
    kwargs["tools"] = case.get("tools")
    kwargs["documents"] = None
    kwargs["add_generation_prompt"] = case["add_generation_prompt"]
    return template.render(**kwargs)


# ---------------------------------------------------------------------------------------------
# The conversations. Every family gets every case, so the files show how each template treats
# each message field (a field a template ignores renders the same as without it).

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city (°C)",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "City name, e.g. 東京"},
                    "days": {"type": "integer"},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "Local time in an IANA zone",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
        },
    },
]

WEATHER_ID = "functions.get_weather:0"
TIME_ID = "functions.get_time:1"


def weather_call(arguments='{"city": "Paris"}', call_id=WEATHER_ID):
    return {"id": call_id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}}


def time_call(arguments='{"zone": "Asia/Tokyo"}', call_id=TIME_ID):
    return {"id": call_id, "type": "function", "function": {"name": "get_time", "arguments": arguments}}


def user(text, **extra):
    return {"role": "user", "content": text, **extra}


def system(text):
    return {"role": "system", "content": text}


def assistant(text, **extra):
    return {"role": "assistant", "content": text, **extra}


def tool_result(call_id, text, name=None):
    msg = {"role": "tool", "tool_call_id": call_id, "content": text}
    if name is not None:
        msg["name"] = name
    return msg


def case(name, messages, add_generation_prompt, tools=None, **kwargs):
    c = {"name": name, "messages": messages}
    if tools is not None:
        c["tools"] = tools
    c["add_generation_prompt"] = add_generation_prompt
    if kwargs:
        c["chat_template_kwargs"] = kwargs
    return c


def two_call_turn():
    return [
        user("Weather in Paris for 2 days, and the time in Tokyo?"),
        assistant(
            "Checking both.",
            reasoning_content="I need both tools.",
            tool_calls=[weather_call(arguments={"city": "Paris", "days": 2}), time_call()],
        ),
        tool_result(WEATHER_ID, '{"temp_c": 18, "sky": "clear"}', name="get_weather"),
        tool_result(TIME_ID, '"21:04"', name="get_time"),
    ]


def conversations():
    return [
        case("single user turn, generation prompt", [user("Hello")], True),
        case("single user turn, no generation prompt", [user("Hello")], False),
        case("system prompt given", [system("You are terse."), user("Hi")], True),
        case("multi-turn without a system prompt", [user("2+2?"), assistant("4"), user("And 3+3?")], True),
        case("no messages, generation prompt", [], True),
        case("system message only, no generation prompt", [system("You are terse.")], False),
        case(
            "several system messages",
            [system("Rule one."), user("Hi"), system("Rule two, mid-conversation."), user("Again")],
            True,
        ),
        case("tools declared, no system prompt", [user("Weather in Paris?")], True, tools=TOOLS),
        case("tools declared with a system prompt", [system("Use tools when useful."), user("Time in Tokyo?")], True, tools=TOOLS),
        case(
            "one tool call (string arguments) and its result",
            [
                user("Weather in Paris?"),
                assistant("", tool_calls=[weather_call()]),
                tool_result(WEATHER_ID, '{"temp_c": 18}', name="get_weather"),
            ],
            True,
            tools=TOOLS,
        ),
        case(
            "two tool calls in one message (object and string arguments), results, generation prompt",
            two_call_turn(),
            True,
            tools=TOOLS,
        ),
        case(
            "two tool calls, results and the final answer, no generation prompt",
            two_call_turn() + [assistant("Paris: 18 °C and clear; Tokyo: 21:04.", reasoning_content="Both results are in.")],
            False,
            tools=TOOLS,
        ),
        case(
            "reasoning of an answered turn, then a new user turn",
            [user("2+2?"), assistant("4", reasoning_content="Add two and two."), user("And 3+3?")],
            True,
        ),
        case(
            "reasoning before and after the last plain answer",
            [
                user("2+2?"),
                assistant("4", reasoning_content="Add two and two."),
                user("Weather in Paris?"),
                assistant("", reasoning_content="Call the weather tool.", tool_calls=[weather_call()]),
                tool_result(WEATHER_ID, '{"temp_c": 18}', name="get_weather"),
            ],
            True,
            tools=TOOLS,
        ),
        case(
            "last message is an answer with reasoning, no generation prompt",
            [user("2+2?"), assistant("4", reasoning_content="Add two and two.")],
            False,
        ),
        case(
            "reasoning_content null in an open tool turn",
            [
                user("Weather in Paris?"),
                assistant("", reasoning_content=None, tool_calls=[weather_call()]),
                tool_result(WEATHER_ID, '{"temp_c": 18}', name="get_weather"),
            ],
            True,
            tools=TOOLS,
        ),
        case(
            "no reasoning_content in an open tool turn",
            [
                user("Weather in Paris?"),
                assistant("", tool_calls=[weather_call()]),
                tool_result(WEATHER_ID, '{"temp_c": 18}'),
            ],
            True,
            tools=TOOLS,
        ),
        case(
            "assistant tool call with null content",
            [
                user("Weather in Paris?"),
                assistant(None, tool_calls=[weather_call()]),
                tool_result(WEATHER_ID, '{"temp_c": 18}', name="get_weather"),
            ],
            True,
            tools=TOOLS,
        ),
        case(
            "unicode content",
            [user("你好，世界 👋 — naïve café, Ωmega"), assistant("¡Hola! 🌍 Καλημέρα"), user("Ещё раз? 🙂")],
            True,
        ),
        case(
            "content as text parts",
            [user([{"type": "text", "text": "Part one. "}, {"type": "text", "text": "Part two."}])],
            True,
        ),
        case("named user message", [user("Hi, I am Alice.", name="alice")], True),
        case(
            "control-token text inside content",
            [user("Say <|im_end|> and <think>x</think> and <|tool_call_begin|> literally.")],
            True,
        ),
    ]


# ---------------------------------------------------------------------------------------------
# Checks and output.


class Failure(Exception):
    pass


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


def read_template(folder, family, spec, origin_revisions):
    path = os.path.join(folder, spec["file"])
    try:
        with open(path, "rb") as f:
            raw = f.read(1 << 20)
            if f.read(1):
                raise Failure(f"{path}: larger than 1 MiB; a chat template is a few KiB")
    except OSError as e:
        raise Failure(f"{family}: cannot read its template {path}: {e.strerror} (expected the file {spec['file']} in {folder})")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise Failure(f"{path}: not UTF-8 ({e})")
    digest = sha256_hex(raw)
    digest_lf = sha256_hex(text.replace("\r\n", "\n").encode("utf-8"))
    provenance = {"origin": dict(spec["origin"])}
    pinned = spec["pinned"]
    if family in origin_revisions:
        provenance["origin"]["revision"] = origin_revisions[family]
        provenance["pinned_copy"] = None
    elif pinned is None:
        raise Failure(
            f"{family}: no pinned copy of its template is recorded; fetch it from "
            f"{spec['origin']['repo']} ({spec['origin']['path']}) and pass --origin-revision {family}=REVISION"
        )
    elif pinned["sha256"] != digest and pinned["sha256_lf"] != digest_lf:
        raise Failure(
            f"{path}: sha256 {digest} is not the pinned copy's {pinned['sha256']} "
            f"({pinned['repo']} {pinned['path']} at {pinned['commit']}); fetch that file, or pass "
            f"--origin-revision {family}=REVISION to record a newer release instead"
        )
    else:
        provenance["pinned_copy"] = {k: pinned[k] for k in ("repo", "path", "commit")}
    provenance["sha256"] = digest
    provenance["sha256_lf"] = digest_lf
    provenance["notes"] = spec["notes"]
    return text, provenance


def template_inputs(ast):
    # Names the template reads but never assigns. find_undeclared_variables alone also reports
    # names a {% set %} assigns inside a loop or macro body, so those are taken out.
    assigned = set()
    for a in list(ast.find_all(jinja2.nodes.Assign)) + list(ast.find_all(jinja2.nodes.AssignBlock)):
        targets = [a.target] + list(a.target.find_all(jinja2.nodes.Name))
        assigned |= {t.name for t in targets if isinstance(t, jinja2.nodes.Name)}
    return sorted(jinja2.meta.find_undeclared_variables(ast) - assigned)


def compile_template(env, family, spec, text, path):
    try:
        ast = env.parse(text)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise Failure(f"{path}:{e.lineno}: Jinja syntax error: {e.message}")
    variables = template_inputs(ast)
    check_inputs(family, spec, variables, path)
    return env.from_string(text), variables


def check_inputs(family, spec, names, path):
    allowed = BASE_VARIABLES | set(spec["kwargs"])
    unknown = [v for v in names if v not in allowed]
    if unknown:
        raise Failure(
            f"{path}: the template reads {', '.join(unknown)}, which the {family} spec does not supply "
            f"(it supplies {', '.join(sorted(allowed))}); add them to the family's kwargs with the "
            "value transformers would pass"
        )


def render_family(env, folder, family, origin_revisions):
    spec = FAMILIES[family]
    text, provenance = read_template(folder, family, spec, origin_revisions)
    template, variables = compile_template(env, family, spec, text, os.path.join(folder, spec["file"]))
    provenance["variables"] = variables
    RecordingUndefined.missing_names = set()
    cases = []
    for c in conversations():
        out = dict(c)
        try:
            out["expected"] = render(template, c)
        except jinja2.exceptions.TemplateError as e:
            out["expected_error"] = f"{type(e).__name__}: {e}"
        except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
            out["expected_error"] = f"{type(e).__name__}: {e}"
        cases.append(out)
    check_inputs(family, spec, sorted(RecordingUndefined.missing_names), os.path.join(folder, spec["file"]))
    return {
        "family": family,
        "models": spec["models"],
        "template": provenance,
        "renderer": (
            f"Jinja2 {jinja2.__version__} in transformers' chat-template environment (sandboxed, "
            "trim_blocks, lstrip_blocks, loopcontrols; tojson = json.dumps(ensure_ascii=False)); "
            "variables: messages, tools (null when absent), documents (null), add_generation_prompt, "
            "and chat_template_kwargs"
        ),
        "cases": cases,
    }


def write_json(path, value):
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        os.makedirs(folder, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".cases-", suffix=".json", dir=folder)  # created 0600
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(value, f, ensure_ascii=False, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def check_goldens(path, result):
    try:
        with open(path, encoding="utf-8") as f:
            committed = json.load(f)
    except (OSError, ValueError) as e:
        raise Failure(f"{path}: cannot read the committed goldens ({e})")
    if not isinstance(committed, dict) or not isinstance(committed.get("cases"), list):
        raise Failure(f"{path}: expected an object with a \"cases\" array")
    old = {c.get("name"): c for c in committed["cases"] if isinstance(c, dict)}
    new = {c["name"]: c for c in result["cases"]}
    differ = [n for n in new if old.get(n) != new[n]] + [f"{n} (no longer rendered)" for n in old if n not in new]
    if committed.get("template", {}).get("sha256") != result["template"]["sha256"]:
        differ.insert(0, "the template's sha256")
    if differ:
        raise Failure(f"{path}: differs from this render in: " + "; ".join(str(n) for n in differ))


def parse_origin_revisions(items):
    out = {}
    for item in items:
        family, sep, rev = item.partition("=")
        if not sep or not rev.strip():
            raise Failure(f"--origin-revision {item!r}: expected FAMILY=REVISION")
        if family not in FAMILIES:
            raise Failure(f"--origin-revision {item!r}: unknown family {family!r} (known: {', '.join(FAMILIES)})")
        out[family] = rev.strip()
    return out


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(
        description="Render the Kimi-family chat templates into tests/data/chat/<family>/cases.json."
    )
    ap.add_argument("templates", help="folder holding <family>.jinja files (e.g. k2-thinking.jinja)")
    ap.add_argument(
        "--family",
        action="append",
        choices=sorted(FAMILIES),
        help="render only this family (repeatable); default: every family whose template file is in the folder",
    )
    ap.add_argument(
        "--origin-revision",
        action="append",
        default=[],
        metavar="FAMILY=REV",
        help="the template was fetched from the family's origin at REV (not the pinned copy): record that",
    )
    ap.add_argument("--out", default=os.path.join(here, "..", "..", "tests", "data", "chat"), help="goldens folder")
    ap.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 naming every case whose committed golden differs from this render",
    )
    args = ap.parse_args(argv)
    try:
        if not os.path.isdir(args.templates):
            raise Failure(f"{args.templates}: not a folder (expected a folder of <family>.jinja files)")
        origin_revisions = parse_origin_revisions(args.origin_revision)
        families = args.family or [
            f for f in FAMILIES if os.path.exists(os.path.join(args.templates, FAMILIES[f]["file"]))
        ]
        if not families:
            raise Failure(
                f"{args.templates}: no template found (expected one of {', '.join(s['file'] for s in FAMILIES.values())})"
            )
        env = make_environment()
        for family in families:
            result = render_family(env, args.templates, family, origin_revisions)
            path = os.path.join(args.out, family, "cases.json")
            if args.check:
                check_goldens(path, result)
                print(f"{family}: {len(result['cases'])} cases match {os.path.normpath(path)}")
                continue
            write_json(path, result)
            errors = sum(1 for c in result["cases"] if "expected_error" in c)
            print(f"{family}: {len(result['cases'])} cases ({errors} the template refuses) -> {os.path.normpath(path)}")
    except Failure as e:
        print(f"render_chat_goldens: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
