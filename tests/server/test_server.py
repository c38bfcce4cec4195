#!/usr/bin/env python3
"""End-to-end tests of llm-server through the official `openai` Python client.

    python3 tests/server/test_server.py LLM_SERVER_BINARY MODELS_DIR

Model: $LLM_GEMMA3_GGUF when set (it has its own chat template), else
MODELS_DIR/stories260K.gguf with tests/data/chat_templates/google-gemma-2-2b-it.jinja.
Each server is started on a free port (--port 0, the port read from its log)
and stopped by the script; the whole run is bounded by an alarm.
Exit status: 0 passed, 1 failed, 77 skipped (no `openai` module or no model).
"""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATE = os.path.join(HERE, "..", "data", "chat_templates", "google-gemma-2-2b-it.jinja")
API_KEY = "test-key-123"

try:
    import openai
except ImportError:
    print("SKIP: the `openai` Python package is not installed (pip install openai)")
    sys.exit(SKIP)


class Server:
    """One llm-server process on a free port; its log goes to a buffer."""

    def __init__(self, binary, model, extra, template=None):
        cmd = [binary, "-m", model, "--port", "0", "--model-name", "test-model"] + extra
        if template:
            cmd += ["--chat-template-file", template]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
        self.log = []
        self.url = None
        deadline = time.time() + 60
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            self.log.append(line)
            m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
            if m:
                self.url = m.group(1)
                break
        if not self.url:
            self.proc.kill()
            raise RuntimeError("the server did not start:\n" + "".join(self.log))
        self.drain = threading.Thread(target=self._drain, daemon=True)
        self.drain.start()

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    def client(self, api_key=API_KEY, **kw):
        return openai.OpenAI(base_url=self.url + "/v1", api_key=api_key, max_retries=0, timeout=120, **kw)

    def stop(self, sig=signal.SIGTERM, timeout=30):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def http(url, method="GET", body=None, headers=None, timeout=60):
    """(status, parsed JSON or text) of a raw request."""
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, data = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, data = e.code, e.read()
    try:
        return status, json.loads(data)
    except ValueError:
        return status, data.decode("utf-8", "replace")


def metrics(server):
    status, text = http(server.url + "/metrics", headers={"Authorization": "Bearer " + API_KEY})
    assert status == 200, status
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        name, value = line.rsplit(" ", 1)
        out[name] = float(value)
    return out


def check_error(status, body, want_status, want_code=None):
    assert status == want_status, (status, body)
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    err = body["error"]
    for key in ("message", "type", "param", "code"):
        assert key in err, (key, err)
    assert isinstance(err["message"], str) and err["message"], err
    if want_code:
        assert err["code"] == want_code, err


# ---------------------------------------------------------------- cases

MSGS = [{"role": "user", "content": "Tell me a short story about a cat."}]


def t_health_models(s, ctx):
    assert http(s.url + "/health") == (200, {"status": "ok"})  # no key needed
    models = s.client().models.list()
    ids = [m.id for m in models.data]
    assert ids == ["test-model"], ids
    assert s.client().models.retrieve("test-model").id == "test-model"


