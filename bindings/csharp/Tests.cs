// Tests of the C# binding against the real library and case 0 of
// reference/stories260K_greedy.json (llama2.c run.c, greedy; copied as test data).
// A tiny runner of its own: every public static void Test* method runs; exit 1 on failure.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Reflection;
using System.Runtime.InteropServices;
using System.Text;
using System.Threading;
using LibLlm;

public static class Tests
{
    const string Prompt = "Once upon a time";
    static readonly int[] PromptIds = { 1, 403, 407, 261, 378 };
    static readonly int[] GeneratedIds = {
        432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322,
        265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267,
        337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438, 310, 439, 419, 357, 336,
    };
    const string GeneratedText = ", there was a little girl named Lily. She loved to play outside in the park. One day, " +
        "she saw a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said";

    static string ModelsDir
    {
        get
        {
            var d = Environment.GetEnvironmentVariable("LLM_MODELS_DIR");
            return string.IsNullOrEmpty(d) ? Path.Combine("..", "..", "..", "shared", "models") : d;
        }
    }

    static Model LoadStories()
    {
        // One compute thread: tests run next to other jobs on small CI machines.
        return Model.Load(Path.Combine(ModelsDir, "stories260K.gguf"), new LoadOptions { Device = Device.Cpu, Threads = 1 });
    }

    static void Check(bool cond, string what)
    {
        if (!cond) throw new Exception("check failed: " + what);
    }

    static void Equal<T>(T want, T got, string what)
    {
        if (!EqualityComparer<T>.Default.Equals(want, got))
            throw new Exception(string.Format("{0}: want <{1}>, got <{2}>", what, want, got));
    }

    static void SameIds(int[] want, int[] got, string what)
    {
        if (!want.SequenceEqual(got))
            throw new Exception(string.Format("{0}: want [{1}], got [{2}]", what, string.Join(",", want), string.Join(",", got)));
    }

    static Status Throws(Action a)
    {
        try { a(); }
        catch (LlmException e) { Check(e.Detail != null, "detail set"); return e.Status; }
        throw new Exception("expected LlmException");
    }

    static int[] Greedy(Session s, int n)
    {
        var ids = new int[n];
        for (int i = 0; i < n; i++) ids[i] = s.DecodeStep();
        return ids;
    }

    public static void TestVersion()
    {
        Equal(Llm.HeaderVersion, Llm.Version, "llm_version");
        Equal("0.4.0", Llm.VersionString, "llm_version_string");
    }

    public static void TestStructLayouts()
    {
        // x86-64 / LP64 values pinned by tests/abi/layout_test.cpp.
        var asm = typeof(Model).Assembly;
        var sizes = new Dictionary<string, int> {
            { "LoadParams", 64 }, { "ModelProperties", 112 }, { "DetokState", 16 },
            { "SessionParams", 40 }, { "Sampling", 48 }, { "SessionStats", 80 },
            { "ChatMessage", 16 }, { "ChatParams", 24 },
        };
        foreach (var kv in sizes)
        {
            var t = asm.GetType("LibLlm.Native+" + kv.Key, true);
            Equal(kv.Value, Marshal.SizeOf(t), "sizeof " + kv.Key);
        }
        Equal(64, (int)Marshal.OffsetOf(asm.GetType("LibLlm.Native+ModelProperties"), "architecture"), "offsetof architecture");
        Equal(24, (int)Marshal.OffsetOf(asm.GetType("LibLlm.Native+SessionParams"), "cancel"), "offsetof cancel");
        Equal(72, (int)Marshal.OffsetOf(asm.GetType("LibLlm.Native+SessionStats"), "n_evicted"), "offsetof n_evicted");
        Equal(40, (int)Marshal.OffsetOf(asm.GetType("LibLlm.Native+Sampling"), "grammar"), "offsetof grammar");
        Equal(16, (int)Marshal.OffsetOf(asm.GetType("LibLlm.Native+ChatParams"), "add_generation_prompt"),
              "offsetof add_generation_prompt");
    }

