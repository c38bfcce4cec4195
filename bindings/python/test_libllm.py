"""unittest suite of the ctypes binding against the real library and the
stories260K reference vectors (case 0 of reference/stories260K_greedy.json)."""
import json
import os
import threading
import unittest

import libllm

MODELS = os.environ.get("LLM_MODELS_DIR") or os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared",
                                                          "models")
STORIES = os.path.join(MODELS, "stories260K.gguf")

with open(os.path.join(MODELS, "reference", "stories260K_greedy.json"), encoding="utf-8") as f:
    REF = json.load(f)["cases"][0]


def load_stories(**kw):
    # One compute thread: tests run next to other jobs on small CI machines.
    kw.setdefault("device", libllm.Device.CPU)
    kw.setdefault("n_threads", 1)
    return libllm.Model(STORIES, **kw)


class VersionAndLayout(unittest.TestCase):
    def test_version(self):
        self.assertEqual(libllm.version(), libllm.HEADER_VERSION)
        self.assertEqual(libllm.version_string(), "0.4.0")

    def test_struct_sizes(self):
        # x86-64 / LP64 values pinned by tests/abi/layout_test.cpp.
        import ctypes
        sizes = {libllm._LoadParams: 64, libllm._ModelProperties: 112, libllm._DetokState: 16,
                 libllm._SessionParams: 40, libllm._Sampling: 48, libllm._SessionStats: 80,
                 libllm._ChatMessage: 16, libllm._ChatParams: 24}
        for struct, size in sizes.items():
            self.assertEqual(ctypes.sizeof(struct), size, struct.__name__)
        self.assertEqual(libllm._ModelProperties.architecture.offset, 64)
        self.assertEqual(libllm._SessionParams.cancel.offset, 24)
        self.assertEqual(libllm._SessionStats.n_evicted.offset, 72)
        self.assertEqual(libllm._Sampling.grammar.offset, 40)
        self.assertEqual(libllm._ChatParams.add_generation_prompt.offset, 16)