def t_chat(s, ctx):
    r = s.client().chat.completions.create(model="test-model", messages=MSGS, max_tokens=ctx["n"], temperature=0)
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert isinstance(c.message.content, str) and c.message.content, r
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= ctx["n"], u
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    if c.finish_reason == "length":
        assert u.completion_tokens == ctx["n"], u
    ctx["greedy"] = c.message.content
    # max_tokens ends a completion with "length" (ignore_eos: an extension, sent as extra_body).
    r = s.client().completions.create(model="test-model", prompt="Once upon a time", max_tokens=5, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 5, r


def t_stream(s, ctx):
    stream = s.client().chat.completions.create(model="test-model", messages=MSGS, max_tokens=ctx["n"],
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True})
    text, roles, finishes, usage = "", [], [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            text += ch.delta.content or ""
            if ch.finish_reason:
                finishes.append(ch.finish_reason)
    assert roles == ["assistant"], roles
    assert len(finishes) == 1 and finishes[0] in ("stop", "length"), finishes
    assert text == ctx["greedy"], (text, ctx["greedy"])  # greedy: the same text as without streaming
    assert usage is not None and usage.completion_tokens > 0, usage
    # Legacy completions stream too.
    n = 0
    for chunk in s.client().completions.create(model="test-model", prompt="Once upon a time", max_tokens=8,
                                               temperature=0, stream=True):
        n += 1
    assert n >= 2, n


def t_seed(s, ctx):
    def run(seed):
        r = s.client().chat.completions.create(model="test-model", messages=MSGS, max_tokens=ctx["n"],
                                               temperature=0.9, top_p=0.95, seed=seed)
        return r.choices[0].message.content
    a, b = run(1234), run(1234)
    assert a == b, (a, b)


CACHE_MSGS = [{"role": "user", "content": "Write two sentences about a dog and a ball."}]


def cache_run(s, ctx, messages=CACHE_MSGS):
    r = s.client().chat.completions.create(model="test-model", messages=messages, max_tokens=ctx["n"],
                                           temperature=0.9, seed=77)
    return r.choices[0].message.content


def t_prompt_cache(s, ctx):
    """A repeated prompt and a second turn of a conversation take their prefix from a kept
    session (llm_prompt_cache_tokens_total grows) and give the text they give computed fresh
    (t_limits asks the same of a server with --prompt-cache 0)."""
    first = cache_run(s, ctx)
    m0 = metrics(s)
    again = cache_run(s, ctx)
    m1 = metrics(s)
    reused = m1["llm_prompt_cache_tokens_total"] - m0["llm_prompt_cache_tokens_total"]
    prefilled = m1["llm_prompt_tokens_total"] - m0["llm_prompt_tokens_total"]
    assert again == first, (again, first)
    assert reused >= 4 and prefilled == 1, (reused, prefilled)
    turn2 = CACHE_MSGS + [{"role": "assistant", "content": first}, {"role": "user", "content": "And then?"}]
    cache_run(s, ctx, turn2)
    m2 = metrics(s)
    assert m2["llm_prompt_cache_tokens_total"] - m1["llm_prompt_cache_tokens_total"] >= reused, (m1, m2)
    assert m2["llm_prompt_cache_sessions"] >= 1, m2
    ctx["cache_text"] = first
    ctx["report"].append("prompt cache: a repeated prompt prefilled %d token, took %d from a kept session" % (
        prefilled, reused))


def t_stop(s, ctx):
    full = ctx["greedy"]
    # A stop string from the middle of the greedy answer: the answer must end right before it.
    start = max(1, len(full) // 3)
    stop = full[start:start + 3]
    assert len(stop) == 3, full
    want = full[:full.find(stop)]
    r = s.client().chat.completions.create(model="test-model", messages=MSGS, max_tokens=ctx["n"], temperature=0,
                                           stop=[stop, "\u2603never"])
    assert r.choices[0].message.content == want, (r.choices[0].message.content, want, stop)
    assert r.choices[0].finish_reason == "stop"
    text = ""
    for chunk in s.client().chat.completions.create(model="test-model", messages=MSGS, max_tokens=ctx["n"],
                                                    temperature=0, stop=stop, stream=True):
        for ch in chunk.choices:
            text += ch.delta.content or ""
    assert text == want, (text, want)


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "pet": {"enum": ["cat", "dog", "fish"]},
    },
    "required": ["name", "age", "pet"],
    "additionalProperties": False,
}