    public static void TestReferenceGreedy()
    {
        using (var model = LoadStories())
        using (var s = model.CreateSession())
        {
            var info = model.Info();
            Equal(512u, info.VocabSize, "vocab");
            Equal(5u, info.Layers, "layers");
            Equal("llama", info.Architecture, "architecture");
            Equal(1, info.Bos, "bos");

            var prompt = model.Tokenize(Prompt);
            SameIds(PromptIds, prompt, "prompt ids");
            Equal(Prompt, model.Detokenize(prompt), "detokenize");

            s.Prefill(prompt);
            var logits = s.Logits();
            Equal(512, logits.Length, "n_vocab");
            int best = 0;
            for (int i = 1; i < logits.Length; i++) if (logits[i] > logits[best]) best = i;
            Equal(GeneratedIds[0], best, "argmax of prefill logits");
            SameIds(GeneratedIds, Greedy(s, 64), "greedy ids");
            var st = s.Stats();
            Equal(5u, st.Prompt, "n_prompt");
            Equal(64u, st.Generated, "n_generated");
            Equal(69u, st.Tokens, "n_tokens");

            s.Reset();
            var pieces = s.GeneratePieces(Prompt, 64).ToList();
            SameIds(GeneratedIds, pieces.Select(p => p.Token).ToArray(), "streamed ids");
            Equal(GeneratedText, string.Concat(pieces.Select(p => p.Text)), "streamed text");

            s.Reset();
            var sb = new StringBuilder();
            foreach (var text in s.Generate(Prompt, 64, new Sampling { Temperature = 0, TopP = 1, RepeatPenalty = 1 }))
                sb.Append(text);
            Equal(GeneratedText, sb.ToString(), "Generate text");
        }
    }

    public static void TestThreadsShareTheModel()
    {
        using (var model = LoadStories())
        {
            var results = new int[4][];
            var errors = new List<Exception>();
            var threads = Enumerable.Range(0, 4).Select(i => new Thread(() =>
            {
                try
                {
                    using (var s = model.CreateSession())
                    {
                        s.Prefill(PromptIds);
                        results[i] = Greedy(s, 24);
                    }
                }
                catch (Exception e) { lock (errors) errors.Add(e); }
            })).ToList();
            threads.ForEach(t => t.Start());
            threads.ForEach(t => t.Join());
            if (errors.Count > 0) throw errors[0];
            foreach (var r in results) SameIds(GeneratedIds.Take(24).ToArray(), r, "thread ids");
        }
    }

    public static void TestSessionKeepsModelAlive()
    {
        var model = LoadStories();
        var s = model.CreateSession();
        model.Dispose();
        bool disposed = false;
        try { model.Tokenize("x"); } catch (ObjectDisposedException) { disposed = true; }
        Check(disposed, "Tokenize after Dispose throws ObjectDisposedException");
        disposed = false;
        try { model.CreateSession(); } catch (ObjectDisposedException) { disposed = true; }
        Check(disposed, "CreateSession after Dispose throws ObjectDisposedException");
        var text = string.Concat(s.Generate(Prompt, 8));
        Check(text.Length > 0 && GeneratedText.StartsWith(text, StringComparison.Ordinal), "text after model Dispose: " + text);
        s.Dispose();
        disposed = false;
        try { s.DecodeStep(); } catch (ObjectDisposedException) { disposed = true; }
        Check(disposed, "DecodeStep after Dispose throws ObjectDisposedException");
        s.Dispose(); // idempotent
    }

    public static void TestErrors()
    {
        Equal(Status.Io, Throws(() => Model.Load(Path.Combine(ModelsDir, "does-not-exist.gguf"))), "missing file");
        try { Model.Load(Path.Combine(ModelsDir, "does-not-exist.gguf")); }
        catch (LlmException e) { Check(e.Detail.Length > 0 && e.Message.Contains(e.Detail), "message carries detail"); }
        Equal(Status.Format, Throws(() => Model.Load(Path.Combine(ModelsDir, "README.md"))), "not a model");
        using (var model = LoadStories())
        using (var s = model.CreateSession())
        {
            Equal(Status.InvalidArgument, Throws(() => s.DecodeStep()), "decode on an empty session");
            Equal(Status.InvalidArgument, Throws(() => s.Prefill(new[] { 100000 })), "bad token id");
            s.Prefill(PromptIds);
            Equal(GeneratedIds[0], s.DecodeStep(), "usable after errors");
            Equal(Status.InvalidArgument, Throws(() => s.KvEvict(0, 1000)), "evict outside the sequence");
        }
    }