class Reference(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = load_stories()

    @classmethod
    def tearDownClass(cls):
        cls.model.close()

    def test_case0(self):
        self.assertEqual(REF["prompt"], "Once upon a time")
        info = self.model.info()
        self.assertEqual((info["vocab_size"], info["n_layers"], info["dim"], info["bos"]), (512, 5, 64, 1))
        self.assertEqual(info["architecture"], "llama")

        prompt = self.model.tokenize(REF["prompt"])
        self.assertEqual(prompt, REF["prompt_token_ids"])
        self.assertEqual(self.model.detokenize(prompt), REF["prompt"])

        with self.model.session() as s:
            s.prefill(prompt)
            logits = s.logits()
            self.assertEqual(len(logits), 512)
            self.assertEqual(max(range(512), key=lambda i: (logits[i], -i)), REF["generated_token_ids"][0])
            ids = [s.decode_step() for _ in range(64)]
            self.assertEqual(ids, REF["generated_token_ids"])
            st = s.stats()
            self.assertEqual((st["n_prompt"], st["n_generated"], st["n_tokens"]), (5, 64, 69))

            s.reset()
            pieces = list(s.generate(REF["prompt"], max_tokens=64))
            self.assertEqual([p.token for p in pieces], REF["generated_token_ids"])
            self.assertEqual("".join(p.text for p in pieces), REF["generated_text"])

            s.reset()
            explicit_greedy = libllm.Sampling(temperature=0.0)
            text = "".join(p.text for p in s.generate(REF["prompt"], 64, explicit_greedy))
            self.assertEqual(text, REF["generated_text"])

    def test_threads_share_the_model(self):
        want = REF["generated_token_ids"][:24]
        results, errors = {}, []

        def work(i):
            try:
                with self.model.session() as s:
                    s.prefill(REF["prompt_token_ids"])
                    results[i] = [s.decode_step() for _ in range(24)]
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual([results[i] for i in range(4)], [want] * 4)

    def test_errors(self):
        with self.assertRaises(libllm.LlmError) as cm:
            libllm.Model(os.path.join(MODELS, "does-not-exist.gguf"))
        self.assertEqual(cm.exception.status, libllm.Status.IO)
        self.assertTrue(cm.exception.message)
        with self.assertRaises(libllm.LlmError) as cm:
            libllm.Model(os.path.join(MODELS, "README.md"))
        self.assertEqual(cm.exception.status, libllm.Status.FORMAT)
        with self.model.session() as s:
            with self.assertRaises(libllm.LlmError) as cm:
                s.decode_step()
            self.assertEqual(cm.exception.status, libllm.Status.INVALID_ARGUMENT)
            with self.assertRaises(libllm.LlmError) as cm:
                s.prefill([100000])
            self.assertEqual(cm.exception.status, libllm.Status.INVALID_ARGUMENT)
            s.prefill(REF["prompt_token_ids"])
            self.assertEqual(s.decode_step(), REF["generated_token_ids"][0])
            with self.assertRaises(libllm.LlmError) as cm:
                s.kv_evict(0, 1000)
            self.assertEqual(cm.exception.status, libllm.Status.INVALID_ARGUMENT)

    def test_detokenizer_holds_back_incomplete_utf8(self):
        # "ö" is not in the vocabulary: byte fallback gives <0xC3> <0xB6> = ids 198, 185.
        self.assertEqual(self.model.tokenize("ö", add_bos=False)[-2:], [198, 185])
        d = self.model.detokenizer(378)
        self.assertEqual([d.push(198), d.push(185), d.push(198)], ["", "ö", ""])
        self.assertEqual(d.flush(), "\ufffd")


    def test_fork_and_save_restore(self):
        want = REF["generated_token_ids"]
        with self.model.session() as s:
            s.prefill(REF["prompt_token_ids"])
            self.assertEqual([s.decode_step() for _ in range(10)], want[:10])
            fork = s.fork()
            saved = s.save()
            self.assertIsInstance(saved, bytes)
            self.assertGreater(len(saved), 0)
            self.assertEqual([s.decode_step() for _ in range(10)], want[10:20])
        # The fork outlives its parent and runs on another thread.
        out = []
        t = threading.Thread(target=lambda: out.extend(fork.decode_step() for _ in range(10)))
        t.start()
        t.join()
        fork.close()
        self.assertEqual(out, want[10:20])
        with self.model.restore_session(saved) as r:
            self.assertEqual(r.stats()["n_tokens"], 15)
            self.assertEqual([r.decode_step() for _ in range(10)], want[10:20])
        bad = bytearray(saved)
        bad[len(bad) // 2] ^= 0x55
        for damaged in (bytes(bad), saved[:len(saved) // 3]):
            with self.assertRaises(libllm.LlmError) as cm:
                self.model.restore_session(damaged)
            self.assertIn(cm.exception.status, (libllm.Status.FORMAT, libllm.Status.CHECKSUM))


BATCH_PROMPTS = ["Once upon a time", "Lily had a", "Tom and Sam went"]


class DecodeBatch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = load_stories()

    @classmethod
    def tearDownClass(cls):
        cls.model.close()

    def prompted(self, prompt, model=None, **session_options):
        model = model or self.model
        s = model.session(**session_options)
        self.addCleanup(s.close)
        s.prefill(model.tokenize(prompt))
        return s

    def test_equals_stepping_each_session_alone(self):
        sampling = libllm.Sampling(temperature=0.9, seed=5)
        batch = [self.prompted(p) for p in BATCH_PROMPTS]
        alone = [self.prompted(p) for p in BATCH_PROMPTS]
        streams = [[] for _ in BATCH_PROMPTS]
        for step in range(20):
            got = libllm.decode_batch(batch, sampling)
            self.assertEqual(len(got), 3)
            for i, s in enumerate(alone):
                self.assertEqual(got[i], s.decode_step(sampling), "session %d step %d" % (i, step))
                streams[i].append(got[i])
        self.assertNotEqual(streams[0], streams[1])
        self.assertNotEqual(streams[1], streams[2])
        self.assertEqual(libllm.decode_batch([], sampling), [])
        # Any iterable of sessions will do.
        got = libllm.decode_batch(iter(batch), sampling)
        self.assertEqual(got, [s.decode_step(sampling) for s in alone])

    def test_each_session_its_own_sampling(self):
        each = [None, libllm.Sampling(temperature=0.9, seed=5), libllm.Sampling(temperature=1.3, top_k=20, seed=77)]
        batch = [self.prompted(p) for p in BATCH_PROMPTS]
        alone = [self.prompted(p) for p in BATCH_PROMPTS]
        for step in range(10):
            got = libllm.decode_batch(batch, each)
            self.assertEqual(got, [s.decode_step(sp) for s, sp in zip(alone, each)], "step %d" % step)
        with self.assertRaises(ValueError):
            libllm.decode_batch(batch, each[:2])

    def test_rejects_duplicates_and_foreign_models(self):
        a = self.prompted("Lily had a")
        fresh = self.prompted("Lily had a")
        with self.assertRaises(libllm.LlmError) as cm:
            libllm.decode_batch([a, a])
        self.assertEqual(cm.exception.status, libllm.Status.INVALID_ARGUMENT)
        self.assertTrue(cm.exception.message)
        self.assertEqual(cm.exception.tokens, [-1, -1])
        with load_stories() as other:  # the same file loaded twice is another C model
            b = self.prompted("Lily had a", model=other)
            with self.assertRaises(libllm.LlmError) as cm:
                libllm.decode_batch([a, b])
            self.assertEqual(cm.exception.status, libllm.Status.INVALID_ARGUMENT)
        with self.assertRaises(TypeError):
            libllm.decode_batch([a, None])
        closed = self.prompted("Lily had a")
        closed.close()
        with self.assertRaises(libllm.LlmError):
            libllm.decode_batch([a, closed])
        # Nothing advanced: a's next greedy token is still the first one.
        self.assertEqual(a.decode_step(), fresh.decode_step())

    def test_failure_keeps_the_tokens_of_advanced_sessions(self):
        # Room for the prompt and one pending token: the third step is out of context.
        tight = len(self.model.tokenize(BATCH_PROMPTS[1])) + 1
        a = self.prompted(BATCH_PROMPTS[0])
        b = self.prompted(BATCH_PROMPTS[1], max_tokens=tight)
        c = self.prompted(BATCH_PROMPTS[2])
        twin_a = self.prompted(BATCH_PROMPTS[0])
        twin_c = self.prompted(BATCH_PROMPTS[2])
        for _ in range(2):
            got = libllm.decode_batch([a, b, c])
            self.assertEqual((got[0], got[2]), (twin_a.decode_step(), twin_c.decode_step()))
        with self.assertRaises(libllm.LlmError) as cm:
            libllm.decode_batch([a, b, c])
        self.assertEqual(cm.exception.status, libllm.Status.CONTEXT_FULL)
        self.assertEqual(cm.exception.tokens, [twin_a.decode_step(), -1, -1])
        self.assertEqual(c.decode_step(), twin_c.decode_step())  # c is unchanged


    def test_prefill_joins_running_sessions(self):
        hot = libllm.Sampling(temperature=0.9, seed=5)
        each = [None, hot, None, libllm.Sampling(temperature=0.9, seed=11)]
        running = [self.prompted(p) for p in BATCH_PROMPTS]
        twins = [self.prompted(p) for p in BATCH_PROMPTS]
        for s, t, sp in zip(running, twins, each):
            self.assertEqual(s.decode_step(sp), t.decode_step(sp))
        new_prompt = self.model.tokenize("The little dog")
        new = self.model.session()
        self.addCleanup(new.close)
        new_twin = self.prompted("The little dog")
        got = libllm.decode_batch_prefill(running + [new], [[], None, [], new_prompt], sampling=each)
        self.assertEqual(got, [s.decode_step(sp) for s, sp in zip(twins + [new_twin], each)])
        self.assertEqual(new.stats()["n_prompt"], len(new_prompt))
        for step in range(8):  # and they keep agreeing afterwards
            got = libllm.decode_batch_prefill(running + [new], [None] * 4, sampling=each)
            self.assertEqual(got, [s.decode_step(sp) for s, sp in zip(twins + [new_twin], each)], "step %d" % step)
        self.assertEqual(libllm.decode_batch_prefill([], []), [])
        with self.assertRaises(ValueError):
            libllm.decode_batch_prefill(running, [[], []])
        with self.assertRaises(ValueError):
            libllm.decode_batch_prefill(running, [[], [], []], sample=[True])

    def test_prefill_in_chunks(self):
        hot = libllm.Sampling(temperature=0.9, seed=5)
        a = self.prompted(BATCH_PROMPTS[0])
        twin_a = self.prompted(BATCH_PROMPTS[0])
        prompt = self.model.tokenize("Tom and Sam went to the park")
        new = self.model.session()
        self.addCleanup(new.close)
        twin = self.prompted("Tom and Sam went to the park")
        got = libllm.decode_batch_prefill([a, new], [[], prompt[:3]], sample=[True, False], sampling=[None, hot])
        self.assertEqual(got, [twin_a.decode_step(), -1])
        self.assertEqual(new.stats()["n_tokens"], 3)
        got = libllm.decode_batch_prefill([a, new], [[], prompt[3:]], sample=[1, 1], sampling=[None, hot])
        self.assertEqual(got, [twin_a.decode_step(), twin.decode_step(hot)])
        # The stream continues after the sampled token.
        self.assertEqual([p.token for p in new.stream(4, hot)], [twin.decode_step(hot) for _ in range(4)])

    def test_prefill_with_a_grammar(self):
        with libllm.Grammar(self.model, 'root ::= ("yes" | "no") "."') as g:
            each = [None, libllm.Sampling(grammar=g, temperature=0.9, seed=5)]
            a = self.prompted(BATCH_PROMPTS[0])
            twins = [self.prompted(BATCH_PROMPTS[0]), self.prompted(BATCH_PROMPTS[1])]
            new = self.model.session()
            self.addCleanup(new.close)
            prompts = [None, self.model.tokenize(BATCH_PROMPTS[1])]
            for step in range(4):
                got = libllm.decode_batch_prefill([a, new], prompts, sampling=each)
                self.assertEqual(got, [s.decode_step(sp) for s, sp in zip(twins, each)], "step %d" % step)
                prompts = [None, None]

    def test_prefill_rejects_a_bad_token_before_anything_moves(self):
        a = self.prompted(BATCH_PROMPTS[0])
        twin_a = self.prompted(BATCH_PROMPTS[0])
        new = self.model.session()
        self.addCleanup(new.close)
        with self.assertRaises(libllm.LlmError) as cm:
            libllm.decode_batch_prefill([a, new], [[], [1, 100000]])
        self.assertEqual(cm.exception.status, libllm.Status.INVALID_ARGUMENT)
        self.assertEqual(cm.exception.tokens, [-1, -1])
        self.assertEqual(new.stats()["n_tokens"], 0)
        self.assertEqual(a.decode_step(), twin_a.decode_step())

    def test_prefill_failure_keeps_the_tokens_of_advanced_sessions(self):
        # b has room for its prompt and one more token: a 4-token chunk does not fit.
        tight = len(self.model.tokenize(BATCH_PROMPTS[1])) + 1
        a = self.prompted(BATCH_PROMPTS[0])
        b = self.prompted(BATCH_PROMPTS[1], max_tokens=tight)
        c = self.prompted(BATCH_PROMPTS[2])
        twin_a = self.prompted(BATCH_PROMPTS[0])
        twin_c = self.prompted(BATCH_PROMPTS[2])
        with self.assertRaises(libllm.LlmError) as cm:
            libllm.decode_batch_prefill([a, b, c], [[], [10, 11, 12, 13], []])
        self.assertEqual(cm.exception.status, libllm.Status.CONTEXT_FULL)
        self.assertEqual(cm.exception.tokens, [twin_a.decode_step(), -1, -1])
        self.assertEqual(c.decode_step(), twin_c.decode_step())  # c is unchanged


class Lifetime(unittest.TestCase):
    def test_session_keeps_model_alive(self):
        m = load_stories()
        s = m.session()
        m.close()
        with self.assertRaises(libllm.LlmError):
            m.tokenize("x")
        with self.assertRaises(libllm.LlmError):
            m.session()
        text = "".join(p.text for p in s.generate(REF["prompt"], 8))
        self.assertTrue(text and REF["generated_text"].startswith(text))
        s.close()
        self.assertIsNone(m._ptr)  # freed with the last session
        with self.assertRaises(libllm.LlmError):
            s.decode_step()
        s.close()

    def test_vocab_only(self):
        seen = []
        with libllm.Model(STORIES, vocab_only=True, progress=lambda p: seen.append(p) or True) as m:
            self.assertEqual(m.tokenize(REF["prompt"]), REF["prompt_token_ids"])
            with self.assertRaises(libllm.LlmError) as cm:
                m.session()
            self.assertEqual(cm.exception.status, libllm.Status.UNSUPPORTED)
        self.assertTrue(all(0.0 <= p <= 1.0 for p in seen))

    def test_progress_can_cancel(self):
        calls = []
        try:
            libllm.Model(STORIES, device=libllm.Device.CPU, progress=lambda p: calls.append(p) and False)
            cancelled = False
        except libllm.LlmError as e:
            self.assertEqual(e.status, libllm.Status.CANCELLED)
            cancelled = True
        # A library that reports progress must honour the cancel request.
        self.assertEqual(cancelled, bool(calls))


# A ChatML-like template in the subset llm_chat_render runs.
CHATML = ("{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
YES_NO = 'root ::= ("yes" | "no") "."'


def generate_ids(model, prompt, sampling, max_tokens):
    """Greedy/sampled ids after prompt, up to and including an end-of-generation token."""
    with model.session() as s:
        s.prefill(model.tokenize(prompt))
        ids = []
        for _ in range(max_tokens):
            ids.append(s.decode_step(sampling))
            if model.is_eog(ids[-1]):
                break
        return ids


class Chat(unittest.TestCase):
    MESSAGES = [{"role": "system", "content": "Be brief."}, ("user", "Hi!")]

    def test_render_without_model(self):
        text = libllm.chat_render(self.MESSAGES, CHATML)
        self.assertEqual(text, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
                               "<|im_start|>assistant\n")
        text = libllm.chat_render(self.MESSAGES, CHATML, add_generation_prompt=False)
        self.assertFalse(text.endswith("assistant\n"))
        with self.assertRaises(libllm.LlmError) as e:
            libllm.chat_render(self.MESSAGES, "{% for m in messages %}{{ m['role'] }")
        self.assertEqual(e.exception.status, libllm.Status.INVALID_ARGUMENT)

    def test_render_with_model(self):
        with load_stories() as m:
            text = m.chat_render(self.MESSAGES, template="{{ bos_token }}" + CHATML + "{{ eos_token }}")
            self.assertTrue(text.startswith("<s><s><|im_start|>system\n"), text)
            self.assertTrue(text.endswith("<|im_start|>assistant\n</s>"), text)
            # A long conversation exercises the buffer-too-small retry.
            many = [("user", "x" * 1000)] * 20
            self.assertEqual(len(m.chat_render(many, template=CHATML)), 3 + 20 * (17 + 1000 + 11) + 22)

    def test_model_without_template(self):
        with load_stories() as m:
            for call in (m.chat_template, lambda: m.chat_render(self.MESSAGES)):
                with self.assertRaises(libllm.LlmError) as e:
                    call()
                self.assertEqual(e.exception.status, libllm.Status.UNSUPPORTED)


class Grammars(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = load_stories()

    @classmethod
    def tearDownClass(cls):
        cls.model.close()

    def test_yes_no(self):
        with libllm.Grammar(self.model, YES_NO) as g:
            ids = generate_ids(self.model, "Once upon a time", libllm.Sampling(grammar=g), 32)
            self.assertTrue(self.model.is_eog(ids[-1]), ids)
            self.assertIn(self.model.detokenize(ids[:-1]).strip(), ("yes.", "no."))
            # The same grammar from many sessions, and with temperature.
            ids = generate_ids(self.model, "Lily", libllm.Sampling(grammar=g, temperature=1.0, seed=7), 32)
            self.assertIn(self.model.detokenize(ids[:-1]).strip(), ("yes.", "no."))

    def test_json_schema(self):
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                                   "name": {"type": "string", "maxLength": 6}},
                  "required": ["ok", "name"], "additionalProperties": False}
        gbnf = libllm.json_schema_to_gbnf(schema)
        self.assertIn("root", gbnf)
        with libllm.Grammar.from_json_schema(self.model, json.dumps(schema)) as g:
            ids = generate_ids(self.model, "Once upon a time", libllm.Sampling(grammar=g), 200)
            self.assertTrue(self.model.is_eog(ids[-1]), ids)
            value = json.loads(self.model.detokenize(ids[:-1]))
            self.assertEqual(sorted(value), ["name", "ok"])
            self.assertIsInstance(value["ok"], bool)
            self.assertLessEqual(len(value["name"]), 6)

    def test_errors(self):
        with self.assertRaises(libllm.LlmError) as e:
            libllm.Grammar(self.model, 'root ::= "a"\nitem ::= ( "b"')
        self.assertEqual(e.exception.status, libllm.Status.INVALID_ARGUMENT)
        self.assertIn("line 2", e.exception.message)
        with self.assertRaises(libllm.LlmError) as e:
            libllm.Grammar.from_json_schema(self.model, '{"type": ')
        self.assertEqual(e.exception.status, libllm.Status.INVALID_ARGUMENT)
        g = libllm.Grammar(self.model, 'start ::= "x"', root="start")
        g.close()
        g.close()
        with self.assertRaises(libllm.LlmError):
            libllm.Sampling(grammar=g)._raw()


class TextStreams(unittest.TestCase):
    def test_stop_across_tokens(self):
        with load_stories() as m:
            ids = REF["generated_token_ids"]
            text = REF["generated_text"]
            # A stop string that begins inside the 10th piece and ends inside the 11th.
            cut = len(m.detokenize(REF["prompt_token_ids"] + ids[:10])) - len(REF["prompt"])
            stop = text[cut - 2:cut + 2]
            self.assertEqual(len(stop), 4)
            want = text[:text.find(stop)]
            with m.text_stream([stop, "never seen"]) as ts:
                got, n = "", 0
                for tok in ids:
                    piece, stopped = ts.push(tok)
                    got += piece
                    n += 1
                    if stopped:
                        break
                self.assertTrue(ts.stopped)
                self.assertEqual(got, want)
                self.assertLessEqual(n, 11 + len(stop))
                self.assertEqual(ts.push(ids[0]), ("", True))
                ts.reset()
                got = "".join(ts.push(tok)[0] for tok in ids[:5]) + ts.flush()
                self.assertEqual(got, m.detokenize(REF["prompt_token_ids"] + ids[:5])[len(REF["prompt"]):])
            with m.text_stream() as ts:
                self.assertEqual(ts.push(m.info()["eos"]), ("", True))
            with self.assertRaises(libllm.LlmError) as e:
                m.text_stream([""])
            self.assertEqual(e.exception.status, libllm.Status.INVALID_ARGUMENT)


if __name__ == "__main__":
    unittest.main()