def t_json_schema(s, ctx):
    for temperature in (0, 0.8):
        r = s.client().chat.completions.create(
            model="test-model", messages=[{"role": "user", "content": "Describe a person as JSON."}],
            max_tokens=200, temperature=temperature, seed=7,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}})
        c = r.choices[0]
        assert c.finish_reason == "stop", (c.finish_reason, c.message.content)
        v = json.loads(c.message.content)
        assert set(v) == {"name", "age", "pet"}, v
        assert isinstance(v["name"], str) and len(v["name"]) <= 12, v
        assert isinstance(v["age"], int) and not isinstance(v["age"], bool), v
        assert v["pet"] in ("cat", "dog", "fish"), v
    # json_object: what comes back is JSON text that starts an object.
    r = s.client().chat.completions.create(model="test-model", messages=MSGS, max_tokens=40, temperature=0,
                                           response_format={"type": "json_object"})
    content = r.choices[0].message.content
    assert content.lstrip().startswith("{"), content
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict), content
    # A schema outside the subset is a 400.
    try:
        s.client().chat.completions.create(
            model="test-model", messages=MSGS, max_tokens=4,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer",
                                                                                          "minimum": 3}}})
        raise AssertionError("no error for an unsupported schema")
    except openai.BadRequestError as e:
        check_error(400, e.response.json(), 400)


def t_errors(s, ctx):
    auth = {"Authorization": "Bearer " + API_KEY, "Content-Type": "application/json"}
    url = s.url + "/v1/chat/completions"
    status, body = http(url, "POST", b'{"model": "test-model", "messages": [', auth)
    check_error(status, body, 400, "invalid_json")
    status, body = http(url, "POST", b'{"model": "test-model", "messages": "hi"}', auth)
    check_error(status, body, 400)
    status, body = http(url, "POST", json.dumps({"model": "test-model", "messages": MSGS,
                                                 "temperature": "hot"}).encode(), auth)
    check_error(status, body, 400)
    try:
        s.client().chat.completions.create(model="no-such-model", messages=MSGS, max_tokens=4)
        raise AssertionError("no error for an unknown model")
    except openai.NotFoundError as e:
        check_error(404, e.response.json(), 404, "model_not_found")
    big = json.dumps({"model": "test-model", "messages": [{"role": "user", "content": "x" * 100000}]}).encode()
    status, body = http(url, "POST", big, auth)
    check_error(status, body, 413)
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status, body = http(url, "POST", json.dumps({"messages": MSGS}).encode(), headers)
        check_error(status, body, 401, "invalid_api_key")
        status, body = http(s.url + "/v1/models", headers=headers)
        check_error(status, body, 401, "invalid_api_key")
    try:
        s.client(api_key="wrong").chat.completions.create(model="test-model", messages=MSGS, max_tokens=4)
        raise AssertionError("no error for a wrong API key")
    except openai.AuthenticationError as e:
        check_error(401, e.response.json(), 401)
    status, body = http(s.url + "/no/such/path", headers=auth)
    check_error(status, body, 404)


def t_concurrent(s, ctx):
    results, errors = [None] * 8, []

    def one(i):
        try:
            text, finish = "", None
            for chunk in s.client().chat.completions.create(
                    model="test-model", messages=[{"role": "user", "content": "Story number %d" % i}],
                    max_tokens=ctx["n"], temperature=0.7, seed=i, stream=True):
                for ch in chunk.choices:
                    text += ch.delta.content or ""
                    finish = ch.finish_reason or finish
            results[i] = (text, finish)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    m0 = metrics(s)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    first3 = results[3]
    assert not errors, errors
    for r in results:
        assert r is not None and r[1] in ("stop", "length"), results
    # Eight seeds shared batched passes (llm_decode_batch_each), and a request gives the same
    # text alone as it gave beside the others.
    m1 = metrics(s)
    batched = (m1["llm_decode_batch_sessions_sum"] - m0["llm_decode_batch_sessions_sum"]) / max(
        1.0, m1["llm_decode_batch_sessions_count"] - m0["llm_decode_batch_sessions_count"])
    assert batched > 1.0, "no decode step held more than one request (mean %.2f)" % batched
    ctx["report"].append("concurrent: %.2f requests per decode step" % batched)
    one(3)
    assert results[3] == first3, (results[3], first3)