    public static void TestVocabOnly()
    {
        var seen = new List<float>();
        using (var model = Model.Load(Path.Combine(ModelsDir, "stories260K.gguf"),
                                      new LoadOptions { VocabOnly = true, Progress = p => { seen.Add(p); return true; } }))
        {
            SameIds(PromptIds, model.Tokenize(Prompt), "vocab-only tokenize");
            Equal(Status.Unsupported, Throws(() => model.CreateSession()), "session on a vocab-only model");
        }
        Check(seen.All(p => p >= 0 && p <= 1), "progress in [0,1]");
    }

    public static void TestProgressCanCancel()
    {
        int calls = 0;
        bool cancelled = false;
        try
        {
            Model.Load(Path.Combine(ModelsDir, "stories260K.gguf"),
                       new LoadOptions { Device = Device.Cpu, Progress = p => { calls++; return false; } }).Dispose();
        }
        catch (LlmException e) { Equal(Status.Cancelled, e.Status, "cancel status"); cancelled = true; }
        // A library that reports progress must honour the cancel request.
        Equal(calls > 0, cancelled, "cancelled iff progress was reported");
    }

    public static void TestDetokenizerHoldsBackIncompleteUtf8()
    {
        using (var model = LoadStories())
        {
            // "ö" is not in the vocabulary: byte fallback gives <0xC3> <0xB6> = ids 198, 185.
            var ids = model.Tokenize("ö", addBos: false);
            SameIds(new[] { 198, 185 }, ids.Skip(ids.Length - 2).ToArray(), "byte fallback");
            var d = model.CreateDetokenizer(378);
            Equal("", d.Push(198), "first byte held back");
            Equal("ö", d.Push(185), "completed");
            Equal("", d.Push(198), "held back again");
            Equal("\uFFFD", d.Flush(), "flush");
        }
    }

    public static void TestForkAndSaveRestore()
    {
        using (var model = LoadStories())
        {
            byte[] saved;
            Session fork;
            using (var s = model.CreateSession())
            {
                s.Prefill(PromptIds);
                SameIds(GeneratedIds.Take(10).ToArray(), Greedy(s, 10), "first 10");
                fork = s.Fork();
                saved = s.Save();
                Check(saved.Length > 0, "saved bytes");
                SameIds(GeneratedIds.Skip(10).Take(10).ToArray(), Greedy(s, 10), "original after fork");
            }
            int[] forkIds = null;
            var t = new Thread(() => { forkIds = Greedy(fork, 10); });
            t.Start();
            t.Join();
            fork.Dispose();
            SameIds(GeneratedIds.Skip(10).Take(10).ToArray(), forkIds, "fork outlives its parent");
            using (var r = model.RestoreSession(saved))
            {
                Equal(15u, r.Stats().Tokens, "restored n_tokens");
                SameIds(GeneratedIds.Skip(10).Take(10).ToArray(), Greedy(r, 10), "restored");
            }
            var bad = (byte[])saved.Clone();
            bad[bad.Length / 2] ^= 0x55;
            foreach (var damaged in new[] { bad, saved.Take(saved.Length / 3).ToArray() })
            {
                var st = Throws(() => model.RestoreSession(damaged));
                Check(st == Status.Format || st == Status.Checksum, "damaged bytes rejected: " + st);
            }
        }
    }

    static readonly string[] BatchPrompts = { "Once upon a time", "Lily had a", "Tom and Sam went" };

    static Session Prompted(Model model, string prompt, SessionOptions options = null)
    {
        var s = model.CreateSession(options);
        s.Prefill(model.Tokenize(prompt));
        return s;
    }

    static void DisposeAll(IEnumerable<Session> sessions)
    {
        foreach (var s in sessions) s.Dispose();
    }