def t_prefill_while_decoding(s, ctx):
    # The server runs with --prefill-chunk-decoding 8: a prompt that arrives while a stream is
    # decoding is prefilled at most 8 tokens per step (each step holds the running stream).
    m0 = metrics(s)
    started, errors = threading.Event(), []

    def long_stream():
        try:
            for chunk in s.client().chat.completions.create(
                    model="test-model", messages=MSGS, max_tokens=ctx["overlap"], temperature=0, stream=True,
                    extra_body={"ignore_eos": True}):
                if any(ch.delta.content for ch in chunk.choices):
                    started.set()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
        finally:
            started.set()

    client = s.client()  # made before the stream starts: the stream may be short
    prompt = " ".join("Count %d and %d more." % (i, 7 * i) for i in range(20))  # ~150 tokens, not cached
    t = threading.Thread(target=long_stream)
    t.start()
    assert started.wait(120), "the long stream never started"
    r = client.chat.completions.create(model="test-model", messages=[{"role": "user", "content": prompt}],
                                           max_tokens=2, temperature=0)
    t.join(180)
    assert not errors, errors
    assert r.usage.prompt_tokens > 8, r.usage
    m1 = metrics(s)
    name = "llm_step_prompt_tokens_decoding"
    steps = m1[name + "_count"] - m0[name + "_count"]
    within = m1[name + '_bucket{le="8"}'] - m0[name + '_bucket{le="8"}']
    assert steps > 0, "no prompt was prefilled beside a decoding stream"
    assert within == steps, "%d of %d such steps held more than 8 prompt tokens" % (steps - within, steps)
    ctx["report"].append("prefill while decoding: %d steps of at most 8 prompt tokens" % steps)


def wait_idle(s, baseline, timeout=30):
    deadline = time.time() + timeout
    while True:
        m = metrics(s)
        if m["llm_requests_active"] == 0 and m["llm_kv_pages_in_use"] == baseline:
            return m
        if time.time() > deadline:
            raise AssertionError("not idle: active %s, kv pages %s (baseline %s)" % (
                m["llm_requests_active"], m["llm_kv_pages_in_use"], baseline))
        time.sleep(0.1)


def t_disconnect(s, ctx):
    m0 = wait_idle(s, 0)
    pages0 = m0["llm_kv_pages_in_use"]
    cancelled0 = m0["llm_requests_cancelled_total"]
    errors, peak = [], [0.0]

    def one(i):
        try:
            stream = s.client().chat.completions.create(
                model="test-model", messages=[{"role": "user", "content": "Go on %d" % i}],
                max_tokens=ctx["long"], temperature=1.0, seed=i, stream=True, extra_body={"ignore_eos": True})
            n = 0
            for _ in stream:
                n += 1
                if n == 3:
                    break
            stream.close()  # drops the connection mid-stream
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(50)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak[0] = max(peak[0], metrics(s)["llm_kv_pages_in_use"])
        time.sleep(0.05)
    assert not errors, errors
    m = wait_idle(s, pages0)
    cancelled = m["llm_requests_cancelled_total"] - cancelled0
    assert cancelled >= 25, "only %d of 50 streams were cancelled" % cancelled
    assert peak[0] > pages0, "KV pages never rose above the baseline"
    ctx["report"].append("disconnect: %d cancelled, peak %d KV pages, back to %d" % (cancelled, peak[0], pages0))


def t_metrics(s, ctx):
    m = metrics(s)
    for name in ("llm_prompt_tokens_total", "llm_generated_tokens_total", "llm_queue_depth",
                 "llm_requests_active", "llm_kv_pages_in_use", "llm_time_to_first_token_seconds_count",
                 "llm_inter_token_latency_seconds_count", "llm_decode_batch_sessions_count"):
        assert name in m, name
    assert m["llm_generated_tokens_total"] > 0 and m["llm_time_to_first_token_seconds_count"] > 0, m
    assert m.get('llm_requests_total{endpoint="/v1/chat/completions",status="200"}', 0) > 0, m
    assert m.get('llm_requests_total{endpoint="/v1/chat/completions",status="401"}', 0) > 0, m


def t_limits(binary, model, template, ctx):
    """A server with one slot and a queue of one: the third request is a 429;
    (stories260K) a KV budget too small for a long prompt: 503; SIGINT ends running streams
    with a final event and [DONE], and the process exits 0."""
    extra = ["--parallel", "1", "--queue", "1", "--prompt-cache", "0"] + (
        ["--kv-budget-mib", "1"] if ctx["kv_prompt"] else [])
    s = Server(binary, model, extra, template)
    try:
        c = s.client(api_key="unused")
        if "cache_text" in ctx:  # the main server's text, from kept sessions, equals the fresh one
            assert cache_run(s, ctx) == ctx["cache_text"]
        statuses, lock = [], threading.Lock()

        def one(i):
            try:
                c.chat.completions.create(model="test-model", messages=MSGS, max_tokens=ctx["busy"],
                                          temperature=0, extra_body={"ignore_eos": True})
                code = 200
            except openai.APIStatusError as e:
                check_error(e.status_code, e.response.json(), e.status_code)
                code = e.status_code
            with lock:
                statuses.append(code)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
            time.sleep(0.02)
        for t in threads:
            t.join(180)
        assert statuses.count(429) >= 1 and statuses.count(200) >= 1, statuses
        assert all(x in (200, 429) for x in statuses), statuses
        # A prompt that does not fit the KV budget (but fits the context): 503.
        if ctx["kv_prompt"]:
            try:
                c.completions.create(model="test-model", prompt=ctx["kv_prompt"], max_tokens=4)
                raise AssertionError("no error for a prompt over the KV budget")
            except openai.APIStatusError as e:
                check_error(e.status_code, e.response.json(), 503, "kv_cache_full")
            r = c.completions.create(model="test-model", prompt="Once upon a time", max_tokens=4, temperature=0)
            assert r.choices[0].text is not None  # the pool is whole again: later requests succeed
        # Shutdown with a stream running.
        got, streaming = {}, threading.Event()

        def streamer():
            finish, n = None, 0
            try:
                for chunk in c.chat.completions.create(model="test-model", messages=MSGS, max_tokens=ctx["long"],
                                                       temperature=0, stream=True, extra_body={"ignore_eos": True}):
                    n += 1
                    streaming.set()
                    for ch in chunk.choices:
                        finish = ch.finish_reason or finish
                got["finish"], got["n"] = finish, n
            except Exception as e:  # noqa: BLE001 - checked below
                got["error"] = repr(e)
            streaming.set()

        t = threading.Thread(target=streamer)
        t.start()
        assert streaming.wait(120), "the stream did not start"
        rc = s.stop(signal.SIGINT)
        t.join(30)
        assert rc == 0, (rc, "".join(s.log))
        assert got.get("finish") == "stop", got  # the stream iterator ended on [DONE]
    finally:
        s.stop(signal.SIGKILL)


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS for pid %d" % pid)