    public static void TestDecodeBatchEqualsSteppingAlone()
    {
        using (var model = LoadStories())
        {
            var sampling = Sampling.Default;
            sampling.Temperature = 0.9f;
            sampling.Seed = 5;
            var batch = BatchPrompts.Select(p => Prompted(model, p)).ToList();
            var alone = BatchPrompts.Select(p => Prompted(model, p)).ToList();
            try
            {
                var streams = BatchPrompts.Select(_ => new List<int>()).ToList();
                for (int step = 0; step < 20; step++)
                {
                    int[] got = Session.DecodeBatch(batch, sampling);
                    Equal(3, got.Length, "tokens per batch");
                    for (int i = 0; i < 3; i++)
                    {
                        Equal(alone[i].DecodeStep(sampling), got[i], "session " + i + " step " + step);
                        streams[i].Add(got[i]);
                    }
                }
                Check(!streams[0].SequenceEqual(streams[1]) && !streams[1].SequenceEqual(streams[2]),
                      "different prompts give different continuations");
                Equal(0, Session.DecodeBatch(new Session[0], sampling).Length, "empty batch");
            }
            finally
            {
                DisposeAll(batch.Concat(alone));
            }
        }
    }

    public static void TestDecodeBatchRejectsDuplicatesAndForeignModels()
    {
        using (var model = LoadStories())
        using (var other = LoadStories()) // the same file loaded twice is another native model
        using (var a = Prompted(model, "Lily had a"))
        using (var b = Prompted(other, "Lily had a"))
        using (var fresh = Prompted(model, "Lily had a"))
        {
            var tokens = new[] { 7, 7 };
            Equal(Status.InvalidArgument, Throws(() => Session.DecodeBatchInto(new[] { a, a }, tokens)), "same session twice");
            SameIds(new[] { -1, -1 }, tokens, "tokens after a rejected batch");
            Equal(Status.InvalidArgument, Throws(() => Session.DecodeBatch(new[] { a, b })), "sessions of two models");
            bool thrown = false;
            try { Session.DecodeBatchInto(new[] { a, fresh }, new int[1]); } catch (ArgumentException) { thrown = true; }
            Check(thrown, "tokens shorter than sessions throws ArgumentException");
            var closed = Prompted(model, "Lily had a");
            closed.Dispose();
            thrown = false;
            try { Session.DecodeBatch(new[] { a, closed }); } catch (ObjectDisposedException) { thrown = true; }
            Check(thrown, "a disposed session throws ObjectDisposedException");
            Equal(fresh.DecodeStep(), a.DecodeStep(), "nothing advanced");
        }
    }

    static Sampling Hot(ulong seed)
    {
        var sp = Sampling.Default;
        sp.Temperature = 0.9f;
        sp.Seed = seed;
        return sp;
    }

    // DecodeStep on each session with its own settings.
    static int[] StepAlone(IList<Session> sessions, IList<Sampling?> samplings)
    {
        return sessions.Select((s, i) => s.DecodeStep(samplings[i])).ToArray();
    }

    public static void TestDecodeBatchEachUsesEachSessionsSampling()
    {
        using (var model = LoadStories())
        {
            var each = new Sampling?[] { null, Hot(5) };
            var batch = BatchPrompts.Take(2).Select(p => Prompted(model, p)).ToList();
            var alone = BatchPrompts.Take(2).Select(p => Prompted(model, p)).ToList();
            try
            {
                for (int step = 0; step < 12; step++)
                {
                    int[] got = Session.DecodeBatchEach(batch, each);
                    SameIds(StepAlone(alone, each), got, "step " + step);
                }
                bool thrown = false;
                try { Session.DecodeBatchEach(batch, each.Take(1).ToArray()); } catch (ArgumentException) { thrown = true; }
                Check(thrown, "one sampling for two sessions throws ArgumentException");
            }
            finally
            {
                DisposeAll(batch.Concat(alone));
            }
        }
    }

    public static void TestDecodeBatchPrefillJoinsRunningSessions()
    {
        using (var model = LoadStories())
        {
            var each = new Sampling?[] { null, Hot(5), null, Hot(11) };
            var running = BatchPrompts.Select(p => Prompted(model, p)).ToList();
            var twins = BatchPrompts.Select(p => Prompted(model, p)).ToList();
            try
            {
                SameIds(StepAlone(twins, each), StepAlone(running, each), "first steps");
                int[] newPrompt = model.Tokenize("The little dog");
                running.Add(model.CreateSession());
                twins.Add(Prompted(model, "The little dog"));
                var prompts = new int[][] { null, new int[0], null, newPrompt };
                for (int step = 0; step < 8; step++)
                {
                    int[] got = Session.DecodeBatchPrefill(running, prompts, null, each);
                    SameIds(StepAlone(twins, each), got, "step " + step);
                    prompts = new int[4][]; // later calls only step
                }
                Equal((uint)newPrompt.Length, running[3].Stats().Prompt, "prompt tokens of the new session");
                bool thrown = false;
                try { Session.DecodeBatchPrefill(running, new int[2][]); } catch (ArgumentException) { thrown = true; }
                Check(thrown, "two prompts for four sessions throws ArgumentException");
                Equal(0, Session.DecodeBatchPrefill(new Session[0], new int[0][]).Length, "empty batch");
            }
            finally
            {
                DisposeAll(running.Concat(twins));
            }
        }
    }

    public static void TestDecodeBatchPrefillInChunks()
    {
        using (var model = LoadStories())
        using (var a = Prompted(model, BatchPrompts[0]))
        using (var twinA = Prompted(model, BatchPrompts[0]))
        using (var fresh = model.CreateSession())
        using (var twin = Prompted(model, "Tom and Sam went to the park"))
        {
            int[] prompt = model.Tokenize("Tom and Sam went to the park");
            var each = new Sampling?[] { null, Hot(5) };
            int[] got = Session.DecodeBatchPrefill(new[] { a, fresh }, new[] { null, prompt.Take(3).ToArray() },
                                                   new[] { true, false }, each);
            SameIds(new[] { twinA.DecodeStep(), -1 }, got, "first chunk");
            Equal(3u, fresh.Stats().Tokens, "tokens after the first chunk");
            got = Session.DecodeBatchPrefill(new[] { a, fresh }, new[] { null, prompt.Skip(3).ToArray() },
                                             new[] { true, true }, each);
            SameIds(StepAlone(new[] { twinA, twin }, each), got, "second chunk");
        }
    }

    public static void TestDecodeBatchPrefillWithAGrammar()
    {
        using (var model = LoadStories())
        using (var g = new Grammar(model, "root ::= (\"yes\" | \"no\") \".\""))
        using (var a = Prompted(model, BatchPrompts[0]))
        using (var fresh = model.CreateSession())
        using (var twinA = Prompted(model, BatchPrompts[0]))
        using (var twin = Prompted(model, BatchPrompts[1]))
        {
            var hot = Hot(5);
            hot.Grammar = g;
            var each = new Sampling?[] { null, hot };
            var prompts = new[] { null, model.Tokenize(BatchPrompts[1]) };
            for (int step = 0; step < 4; step++)
            {
                int[] got = Session.DecodeBatchPrefill(new[] { a, fresh }, prompts, null, each);
                SameIds(StepAlone(new[] { twinA, twin }, each), got, "step " + step);
                prompts = new int[2][];
            }
        }
    }

    public static void TestDecodeBatchPrefillRejectsBadTokenBeforeAnythingMoves()
    {
        using (var model = LoadStories())
        using (var a = Prompted(model, BatchPrompts[0]))
        using (var twinA = Prompted(model, BatchPrompts[0]))
        using (var fresh = model.CreateSession())
        {
            var tokens = new[] { 7, 7 };
            Equal(Status.InvalidArgument,
                  Throws(() => Session.DecodeBatchPrefillInto(new[] { a, fresh }, tokens, new[] { null, new[] { 1, 100000 } })),
                  "out-of-range token id");
            SameIds(new[] { -1, -1 }, tokens, "tokens after a rejected batch");
            Equal(0u, fresh.Stats().Tokens, "nothing appended");
            Equal(twinA.DecodeStep(), a.DecodeStep(), "a did not advance");
        }
    }

    public static void TestDecodeBatchPrefillFailureKeepsAdvancedTokens()
    {
        using (var model = LoadStories())
        {
            // b has room for its prompt and one more token: a 4-token chunk does not fit.
            var tight = new SessionOptions { MaxTokens = (uint)model.Tokenize(BatchPrompts[1]).Length + 1 };
            using (var a = Prompted(model, BatchPrompts[0]))
            using (var b = Prompted(model, BatchPrompts[1], tight))
            using (var c = Prompted(model, BatchPrompts[2]))
            using (var twinA = Prompted(model, BatchPrompts[0]))
            using (var twinC = Prompted(model, BatchPrompts[2]))
            {
                var tokens = new int[3];
                Equal(Status.ContextFull,
                      Throws(() => Session.DecodeBatchPrefillInto(new[] { a, b, c }, tokens,
                                                                  new[] { null, new[] { 10, 11, 12, 13 }, null })),
                      "a chunk that does not fit");
                SameIds(new[] { twinA.DecodeStep(), -1, -1 }, tokens, "tokens of the sessions that advanced");
                Equal(twinC.DecodeStep(), c.DecodeStep(), "c is unchanged");
            }
        }
    }