def t_memory(binary, models_dir, ctx):
    """Resident memory after 1,000 requests is within 10% of after 300 (stories260K, so that
    1,000 requests take seconds): four clients, streamed and not, sampled and greedy."""
    # A small queue: every HTTP thread (parallel + queue + 16) warms its stack and malloc arena once,
    # which on this 15 MB server would otherwise read as growth.
    s = Server(binary, os.path.join(models_dir, "stories260K.gguf"), ["--parallel", "4", "--queue", "4"], TEMPLATE)
    try:
        errors, lock = [], threading.Lock()

        def batch(first, count):
            def worker(w):
                c = s.client(api_key="unused")
                for i in range(first + w, first + count, 4):
                    try:
                        kw = dict(model="test-model", max_tokens=8 + i % 9, temperature=(i % 3) * 0.5, seed=i)
                        if i % 2:
                            for _ in c.completions.create(prompt="Once upon a time %d" % i, stream=True, **kw):
                                pass
                        else:
                            c.chat.completions.create(messages=[{"role": "user", "content": "Tale %d" % i}], **kw)
                    except Exception as e:  # noqa: BLE001 - reported below
                        with lock:
                            errors.append(repr(e))
            threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            assert not errors, errors[:3]

        # The baseline is taken after 300 requests: by 100, not every HTTP thread had served one
        # (their arenas then read as growth: 2-12% between runs of the same binary), by 300 they have.
        batch(0, 300)
        rss300 = rss_kib(s.proc.pid)
        batch(300, 700)
        rss1000 = rss_kib(s.proc.pid)
        ctx["report"].append("memory: VmRSS %d KiB after 300 requests, %d KiB after 1000 (%.1f%%)" % (
            rss300, rss1000, 100.0 * (rss1000 - rss300) / rss300))
        assert rss1000 <= rss300 * 1.10, (rss300, rss1000)
    finally:
        s.stop(signal.SIGKILL)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    binary, models_dir = sys.argv[1], sys.argv[2]
    gemma = os.environ.get("LLM_GEMMA3_GGUF")
    if gemma and os.path.exists(gemma):
        model, template = gemma, None
        ctx = {"n": 12, "long": 400, "busy": 40, "kv_prompt": None, "overlap": 64}
    else:
        model, template = os.path.join(models_dir, "stories260K.gguf"), TEMPLATE
        # stories260K: 640 bytes of f16 KV per token, so 1 MiB holds ~1600 tokens.
        ctx = {"n": 24, "long": 1500, "busy": 1500, "kv_prompt": "Once upon a time " * 420, "overlap": 400}
    if not os.path.exists(model):
        print("SKIP: no model at %s" % model)
        return SKIP
    if not os.access(binary, os.X_OK):
        print("FAIL: no server binary at %s" % binary)
        return 1
    signal.alarm(int(os.environ.get("LLM_SERVER_TEST_TIMEOUT", "400")))
    ctx["report"] = []
    failures = []
    s = Server(binary, model, ["--api-key", API_KEY, "--max-body", "65536", "--parallel", "4", "--queue", "64",
                               "--prefill-chunk-decoding", "8"], template)
    try:
        for case in (t_health_models, t_chat, t_stream, t_seed, t_prompt_cache, t_stop, t_json_schema, t_errors, t_concurrent,
                     t_prefill_while_decoding, t_disconnect, t_metrics):
            t0 = time.time()
            try:
                case(s, ctx)
                print("PASS %-16s %.2fs" % (case.__name__[2:], time.time() - t0), flush=True)
            except Exception as e:  # noqa: BLE001 - every case runs; failures are listed at the end
                failures.append(case.__name__)
                print("FAIL %-16s %r" % (case.__name__[2:], e), flush=True)
                if "greedy" not in ctx and case is t_chat:
                    break
    finally:
        rc = s.stop()
        if rc != 0:
            failures.append("shutdown (exit status %s)" % rc)
    t0 = time.time()
    try:
        t_limits(binary, model, template, ctx)
        print("PASS %-16s %.2fs" % ("limits", time.time() - t0), flush=True)
    except Exception as e:  # noqa: BLE001
        failures.append("limits")
        print("FAIL %-16s %r" % ("limits", e), flush=True)
    t0 = time.time()
    try:
        t_memory(binary, models_dir, ctx)
        print("PASS %-16s %.2fs" % ("memory", time.time() - t0), flush=True)
    except Exception as e:  # noqa: BLE001
        failures.append("memory")
        print("FAIL %-16s %r" % ("memory", e), flush=True)
    for line in ctx["report"]:
        print(line)
    if failures:
        print("FAILED: " + ", ".join(failures))
        print("server log:\n" + "".join(s.log[-40:]))
        return 1
    print("all server tests passed (%s)" % os.path.basename(model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