    // A ChatML-like template in the subset llm_chat_render runs.
    const string ChatMl = "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n" +
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
    static readonly ChatMessage[] Messages = { new ChatMessage("system", "Be brief."), new ChatMessage("user", "Hi!") };

    public static void TestChatRenderWithoutModel()
    {
        Equal("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
              Llm.ChatRender(Messages, ChatMl), "rendered");
        Check(!Llm.ChatRender(Messages, ChatMl, false).EndsWith("assistant\n"), "no generation prompt");
        Equal(Status.InvalidArgument, Throws(() => Llm.ChatRender(Messages, "{% for m in messages %}{{ m['role'] }")),
              "malformed template");
    }

    public static void TestChatRenderWithModel()
    {
        using (var model = LoadStories())
        {
            string text = model.ChatRender(Messages, true, "{{ bos_token }}" + ChatMl + "{{ eos_token }}");
            Check(text.StartsWith("<s><s><|im_start|>system\n"), "bos text: " + text);
            Check(text.EndsWith("<|im_start|>assistant\n</s>"), "eos text: " + text);
            // A long conversation takes the buffer-too-small path.
            var many = Enumerable.Repeat(new ChatMessage("user", new string('x', 1000)), 20).ToArray();
            Equal(3 + 20 * (17 + 1000 + 11) + 22, model.ChatRender(many, true, ChatMl).Length, "long conversation");
            // stories260K has no template and no built-in fits it.
            Equal(Status.Unsupported, Throws(() => model.ChatTemplate()), "ChatTemplate");
            Equal(Status.Unsupported, Throws(() => model.ChatRender(Messages)), "the model's template");
        }
    }

    // Tokens after prompt, up to and including an end-of-generation token.
    static List<int> Generate(Model model, string prompt, Sampling sampling, int maxTokens)
    {
        using (var s = model.CreateSession())
        {
            s.Prefill(model.Tokenize(prompt));
            var ids = new List<int>();
            while (ids.Count < maxTokens)
            {
                ids.Add(s.DecodeStep(sampling));
                if (model.IsEog(ids[ids.Count - 1])) break;
            }
            return ids;
        }
    }

    static string TextBeforeEog(Model model, List<int> ids)
    {
        Check(ids.Count > 0 && model.IsEog(ids[ids.Count - 1]), "ends with an end-of-generation token: " + string.Join(",", ids));
        return model.Detokenize(ids.Take(ids.Count - 1).ToArray());
    }

    public static void TestGrammarYesNo()
    {
        using (var model = LoadStories())
        {
            var g = new Grammar(model, "root ::= (\"yes\" | \"no\") \".\"");
            var texts = new string[3];
            var threads = Enumerable.Range(0, 3).Select(i => new Thread(() =>
            {
                var sp = Sampling.Greedy;
                sp.Grammar = g;
                if (i > 0) { sp.Temperature = 1; sp.Seed = (ulong)i; } // the same grammar from threads, sampled
                texts[i] = TextBeforeEog(model, Generate(model, Prompt, sp, 32)).Trim();
            })).ToList();
            threads.ForEach(t => t.Start());
            threads.ForEach(t => t.Join());
            foreach (var t in texts) Check(t == "yes." || t == "no.", "grammar output " + t);
            g.Dispose();
            g.Dispose();
            using (var s = model.CreateSession())
            {
                s.Prefill(new[] { 1 });
                var sp = Sampling.Greedy;
                sp.Grammar = g;
                try { s.DecodeStep(sp); throw new Exception("expected ObjectDisposedException"); }
                catch (ObjectDisposedException) { }
            }
        }
    }

    public static void TestGrammarJsonSchema()
    {
        const string schema = "{\"type\": \"object\", \"properties\": {\"ok\": {\"type\": \"boolean\"}, " +
            "\"name\": {\"type\": \"string\", \"maxLength\": 6}}, \"required\": [\"ok\", \"name\"], " +
            "\"additionalProperties\": false}";
        Check(Grammar.JsonSchemaToGbnf(schema).Contains("root"), "GBNF of the schema");
        using (var model = LoadStories())
        using (var g = Grammar.FromJsonSchema(model, schema))
        {
            var sp = Sampling.Greedy;
            sp.Grammar = g;
            string text = TextBeforeEog(model, Generate(model, Prompt, sp, 200));
            var obj = Json.Parse(text) as Dictionary<string, object>;
            Check(obj != null && obj.Count == 2, "a JSON object with two members: " + text);
            Check(obj["ok"] is bool, "ok is a boolean: " + text);
            Check(obj["name"] is string && ((string)obj["name"]).Length <= 6, "name is a short string: " + text);
        }
    }

    public static void TestGrammarErrors()
    {
        using (var model = LoadStories())
        {
            try { new Grammar(model, "root ::= \"a\"\nitem ::= ( \"b\""); throw new Exception("expected LlmException"); }
            catch (LlmException e)
            {
                Equal(Status.InvalidArgument, e.Status, "bad GBNF");
                Check(e.Detail.Contains("line 2"), "the detail names the line: " + e.Detail);
            }
            Equal(Status.InvalidArgument, Throws(() => Grammar.FromJsonSchema(model, "{\"type\": ")), "bad schema");
            new Grammar(model, "start ::= \"x\"", "start").Dispose();
        }
    }

    public static void TestTextStreamStopAcrossTokens()
    {
        using (var model = LoadStories())
        {
            // A stop string that begins inside the 10th piece and ends inside the 11th.
            int cut = model.Detokenize(PromptIds.Concat(GeneratedIds.Take(10)).ToArray()).Length - Prompt.Length;
            string stop = GeneratedText.Substring(cut - 2, 4);
            string want = GeneratedText.Substring(0, GeneratedText.IndexOf(stop, StringComparison.Ordinal));
            using (var ts = model.CreateTextStream(stop, "never seen"))
            {
                var got = new StringBuilder();
                foreach (int tok in GeneratedIds)
                {
                    bool stopped;
                    got.Append(ts.Push(tok, out stopped));
                    if (stopped) break;
                }
                Check(ts.Stopped, "stopped");
                Equal(want, got.ToString(), "text before the stop");
                Equal("", ts.Push(GeneratedIds[0]), "push after the stop");
                ts.Reset();
                got.Clear();
                foreach (int tok in GeneratedIds.Take(5)) got.Append(ts.Push(tok));
                got.Append(ts.Flush());
                string five = model.Detokenize(PromptIds.Concat(GeneratedIds.Take(5)).ToArray());
                Equal(five.Substring(Prompt.Length), got.ToString(), "after reset");
            }
            using (var plain = model.CreateTextStream())
            {
                Equal("", plain.Push(model.Info().Eos), "EOS");
                Check(plain.Stopped, "EOS ends the stream");
            }
            Equal(Status.InvalidArgument, Throws(() => model.CreateTextStream("")), "empty stop");
        }
    }

    // A strict JSON reader (objects, arrays, strings, numbers, literals): Mono's
    // default profile has no JSON library.
    static class Json
    {
        public static object Parse(string text)
        {
            int i = 0;
            object v = Value(text, ref i);
            Space(text, ref i);
            if (i != text.Length) throw new FormatException("trailing text at " + i);
            return v;
        }

        static void Space(string t, ref int i) { while (i < t.Length && " \t\r\n".IndexOf(t[i]) >= 0) i++; }

        static void Expect(string t, ref int i, char c)
        {
            Space(t, ref i);
            if (i >= t.Length || t[i] != c) throw new FormatException("expected '" + c + "' at " + i);
            i++;
        }

        static object Value(string t, ref int i)
        {
            Space(t, ref i);
            if (i >= t.Length) throw new FormatException("unexpected end");
            char c = t[i];
            if (c == '{')
            {
                var o = new Dictionary<string, object>();
                i++;
                Space(t, ref i);
                if (i < t.Length && t[i] == '}') { i++; return o; }
                while (true)
                {
                    Space(t, ref i);
                    string k = Str(t, ref i);
                    Expect(t, ref i, ':');
                    o.Add(k, Value(t, ref i));
                    Space(t, ref i);
                    if (i < t.Length && t[i] == ',') { i++; continue; }
                    Expect(t, ref i, '}');
                    return o;
                }
            }
            if (c == '[')
            {
                var a = new List<object>();
                i++;
                Space(t, ref i);
                if (i < t.Length && t[i] == ']') { i++; return a; }
                while (true)
                {
                    a.Add(Value(t, ref i));
                    Space(t, ref i);
                    if (i < t.Length && t[i] == ',') { i++; continue; }
                    Expect(t, ref i, ']');
                    return a;
                }
            }
            if (c == '"') return Str(t, ref i);
            foreach (var lit in new[] { "true", "false", "null" })
                if (string.CompareOrdinal(t, i, lit, 0, lit.Length) == 0)
                {
                    i += lit.Length;
                    return lit == "null" ? null : (object)(lit == "true");
                }
            int start = i;
            while (i < t.Length && "+-0123456789.eE".IndexOf(t[i]) >= 0) i++;
            return double.Parse(t.Substring(start, i - start), System.Globalization.CultureInfo.InvariantCulture);
        }

        static string Str(string t, ref int i)
        {
            if (i >= t.Length || t[i] != '"') throw new FormatException("expected a string at " + i);
            var sb = new StringBuilder();
            for (i++; i < t.Length; i++)
            {
                char c = t[i];
                if (c == '"') { i++; return sb.ToString(); }
                if (c < 0x20) throw new FormatException("control character in a string at " + i);
                if (c != '\\') { sb.Append(c); continue; }
                char e = t[++i];
                if (e == 'u') { sb.Append((char)Convert.ToInt32(t.Substring(i + 1, 4), 16)); i += 4; }
                else sb.Append(e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e == 'b' ? '\b' : e == 'f' ? '\f' : e);
            }
            throw new FormatException("unterminated string");
        }
    }

    public static void TestDecodeBatchFailureKeepsAdvancedTokens()
    {
        using (var model = LoadStories())
        {
            // Room for the prompt and one pending token: the third step is out of context.
            var tight = new SessionOptions { MaxTokens = (uint)model.Tokenize(BatchPrompts[1]).Length + 1 };
            var a = Prompted(model, BatchPrompts[0]);
            var b = Prompted(model, BatchPrompts[1], tight);
            var c = Prompted(model, BatchPrompts[2]);
            var twinA = Prompted(model, BatchPrompts[0]);
            var twinC = Prompted(model, BatchPrompts[2]);
            try
            {
                var batch = new[] { a, b, c };
                for (int step = 0; step < 2; step++)
                {
                    var got = Session.DecodeBatch(batch);
                    Equal(twinA.DecodeStep(), got[0], "a step " + step);
                    Equal(twinC.DecodeStep(), got[2], "c step " + step);
                }
                var tokens = new int[3];
                Equal(Status.ContextFull, Throws(() => Session.DecodeBatchInto(batch, tokens)), "full session");
                SameIds(new[] { twinA.DecodeStep(), -1, -1 }, tokens, "tokens of the advanced sessions");
                Equal(twinC.DecodeStep(), c.DecodeStep(), "c unchanged");
            }
            finally
            {
                DisposeAll(new[] { a, b, c, twinA, twinC });
            }
        }
    }

    public static int Main(string[] args)
    {
        int failed = 0, passed = 0;
        foreach (var m in typeof(Tests).GetMethods(BindingFlags.Public | BindingFlags.Static)
                     .Where(m => m.Name.StartsWith("Test")).OrderBy(m => m.Name))
        {
            if (args.Length > 0 && !args.Contains(m.Name)) continue;
            try
            {
                m.Invoke(null, null);
                passed++;
                Console.WriteLine("[PASS] " + m.Name);
            }
            catch (TargetInvocationException e)
            {
                failed++;
                Console.WriteLine("[FAIL] " + m.Name + ": " + e.InnerException);
            }
        }
        GC.Collect();
        GC.WaitForPendingFinalizers();
        Console.WriteLine(string.Format("{0} passed, {1} failed", passed, failed));
        return failed == 0 && passed > 0 ? 0 : 1;
    }
}
