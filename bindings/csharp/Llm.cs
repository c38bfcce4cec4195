// C# binding of libllm (include/llm.h) through P/Invoke.
//
// Threading follows the C contract: a Model may be used from many threads at
// once; a Session by one thread at a time. Each Session holds a reference on
// its model's SafeHandle, so the C model is freed only after the last session
// (Model.Dispose only drops the owner's reference).
//
// The native library is bound by its SONAME, libllm.so.0, found through the
// loader path (LD_LIBRARY_PATH, rpath or the system directories).
using System;
using System.Collections.Generic;
using System.Runtime.InteropServices;
using System.Text;
using System.Threading;

namespace LibLlm
{
    /// <summary>llm_status values. ABI: they never change.</summary>
    public enum Status
    {
        Ok = 0,
        InvalidArgument = 1,
        OutOfMemory = 2,
        Io = 3,
        Format = 4,
        Checksum = 5,
        Unsupported = 6,
        Device = 7,
        ContextFull = 8,
        Cancelled = 9,
        BufferTooSmall = 10,
        Internal = 99,
    }

    public enum Device { Auto = 0, Cpu = 1, Cuda = 2 }

    public enum KvType { F16 = 0, F32 = 1, Int8 = 2, Int4 = 3 }

    public enum LogLevel { Debug = 0, Info = 1, Warn = 2, Error = 3 }

    /// <summary>A failed call: the status and this thread's llm_last_error text.</summary>
    public class LlmException : Exception
    {
        public Status Status { get; private set; }
        public string Detail { get; private set; }

        public LlmException(Status status, string detail)
            : base(string.IsNullOrEmpty(detail) ? Llm.StatusString(status) : detail + " (" + Llm.StatusString(status) + ")")
        {
            Status = status;
            Detail = detail ?? "";
        }
    }

    internal static class Native
    {
        internal const string Lib = "libllm.so.0";

        [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
        internal delegate int ProgressFn(float progress, IntPtr user);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
        internal delegate void LogFn(int level, IntPtr message, IntPtr user);
        [UnmanagedFunctionPointer(CallingConvention.Cdecl)]
        internal delegate int CancelFn(IntPtr user);

        [StructLayout(LayoutKind.Sequential)]
        internal struct LoadParams
        {
            public uint struct_size;
            public int device;
            public int n_threads;
            public uint flags;
            public IntPtr progress;
            public IntPtr progress_user_data;
            public IntPtr log;
            public IntPtr log_user_data;
            public ulong kv_budget_bytes;
            public uint kv_page_tokens;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct ModelProperties
        {
            public uint struct_size;
            public uint vocab_size;
            public uint context_length;
            public int bos;
            public int eos;
            public uint n_layers;
            public uint dim;
            public uint hidden_dim;
            public uint n_heads;
            public uint n_kv_heads;
            public uint head_dim;
            public int device;
            public ulong n_params;
            public ulong weight_bytes;
            [MarshalAs(UnmanagedType.ByValArray, SizeConst = 32)] public byte[] architecture;
            [MarshalAs(UnmanagedType.ByValArray, SizeConst = 16)] public byte[] weight_type;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct DetokState
        {
            public uint struct_size;
            public int prev_token;
            public uint n_pending;
            public uint pending; // uint8_t pending[4]: same bytes, keeps the struct blittable
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct SessionParams
        {
            public uint struct_size;
            public uint max_tokens;
            public uint window;
            public uint n_sink;
            public int kv_type;
            public IntPtr cancel;
            public IntPtr cancel_user_data;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct Sampling
        {
            public uint struct_size;
            public float temperature;
            public int top_k;
            public float top_p;
            public float min_p;
            public float repeat_penalty;
            public ulong seed;
            public int repeat_last_n;
            public IntPtr grammar;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct ChatMessage
        {
            public IntPtr role;    // NUL-terminated UTF-8 (HGlobal for the call)
            public IntPtr content;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct ChatParams
        {
            public uint struct_size;
            public IntPtr template_source;
            public int add_generation_prompt;
        }

        [StructLayout(LayoutKind.Sequential)]
        internal struct SessionStats
        {
            public uint struct_size;
            public uint n_tokens;
            public uint n_cached;
            public uint n_prompt;
            public uint n_generated;
            public uint kv_pages;
            public ulong kv_bytes;
            public double ttft_ms;
            public double itl_median_ms;
            public double itl_p95_ms;
            public double prompt_tokens_per_s;
            public double gen_tokens_per_s;
            public uint n_evicted;
        }

        [DllImport(Lib)] internal static extern uint llm_version();
        [DllImport(Lib)] internal static extern IntPtr llm_version_string();
        [DllImport(Lib)] internal static extern IntPtr llm_status_string(int status);
        [DllImport(Lib)] internal static extern IntPtr llm_last_error();
        [DllImport(Lib)] internal static extern void llm_load_params_init(ref LoadParams p);
        [DllImport(Lib)] internal static extern int llm_load(byte[] path, ref LoadParams p, out IntPtr model);
        [DllImport(Lib)] internal static extern void llm_model_free(IntPtr model);
        [DllImport(Lib)] internal static extern int llm_model_info(IntPtr model, ref ModelProperties info);
        [DllImport(Lib)] internal static extern int llm_tokenize(IntPtr model, byte[] text, UIntPtr textLen, uint flags,
                                                                 [Out] int[] tokens, UIntPtr capacity, out UIntPtr nTokens);
        [DllImport(Lib)] internal static extern int llm_token_to_text(IntPtr model, int token, [Out] byte[] buf,
                                                                      UIntPtr capacity, out UIntPtr length);
        [DllImport(Lib)] internal static extern int llm_detokenize(IntPtr model, int[] tokens, UIntPtr n, [Out] byte[] buf,
                                                                   UIntPtr capacity, out UIntPtr length);
        [DllImport(Lib)] internal static extern int llm_token_is_eog(IntPtr model, int token);
        [DllImport(Lib)] internal static extern void llm_detok_init(ref DetokState state, int prevToken);
        [DllImport(Lib)] internal static extern int llm_detok_push(IntPtr model, ref DetokState state, int token,
                                                                   [Out] byte[] buf, UIntPtr capacity, out UIntPtr length);
        [DllImport(Lib)] internal static extern int llm_detok_flush(ref DetokState state, [Out] byte[] buf, UIntPtr capacity,
                                                                    out UIntPtr length);
        [DllImport(Lib)] internal static extern void llm_session_params_init(ref SessionParams p);
        [DllImport(Lib)] internal static extern int llm_session_create(IntPtr model, ref SessionParams p, out IntPtr session);
        [DllImport(Lib)] internal static extern void llm_session_free(IntPtr session);
        [DllImport(Lib)] internal static extern int llm_session_reset(IntPtr session);
        [DllImport(Lib)] internal static extern int llm_prefill(IntPtr session, int[] tokens, UIntPtr n);
        [DllImport(Lib)] internal static extern int llm_logits(IntPtr session, out IntPtr logits, out UIntPtr nVocab);
        [DllImport(Lib)] internal static extern void llm_sampling_init(ref Sampling s);
        [DllImport(Lib)] internal static extern int llm_decode_step(IntPtr session, ref Sampling s, out int token);
        [DllImport(Lib)] internal static extern int llm_decode_batch(IntPtr[] sessions, UIntPtr n, ref Sampling s,
                                                                     [Out] int[] tokens);
        [DllImport(Lib)] internal static extern int llm_decode_batch_each(IntPtr[] sessions, UIntPtr n, IntPtr[] samplings,
                                                                          [Out] int[] tokens);
        [DllImport(Lib)] internal static extern int llm_decode_batch_prefill(IntPtr[] sessions, UIntPtr n, IntPtr[] prompts,
                                                                             UIntPtr[] nPrompts, int[] sample,
                                                                             IntPtr[] samplings, [Out] int[] tokens);
        [DllImport(Lib)] internal static extern int llm_kv_evict(IntPtr session, uint nKeep, uint nDiscard);
        [DllImport(Lib)] internal static extern int llm_session_stats(IntPtr session, ref SessionStats stats);
        [DllImport(Lib)] internal static extern int llm_session_fork(IntPtr src, out IntPtr session);
        [DllImport(Lib)] internal static extern int llm_session_save(IntPtr session, [Out] byte[] buf, UIntPtr capacity,
                                                                     out UIntPtr length);
        [DllImport(Lib)] internal static extern int llm_session_restore(IntPtr model, byte[] buf, UIntPtr length,
                                                                        out IntPtr session);
        [DllImport(Lib)] internal static extern void llm_chat_params_init(ref ChatParams p);
        [DllImport(Lib)] internal static extern int llm_chat_render(IntPtr model, [In] ChatMessage[] messages, UIntPtr n,
                                                                    ref ChatParams p, [Out] byte[] buf, UIntPtr capacity,
                                                                    out UIntPtr length);
        [DllImport(Lib)] internal static extern int llm_model_chat_template(IntPtr model, [Out] byte[] buf, UIntPtr capacity,
                                                                            out UIntPtr length);
        [DllImport(Lib)] internal static extern int llm_grammar_create(IntPtr model, byte[] gbnf, byte[] root, out IntPtr grammar);
        [DllImport(Lib)] internal static extern int llm_grammar_from_json_schema(IntPtr model, byte[] schema, out IntPtr grammar);
        [DllImport(Lib)] internal static extern int llm_json_schema_to_gbnf(byte[] schema, [Out] byte[] buf, UIntPtr capacity,
                                                                            out UIntPtr length);
        [DllImport(Lib)] internal static extern void llm_grammar_free(IntPtr grammar);
        [DllImport(Lib)] internal static extern int llm_text_stream_create(IntPtr model, [In] IntPtr[] stops, UIntPtr n,
                                                                           out IntPtr stream);
        [DllImport(Lib)] internal static extern int llm_text_stream_push(IntPtr stream, int token, [Out] byte[] buf,
                                                                         UIntPtr capacity, out UIntPtr length, out int stopped);
        [DllImport(Lib)] internal static extern int llm_text_stream_flush(IntPtr stream, [Out] byte[] buf, UIntPtr capacity,
                                                                          out UIntPtr length);
        [DllImport(Lib)] internal static extern int llm_text_stream_reset(IntPtr stream);
        [DllImport(Lib)] internal static extern void llm_text_stream_free(IntPtr stream);

        internal static string Utf8(IntPtr p)
        {
            if (p == IntPtr.Zero) return "";
            int n = 0;
            while (Marshal.ReadByte(p, n) != 0) n++;
            var bytes = new byte[n];
            Marshal.Copy(p, bytes, 0, n);
            return Encoding.UTF8.GetString(bytes);
        }

        internal static byte[] Utf8Z(string s)
        {
            var bytes = Encoding.UTF8.GetBytes(s);
            var z = new byte[bytes.Length + 1];
            Buffer.BlockCopy(bytes, 0, z, 0, bytes.Length);
            return z;
        }

        // llm_last_error is thread-local; the P/Invoke that failed ran on this thread.
        internal static void Check(int status)
        {
            if (status != 0) throw new LlmException((Status)status, Utf8(llm_last_error()));
        }

        internal delegate int BufferCall(byte[] buf, UIntPtr capacity, out UIntPtr length);

        internal static byte[] Grow(int initial, BufferCall call)
        {
            var buf = new byte[Math.Max(initial, 1)];
            while (true)
            {
                UIntPtr n;
                int st = call(buf, (UIntPtr)buf.Length, out n);
                if (st == (int)Status.BufferTooSmall && (long)n > buf.Length) { buf = new byte[(long)n]; continue; }
                Check(st);
                var outBytes = new byte[(long)n];
                Buffer.BlockCopy(buf, 0, outBytes, 0, outBytes.Length);
                return outBytes;
            }
        }

        // Grow for calls that write a NUL-terminated string (room for the NUL too).
        internal static string GrowString(int initial, BufferCall call)
        {
            var buf = new byte[Math.Max(initial, 1)];
            while (true)
            {
                UIntPtr n;
                int st = call(buf, (UIntPtr)buf.Length, out n);
                if (st == (int)Status.BufferTooSmall) { buf = new byte[Math.Max((long)n + 1, 2L * buf.Length)]; continue; }
                Check(st);
                return Encoding.UTF8.GetString(buf, 0, (int)n);
            }
        }

        // A NUL-terminated UTF-8 copy in unmanaged memory; free with Marshal.FreeHGlobal.
        internal static IntPtr HGlobalUtf8(string s)
        {
            var z = Utf8Z(s);
            IntPtr p = Marshal.AllocHGlobal(z.Length);
            Marshal.Copy(z, 0, p, z.Length);
            return p;
        }

        internal static void FreeAll(IntPtr[] ptrs)
        {
            foreach (var p in ptrs) if (p != IntPtr.Zero) Marshal.FreeHGlobal(p);
        }
    }

    /// <summary>Owns an llm_model*. Freed when the owner and every session have released it.</summary>
    internal sealed class ModelHandle : SafeHandle
    {
        internal Native.LogFn LogThunk; // referenced for as long as the C model may log

        internal ModelHandle(IntPtr p) : base(IntPtr.Zero, true) { SetHandle(p); }
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }
        protected override bool ReleaseHandle() { Native.llm_model_free(handle); return true; }
    }

    /// <summary>Owns an llm_session* and one reference on its model handle.</summary>
    internal sealed class SessionHandle : SafeHandle
    {
        private readonly ModelHandle model;

        internal SessionHandle(IntPtr p, ModelHandle model) : base(IntPtr.Zero, true)
        {
            this.model = model; // the caller already did model.DangerousAddRef
            SetHandle(p);
        }
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }
        protected override bool ReleaseHandle()
        {
            Native.llm_session_free(handle);
            model.DangerousRelease();
            return true;
        }
    }

    /// <summary>Owns an llm_grammar*. Calls that use the grammar hold a reference on it.</summary>
    internal sealed class GrammarHandle : SafeHandle
    {
        internal GrammarHandle(IntPtr p) : base(IntPtr.Zero, true) { SetHandle(p); }
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }
        protected override bool ReleaseHandle() { Native.llm_grammar_free(handle); return true; }
    }

    /// <summary>Owns an llm_text_stream* and one reference on its model handle.</summary>
    internal sealed class TextStreamHandle : SafeHandle
    {
        private readonly ModelHandle model;

        internal TextStreamHandle(IntPtr p, ModelHandle model) : base(IntPtr.Zero, true)
        {
            this.model = model; // the caller already did model.DangerousAddRef
            SetHandle(p);
        }
        public override bool IsInvalid { get { return handle == IntPtr.Zero; } }
        protected override bool ReleaseHandle()
        {
            Native.llm_text_stream_free(handle);
            model.DangerousRelease();
            return true;
        }
    }

    public static class Llm
    {
        public const uint HeaderVersion = 0 * 10000 + 4 * 100 + 0; // LLM_VERSION_NUMBER mirrored here
        public static uint Version { get { return Native.llm_version(); } }
        public static string VersionString { get { return Native.Utf8(Native.llm_version_string()); } }
        public static string StatusString(Status s) { return Native.Utf8(Native.llm_status_string((int)s)); }

        /// <summary>Model.ChatRender without a model: template is required; bos_token and eos_token are "".</summary>
        public static string ChatRender(IReadOnlyList<ChatMessage> messages, string template, bool addGenerationPrompt = true)
        {
            if (template == null) throw new ArgumentNullException("template");
            return Model.Render(IntPtr.Zero, messages, addGenerationPrompt, template);
        }
    }

    /// <summary>One message of a conversation (llm_chat_message).</summary>
    public struct ChatMessage
    {
        public string Role;    // "system", "user", "assistant", ...
        public string Content;

        public ChatMessage(string role, string content) { Role = role; Content = content; }
    }

    /// <summary>
    /// A compiled grammar bound to a model's vocabulary (llm_grammar): immutable and usable by many
    /// sessions and threads at once through Sampling.Grammar. It does not need its model after
    /// creation. Dispose waits for the calls using it; a disposed grammar in a Sampling throws
    /// ObjectDisposedException.
    /// </summary>
    public sealed class Grammar : IDisposable
    {
        internal readonly GrammarHandle Handle;

        private Grammar(IntPtr raw) { Handle = new GrammarHandle(raw); }

        /// <summary>Compiles a GBNF grammar whose start rule is root. A syntax error throws
        /// LlmException with Status.InvalidArgument and the line and column.</summary>
        public Grammar(Model model, string gbnf, string root = "root")
        {
            if (model == null) throw new ArgumentNullException("model");
            if (gbnf == null) throw new ArgumentNullException("gbnf");
            var g = Native.Utf8Z(gbnf);
            var r = root == null ? null : Native.Utf8Z(root);
            Handle = new GrammarHandle(model.With(h =>
            {
                IntPtr raw;
                Native.Check(Native.llm_grammar_create(h, g, r, out raw));
                return raw;
            }));
        }

        /// <summary>The grammar of the JSON texts a JSON Schema accepts (the subset of docs/GRAMMAR.md).</summary>
        public static Grammar FromJsonSchema(Model model, string schema)
        {
            if (model == null) throw new ArgumentNullException("model");
            if (schema == null) throw new ArgumentNullException("schema");
            var sch = Native.Utf8Z(schema);
            return new Grammar(model.With(h =>
            {
                IntPtr raw;
                Native.Check(Native.llm_grammar_from_json_schema(h, sch, out raw));
                return raw;
            }));
        }

        /// <summary>The GBNF text FromJsonSchema compiles for schema.</summary>
        public static string JsonSchemaToGbnf(string schema)
        {
            if (schema == null) throw new ArgumentNullException("schema");
            var sch = Native.Utf8Z(schema);
            return Native.GrowString(4096, (byte[] b, UIntPtr c, out UIntPtr n) => Native.llm_json_schema_to_gbnf(sch, b, c, out n));
        }

        public void Dispose() { Handle.Dispose(); }
    }

    /// <summary>
    /// Generated tokens to text to show (llm_text_stream): complete UTF-8 only, stop strings found
    /// across token boundaries (the text before a stop is delivered; the stop and everything after
    /// it never are), and an end-of-generation token ends the stream. One thread at a time. Keeps
    /// its model alive until disposed.
    /// </summary>
    public sealed class TextStream : IDisposable
    {
        private readonly TextStreamHandle handle;
        private byte[] buf;

        internal TextStream(ModelHandle model, IReadOnlyList<string> stops)
        {
            var ptrs = new IntPtr[stops.Count];
            int longest = 0;
            try
            {
                for (int i = 0; i < ptrs.Length; i++)
                {
                    if (stops[i] == null) throw new ArgumentNullException("stops", "element " + i + " is null");
                    ptrs[i] = Native.HGlobalUtf8(stops[i]);
                    longest = Math.Max(longest, Encoding.UTF8.GetByteCount(stops[i]));
                }
                bool added = false;
                model.DangerousAddRef(ref added); // becomes the stream's model reference
                IntPtr raw;
                int st = Native.llm_text_stream_create(model.DangerousGetHandle(), ptrs, (UIntPtr)ptrs.Length, out raw);
                if (st != 0)
                {
                    var e = new LlmException((Status)st, Native.Utf8(Native.llm_last_error()));
                    model.DangerousRelease();
                    throw e;
                }
                handle = new TextStreamHandle(raw, model);
            }
            finally
            {
                Native.FreeAll(ptrs);
            }
            buf = new byte[256 + 3 * longest];
        }

        /// <summary>True once a stop string or an end-of-generation token ended the stream.</summary>
        public bool Stopped { get; private set; }

        private IntPtr H
        {
            get
            {
                if (handle.IsClosed) throw new ObjectDisposedException("TextStream");
                return handle.DangerousGetHandle();
            }
        }

        /// <summary>Feeds one generated token; returns the text that became safe to show (often ""
        /// while a stop string may be starting). stopped is true once the stream has ended; later
        /// pushes return "".</summary>
        public string Push(int token, out bool stopped)
        {
            IntPtr h = H;
            while (true)
            {
                UIntPtr n;
                int s;
                int st = Native.llm_text_stream_push(h, token, buf, (UIntPtr)buf.Length, out n, out s);
                if (st == (int)Status.BufferTooSmall && (long)n > buf.Length) { buf = new byte[(long)n]; continue; }
                Native.Check(st);
                Stopped = stopped = s != 0;
                return Encoding.UTF8.GetString(buf, 0, (int)n);
            }
        }

        /// <summary>Push without the out parameter; see Stopped.</summary>
        public string Push(int token)
        {
            bool stopped;
            return Push(token, out stopped);
        }

        /// <summary>Ends the stream: the text still held back (a partial stop string is text after
        /// all; an unfinished character becomes U+FFFD).</summary>
        public string Flush()
        {
            IntPtr h = H;
            return Encoding.UTF8.GetString(Native.Grow(buf.Length, (byte[] b, UIntPtr c, out UIntPtr n) => Native.llm_text_stream_flush(h, b, c, out n)));
        }

        /// <summary>Starts over with the same stops.</summary>
        public void Reset()
        {
            Native.Check(Native.llm_text_stream_reset(H));
            Stopped = false;
        }

        public void Dispose() { handle.Dispose(); }
    }

    public sealed class LoadOptions
    {
        public Device Device = Device.Auto;
        public int Threads;            // 0 = all cores
        public bool VocabOnly;         // metadata and tokenizer only; no sessions
        public bool ReferenceMath;     // f32 math on dequantized weights (slower; matches reference implementations)
        public ulong KvBudgetBytes;    // 0 = library default
        public uint KvPageTokens;      // 0 = library default
        public Func<float, bool> Progress; // return false to cancel loading
        public Action<LogLevel, string> Log;
    }

    public sealed class SessionOptions
    {
        public uint MaxTokens;         // 0 = the model's context length
        public uint Window;            // sliding window; 0 = none
        public uint? Sink;             // attention-sink tokens; null = library default
        public KvType KvType = KvType.F16;
    }

    /// <summary>llm_sampling. Default is the library's defaults (greedy).</summary>
    public struct Sampling
    {
        public float Temperature;
        public int TopK;
        public float TopP;
        public float MinP;
        public float RepeatPenalty;
        public ulong Seed;
        public int RepeatLastN;
        /// <summary>Constrains the tokens (null: none): tokens it forbids get probability 0; once it
        /// has ended only end-of-generation tokens remain.</summary>
        public Grammar Grammar;

        public static Sampling Default
        {
            get
            {
                var n = new Native.Sampling();
                Native.llm_sampling_init(ref n);
                return new Sampling
                {
                    Temperature = n.temperature, TopK = n.top_k, TopP = n.top_p, MinP = n.min_p,
                    RepeatPenalty = n.repeat_penalty, Seed = n.seed, RepeatLastN = n.repeat_last_n,
                };
            }
        }

        public static Sampling Greedy { get { return Default; } }

        internal Native.Sampling ToNative()
        {
            var n = new Native.Sampling();
            Native.llm_sampling_init(ref n);
            n.struct_size = (uint)Marshal.SizeOf(typeof(Native.Sampling));
            n.temperature = Temperature; n.top_k = TopK; n.top_p = TopP; n.min_p = MinP;
            n.repeat_penalty = RepeatPenalty; n.seed = Seed; n.repeat_last_n = RepeatLastN;
            return n;
        }

        // Sets n.grammar and holds a reference on the grammar until ReleaseGrammar
        // (ObjectDisposedException if it was disposed).
        internal void AddGrammar(ref Native.Sampling n, ref bool added)
        {
            if (Grammar == null) return;
            Grammar.Handle.DangerousAddRef(ref added);
            n.grammar = Grammar.Handle.DangerousGetHandle();
        }

        internal void ReleaseGrammar(bool added)
        {
            if (added) Grammar.Handle.DangerousRelease();
        }
    }

    public sealed class ModelInfo
    {
        public uint VocabSize, ContextLength, Layers, Dim, HiddenDim, Heads, KvHeads, HeadDim;
        public int Bos, Eos; // -1 if none
        public Device Device;
        public ulong Params, WeightBytes;
        public string Architecture, WeightType;
    }

    public sealed class SessionStats
    {
        public uint Tokens, Cached, Prompt, Generated, KvPages, Evicted;
        public ulong KvBytes;
        public double TtftMs, ItlMedianMs, ItlP95Ms, PromptTokensPerS, GenTokensPerS;
    }

    /// <summary>One generated token and the complete UTF-8 text it makes available.</summary>
    public struct Piece
    {
        public int Token;
        public string Text;
    }

    /// <summary>A loaded model (native .llm or GGUF). Thread-safe.</summary>
    public sealed class Model : IDisposable
    {
        internal readonly ModelHandle Handle;
        // SafeHandle alone does not reject use after Dispose while sessions
        // still hold references (Mono), so the owner's calls check this too.
        private volatile bool disposed;

        private Model(ModelHandle h) { Handle = h; }

        private void ThrowIfDisposed()
        {
            if (disposed) throw new ObjectDisposedException("Model");
        }

        public static Model Load(string path, LoadOptions options = null)
        {
            options = options ?? new LoadOptions();
            var p = new Native.LoadParams();
            Native.llm_load_params_init(ref p);
            p.device = (int)options.Device;
            p.n_threads = options.Threads;
            if (options.VocabOnly) p.flags |= 1u;     // LLM_LOAD_VOCAB_ONLY
            if (options.ReferenceMath) p.flags |= 2u; // LLM_LOAD_REFERENCE_MATH
            if (options.KvBudgetBytes != 0) p.kv_budget_bytes = options.KvBudgetBytes;
            if (options.KvPageTokens != 0) p.kv_page_tokens = options.KvPageTokens;
            Native.ProgressFn progress = null;
            if (options.Progress != null)
            {
                var f = options.Progress;
                progress = (fraction, user) => { try { return f(fraction) ? 0 : 1; } catch { return 1; } };
                p.progress = Marshal.GetFunctionPointerForDelegate(progress);
            }
            Native.LogFn log = null;
            if (options.Log != null)
            {
                var f = options.Log;
                log = (level, message, user) => { try { f((LogLevel)level, Native.Utf8(message)); } catch { } };
                p.log = Marshal.GetFunctionPointerForDelegate(log);
            }
            IntPtr raw;
            int st = Native.llm_load(Native.Utf8Z(path), ref p, out raw);
            GC.KeepAlive(progress);
            Native.Check(st);
            return new Model(new ModelHandle(raw) { LogThunk = log });
        }

        /// <summary>Drops the owner's reference; the C model goes with the last session.</summary>
        public void Dispose()
        {
            disposed = true;
            Handle.Dispose();
        }

        // Runs f with the C model pinned alive; throws ObjectDisposedException after Dispose.
        internal T With<T>(Func<IntPtr, T> f)
        {
            bool added = false;
            try
            {
                ThrowIfDisposed();
                Handle.DangerousAddRef(ref added);
                return f(Handle.DangerousGetHandle());
            }
            finally
            {
                if (added) Handle.DangerousRelease();
            }
        }

        public ModelInfo Info()
        {
            return With(h =>
            {
                var p = new Native.ModelProperties();
                p.struct_size = (uint)Marshal.SizeOf(typeof(Native.ModelProperties));
                Native.Check(Native.llm_model_info(h, ref p));
                return new ModelInfo
                {
                    VocabSize = p.vocab_size, ContextLength = p.context_length, Bos = p.bos, Eos = p.eos,
                    Layers = p.n_layers, Dim = p.dim, HiddenDim = p.hidden_dim, Heads = p.n_heads,
                    KvHeads = p.n_kv_heads, HeadDim = p.head_dim, Device = (Device)p.device, Params = p.n_params,
                    WeightBytes = p.weight_bytes, Architecture = CString(p.architecture), WeightType = CString(p.weight_type),
                };
            });
        }

        private static string CString(byte[] b)
        {
            int n = Array.IndexOf(b, (byte)0);
            return Encoding.UTF8.GetString(b, 0, n < 0 ? b.Length : n);
        }

        internal static int[] Tokenize(IntPtr h, byte[] text, uint flags)
        {
            var tokens = new int[text.Length + 3];
            while (true)
            {
                UIntPtr n;
                int st = Native.llm_tokenize(h, text, (UIntPtr)text.Length, flags, tokens, (UIntPtr)tokens.Length, out n);
                if (st == (int)Status.BufferTooSmall && (long)n > tokens.Length) { tokens = new int[(long)n]; continue; }
                Native.Check(st);
                Array.Resize(ref tokens, (int)n);
                return tokens;
            }
        }

        /// <summary>Token ids of UTF-8 text; addBos prepends BOS; parseSpecial turns "&lt;s&gt;" into its id.</summary>
        public int[] Tokenize(string text, bool addBos = true, bool parseSpecial = false)
        {
            uint flags = (addBos ? 1u : 0u) | (parseSpecial ? 2u : 0u);
            var bytes = Encoding.UTF8.GetBytes(text);
            return With(h => Tokenize(h, bytes, flags));
        }

        public byte[] TokenBytes(int token)
        {
            return With(h => Native.Grow(32, (byte[] b, UIntPtr c, out UIntPtr n) => Native.llm_token_to_text(h, token, b, c, out n)));
        }

        public string Detokenize(int[] tokens)
        {
            return With(h => Encoding.UTF8.GetString(Native.Grow(8 * tokens.Length + 16,
                (byte[] b, UIntPtr c, out UIntPtr n) => Native.llm_detokenize(h, tokens, (UIntPtr)tokens.Length, b, c, out n))));
        }

        public bool IsEog(int token) { return With(h => Native.llm_token_is_eog(h, token) != 0); }

        public Detokenizer CreateDetokenizer(int prevToken = -1)
        {
            ThrowIfDisposed();
            return new Detokenizer(Handle, prevToken);
        }

        /// <summary>
        /// The conversation as prompt text (llm_chat_render) through template (Jinja2 source), or the
        /// model's own template when null. The text usually begins with the BOS text: tokenize it with
        /// addBos false and parseSpecial true. A model without a template (and no built-in that fits)
        /// throws LlmException with Status.Unsupported; a malformed template Status.InvalidArgument.
        /// </summary>
        public string ChatRender(IReadOnlyList<ChatMessage> messages, bool addGenerationPrompt = true, string template = null)
        {
            return With(h => Render(h, messages, addGenerationPrompt, template));
        }

        internal static string Render(IntPtr h, IReadOnlyList<ChatMessage> messages, bool addGenerationPrompt, string template)
        {
            if (messages == null) throw new ArgumentNullException("messages");
            var native = new Native.ChatMessage[messages.Count];
            var owned = new IntPtr[2 * messages.Count + 1];
            try
            {
                int size = 256;
                for (int i = 0; i < native.Length; i++)
                {
                    if (messages[i].Role == null || messages[i].Content == null)
                        throw new ArgumentNullException("messages", "message " + i + " has a null field");
                    native[i].role = owned[2 * i] = Native.HGlobalUtf8(messages[i].Role);
                    native[i].content = owned[2 * i + 1] = Native.HGlobalUtf8(messages[i].Content);
                    size += messages[i].Role.Length + 3 * messages[i].Content.Length;
                }
                var p = new Native.ChatParams();
                Native.llm_chat_params_init(ref p);
                p.add_generation_prompt = addGenerationPrompt ? 1 : 0;
                if (template != null) p.template_source = owned[owned.Length - 1] = Native.HGlobalUtf8(template);
                return Native.GrowString(size, (byte[] b, UIntPtr c, out UIntPtr n) =>
                    Native.llm_chat_render(h, native, (UIntPtr)native.Length, ref p, b, c, out n));
            }
            finally
            {
                Native.FreeAll(owned);
            }
        }

        /// <summary>The template ChatRender uses when none is passed: the file's, or the built-in one
        /// (LlmException with Status.Unsupported if there is none).</summary>
        public string ChatTemplate()
        {
            return With(h => Native.GrowString(4096, (byte[] b, UIntPtr c, out UIntPtr n) => Native.llm_model_chat_template(h, b, c, out n)));
        }

        /// <summary>A text stream that ends at any of stops (non-empty, at most 64 of at most 1024
        /// bytes each, else LlmException with Status.InvalidArgument).</summary>
        public TextStream CreateTextStream(params string[] stops)
        {
            ThrowIfDisposed();
            return new TextStream(Handle, stops ?? new string[0]);
        }

        public Session CreateSession(SessionOptions options = null)
        {
            ThrowIfDisposed();
            return new Session(Handle, options ?? new SessionOptions());
        }

        /// <summary>Rebuilds a session from Session.Save bytes (same model shape and KV page size).
        /// Malformed bytes throw LlmException with Status.Format or Status.Checksum.</summary>
        public Session RestoreSession(byte[] saved)
        {
            ThrowIfDisposed();
            bool added = false;
            Handle.DangerousAddRef(ref added); // becomes the new session's model reference
            IntPtr raw;
            int st = Native.llm_session_restore(Handle.DangerousGetHandle(), saved, (UIntPtr)saved.Length, out raw);
            if (st != 0)
            {
                var e = new LlmException((Status)st, Native.Utf8(Native.llm_last_error()));
                Handle.DangerousRelease();
                throw e;
            }
            return new Session(Handle, raw, null, -1);
        }
    }

    /// <summary>Streaming detokenizer (llm_detok_push): emits only complete UTF-8.</summary>
    public sealed class Detokenizer
    {
        private readonly ModelHandle model;
        private Native.DetokState state;
        private byte[] buf = new byte[64];

        internal Detokenizer(ModelHandle model, int prevToken)
        {
            this.model = model;
            Native.llm_detok_init(ref state, prevToken);
        }

        public string Push(int token)
        {
            bool added = false;
            try
            {
                model.DangerousAddRef(ref added);
                while (true)
                {
                    UIntPtr n;
                    int st = Native.llm_detok_push(model.DangerousGetHandle(), ref state, token, buf, (UIntPtr)buf.Length, out n);
                    if (st == (int)Status.BufferTooSmall && (long)n > buf.Length) { buf = new byte[(long)n]; continue; }
                    Native.Check(st);
                    return Encoding.UTF8.GetString(buf, 0, (int)n);
                }
            }
            finally
            {
                if (added) model.DangerousRelease();
            }
        }

        /// <summary>Ends the stream: held-back bytes come out as U+FFFD.</summary>
        public string Flush()
        {
            return Encoding.UTF8.GetString(Native.Grow(16, (byte[] b, UIntPtr c, out UIntPtr n) => Native.llm_detok_flush(ref state, b, c, out n)));
        }
    }

    /// <summary>One sequence on a model. Not thread-safe: one thread at a time.</summary>
    public sealed class Session : IDisposable
    {
        // Shared between a session and its forks, which inherit the C cancel callback.
        private sealed class CancelState
        {
            internal int Flag;
            internal readonly Native.CancelFn Thunk; // referenced while any C session may call it
            internal CancelState() { Thunk = user => Volatile.Read(ref Flag); }
        }

        private readonly ModelHandle model;
        private readonly SessionHandle handle;
        private readonly CancelState cancel; // null for restored sessions
        private int last = -1; // last token appended or returned; -1 if unknown

        // Wraps a C session that already holds one reference on `model`.
        internal Session(ModelHandle model, IntPtr raw, object cancelState, int last)
        {
            this.model = model;
            handle = new SessionHandle(raw, model);
            cancel = (CancelState)cancelState;
            this.last = last;
        }

        internal Session(ModelHandle model, SessionOptions o)
        {
            var p = new Native.SessionParams();
            Native.llm_session_params_init(ref p);
            p.max_tokens = o.MaxTokens;
            p.window = o.Window;
            if (o.Sink.HasValue) p.n_sink = o.Sink.Value;
            p.kv_type = (int)o.KvType;
            cancel = new CancelState();
            p.cancel = Marshal.GetFunctionPointerForDelegate(cancel.Thunk);

            bool added = false;
            model.DangerousAddRef(ref added); // throws ObjectDisposedException after Model.Dispose
            IntPtr raw;
            int st = Native.llm_session_create(model.DangerousGetHandle(), ref p, out raw);
            if (st != 0)
            {
                var e = new LlmException((Status)st, Native.Utf8(Native.llm_last_error()));
                model.DangerousRelease();
                throw e;
            }
            this.model = model;
            handle = new SessionHandle(raw, model);
        }

        public void Dispose() { handle.Dispose(); }

        private IntPtr H
        {
            get
            {
                if (handle.IsClosed) throw new ObjectDisposedException("Session");
                return handle.DangerousGetHandle();
            }
        }

        /// <summary>Makes a running or later Prefill fail with Status.Cancelled until ResetCancel. Any thread.</summary>
        public void Cancel() { if (cancel != null) Volatile.Write(ref cancel.Flag, 1); }
        public void ResetCancel() { if (cancel != null) Volatile.Write(ref cancel.Flag, 0); }

        /// <summary>An independent copy sharing this session's KV pages (copy on write); it may be
        /// used on another thread. It shares this session's cancel flag.</summary>
        public Session Fork()
        {
            IntPtr src = H;
            bool added = false;
            model.DangerousAddRef(ref added); // becomes the fork's model reference
            IntPtr raw;
            int st = Native.llm_session_fork(src, out raw);
            if (st != 0)
            {
                var e = new LlmException((Status)st, Native.Utf8(Native.llm_last_error()));
                model.DangerousRelease();
                throw e;
            }
            return new Session(model, raw, cancel, last);
        }

        /// <summary>The session (tokens, KV cache, logits, sampler state) as versioned, checksummed bytes.</summary>
        public byte[] Save()
        {
            IntPtr h = H;
            UIntPtr need;
            int st = Native.llm_session_save(h, null, UIntPtr.Zero, out need);
            if (st != (int)Status.BufferTooSmall) Native.Check(st);
            return Native.Grow((int)need, (byte[] b, UIntPtr c, out UIntPtr n) => Native.llm_session_save(h, b, c, out n));
        }

        public void Prefill(int[] tokens)
        {
            Native.Check(Native.llm_prefill(H, tokens, (UIntPtr)tokens.Length));
            if (tokens.Length > 0) last = tokens[tokens.Length - 1];
        }

        public int DecodeStep(Sampling? sampling = null)
        {
            var sp = sampling ?? Sampling.Default;
            var s = sp.ToNative();
            bool grammarAdded = false;
            try
            {
                sp.AddGrammar(ref s, ref grammarAdded);
                int token;
                Native.Check(Native.llm_decode_step(H, ref s, out token));
                last = token;
                return token;
            }
            finally
            {
                sp.ReleaseGrammar(grammarAdded);
            }
        }

        /// <summary>
        /// DecodeStep on each session, in order, as one call (llm_decode_batch). On a CUDA model the
        /// sessions' pending tokens run as one batched pass, so they share one read of the weights.
        /// Element i is the token of sessions[i], the one it would have sampled alone. The sessions
        /// must be distinct and belong to the same native model (two Model.Load calls of one file are
        /// two models), else LlmException with Status.InvalidArgument and nothing advances. The
        /// calling thread must own every session. On a failure the sessions before the failing one
        /// have advanced and their tokens are lost: use DecodeBatchInto to keep them.
        /// </summary>
        public static int[] DecodeBatch(IReadOnlyList<Session> sessions, Sampling? sampling = null)
        {
            if (sessions == null) throw new ArgumentNullException("sessions");
            var tokens = new int[sessions.Count];
            DecodeBatchInto(sessions, tokens, sampling);
            return tokens;
        }

        /// <summary>
        /// DecodeBatch writing into tokens (as long as sessions). When it throws LlmException, tokens
        /// still holds the token of every session that advanced before the failing one, and -1 for
        /// the failing session and those after it (they are unchanged).
        /// </summary>
        public static void DecodeBatchInto(IReadOnlyList<Session> sessions, int[] tokens, Sampling? sampling = null)
        {
            if (sessions == null) throw new ArgumentNullException("sessions");
            if (tokens == null) throw new ArgumentNullException("tokens");
            if (tokens.Length != sessions.Count)
                throw new ArgumentException(string.Format("{0} tokens for {1} sessions", tokens.Length, sessions.Count), "tokens");
            if (sessions.Count == 0) return; // nothing to do (and llm_decode_batch 0.2.0 reads sessions[0] for n == 0)
            var sp = sampling ?? Sampling.Default;
            var s = sp.ToNative();
            var ptrs = new IntPtr[sessions.Count];
            var added = new bool[sessions.Count];
            bool grammarAdded = false;
            for (int i = 0; i < tokens.Length; i++) tokens[i] = -1; // the library may reject the call before it writes them
            try
            {
                sp.AddGrammar(ref s, ref grammarAdded);
                // Each handle stays referenced for the call, so a Dispose meanwhile cannot free it.
                for (int i = 0; i < ptrs.Length; i++)
                {
                    if (sessions[i] == null) throw new ArgumentNullException("sessions", "element " + i + " is null");
                    sessions[i].handle.DangerousAddRef(ref added[i]); // ObjectDisposedException after Dispose
                    ptrs[i] = sessions[i].handle.DangerousGetHandle();
                }
                int st = Native.llm_decode_batch(ptrs, (UIntPtr)ptrs.Length, ref s, tokens);
                // Sessions that advanced (also before a failure) continue their streams after their token.
                for (int i = 0; i < tokens.Length; i++)
                    if (tokens[i] >= 0) sessions[i].last = tokens[i];
                Native.Check(st);
            }
            finally
            {
                for (int i = 0; i < added.Length; i++)
                    if (added[i]) sessions[i].handle.DangerousRelease();
                sp.ReleaseGrammar(grammarAdded);
            }
        }

        /// <summary>
        /// DecodeBatch with settings of their own for every session (llm_decode_batch_each, library
        /// 0.3): sessions[i] samples with samplings[i] (null: greedy), so other temperatures, seeds
        /// and grammars share one batched pass. samplings must be as long as sessions. Every setting
        /// is checked before any session moves. Element i is the token sessions[i] would have sampled
        /// alone with its settings. On a failure the tokens of the sessions that advanced are lost:
        /// use DecodeBatchEachInto to keep them.
        /// </summary>
        public static int[] DecodeBatchEach(IReadOnlyList<Session> sessions, IReadOnlyList<Sampling?> samplings)
        {
            if (sessions == null) throw new ArgumentNullException("sessions");
            var tokens = new int[sessions.Count];
            DecodeBatchEachInto(sessions, tokens, samplings);
            return tokens;
        }

        /// <summary>
        /// DecodeBatchEach writing into tokens (as long as sessions). When it throws LlmException,
        /// tokens still holds the token of every session that advanced before the failing one, and -1
        /// for the failing session and those after it (they are unchanged).
        /// </summary>
        public static void DecodeBatchEachInto(IReadOnlyList<Session> sessions, int[] tokens,
                                               IReadOnlyList<Sampling?> samplings)
        {
            if (samplings == null) throw new ArgumentNullException("samplings");
            int st = RunBatch(sessions, tokens, samplings,
                              (ptrs, samplingPtrs) => Native.llm_decode_batch_each(ptrs, (UIntPtr)ptrs.Length,
                                                                                   samplingPtrs, tokens));
            for (int i = 0; i < tokens.Length; i++)
                if (tokens[i] >= 0) sessions[i].last = tokens[i];
            Native.Check(st);
        }

        /// <summary>
        /// DecodeBatchEach where sessions may first append prompt tokens (llm_decode_batch_prefill,
        /// library 0.4): sessions[i] appends prompts[i] (null or empty: nothing) as Prefill would, in
        /// the same batched pass as the other sessions' pending tokens, so a new request's prompt, or
        /// a chunk of a long one, joins the running generations instead of stalling them. Then it
        /// samples with samplings[i] (null list or entry: greedy), unless sample is non-null and
        /// sample[i] is false: then it only appends (a chunk of a longer prompt) and element i is -1.
        /// Each session ends as Prefill then DecodeStep alone would leave it. Every token id and
        /// setting is checked before any session moves (LlmException with Status.InvalidArgument,
        /// nothing appended). prompts, and sample and samplings when given, have one entry per
        /// session. On a failure the tokens of the sessions that advanced are lost: use
        /// DecodeBatchPrefillInto to keep them.
        /// </summary>
        public static int[] DecodeBatchPrefill(IReadOnlyList<Session> sessions, IReadOnlyList<int[]> prompts,
                                               IReadOnlyList<bool> sample = null,
                                               IReadOnlyList<Sampling?> samplings = null)
        {
            if (sessions == null) throw new ArgumentNullException("sessions");
            var tokens = new int[sessions.Count];
            DecodeBatchPrefillInto(sessions, tokens, prompts, sample, samplings);
            return tokens;
        }

        /// <summary>
        /// DecodeBatchPrefill writing into tokens (as long as sessions). When it throws LlmException,
        /// tokens still holds the sampled token of every session that advanced before the failing one,
        /// and -1 for the others. The failing session and those after it are unchanged, except that
        /// when a grammar allows no token for a session, the sessions after it that joined the pass
        /// have appended their prompt.
        /// </summary>
        public static void DecodeBatchPrefillInto(IReadOnlyList<Session> sessions, int[] tokens,
                                                  IReadOnlyList<int[]> prompts, IReadOnlyList<bool> sample = null,
                                                  IReadOnlyList<Sampling?> samplings = null)
        {
            if (sessions == null) throw new ArgumentNullException("sessions");
            if (prompts == null) throw new ArgumentNullException("prompts");
            CheckBatchLength(sessions.Count, prompts.Count, "prompts");
            if (sample != null) CheckBatchLength(sessions.Count, sample.Count, "sample");
            int n = sessions.Count;
            var counts = new UIntPtr[n];
            int total = 0;
            for (int i = 0; i < n; i++)
            {
                int len = prompts[i] == null ? 0 : prompts[i].Length;
                counts[i] = (UIntPtr)len;
                total += len;
            }
            int[] flags = null;
            if (sample != null)
            {
                flags = new int[n];
                for (int i = 0; i < n; i++) flags[i] = sample[i] ? 1 : 0;
            }
            // The prompts go to unmanaged memory: the library reads an array of pointers to them.
            IntPtr block = Marshal.AllocHGlobal(Math.Max(total, 1) * sizeof(int));
            int st;
            try
            {
                var promptPtrs = new IntPtr[n];
                int at = 0;
                for (int i = 0; i < n; i++)
                {
                    int len = (int)counts[i];
                    if (len == 0) continue;
                    promptPtrs[i] = IntPtr.Add(block, at * sizeof(int));
                    Marshal.Copy(prompts[i], 0, promptPtrs[i], len);
                    at += len;
                }
                st = RunBatch(sessions, tokens, samplings,
                              (ptrs, samplingPtrs) => Native.llm_decode_batch_prefill(
                                  ptrs, (UIntPtr)ptrs.Length, promptPtrs, counts, flags, samplingPtrs, tokens));
            }
            finally
            {
                Marshal.FreeHGlobal(block);
            }
            for (int i = 0; i < n; i++)
            {
                if (tokens[i] >= 0) sessions[i].last = tokens[i];
                else if (counts[i] != UIntPtr.Zero)
                    // Appended on success; after a failure it may or may not be: unknown.
                    sessions[i].last = st == 0 ? prompts[i][prompts[i].Length - 1] : -1;
            }
            Native.Check(st);
        }

        private static void CheckBatchLength(int nSessions, int n, string what)
        {
            if (n != nSessions)
                throw new ArgumentException(string.Format("{0} {1} for {2} sessions", n, what, nSessions), what);
        }

        // Runs one batch call with the sessions' handles and an array of pointers to unmanaged copies
        // of the samplings (null when samplings is null: greedy for all). The session handles and every
        // grammar stay referenced for the call, so a Dispose meanwhile cannot free them. Returns the
        // call's status; tokens is -1 first, as the library may reject the call before it writes them.
        private static int RunBatch(IReadOnlyList<Session> sessions, int[] tokens, IReadOnlyList<Sampling?> samplings,
                                    Func<IntPtr[], IntPtr[], int> native)
        {
            if (sessions == null) throw new ArgumentNullException("sessions");
            if (tokens == null) throw new ArgumentNullException("tokens");
            CheckBatchLength(sessions.Count, tokens.Length, "tokens");
            if (samplings != null) CheckBatchLength(sessions.Count, samplings.Count, "samplings");
            int n = sessions.Count;
            for (int i = 0; i < n; i++) tokens[i] = -1;
            if (n == 0) return 0;
            var ptrs = new IntPtr[n];
            var added = new bool[n];
            var grammarAdded = new bool[n];
            int size = Marshal.SizeOf(typeof(Native.Sampling));
            IntPtr block = samplings != null ? Marshal.AllocHGlobal(size * n) : IntPtr.Zero;
            try
            {
                IntPtr[] samplingPtrs = null;
                if (samplings != null)
                {
                    samplingPtrs = new IntPtr[n];
                    for (int i = 0; i < n; i++)
                    {
                        if (!samplings[i].HasValue) continue; // NULL: greedy
                        var sp = samplings[i].Value;
                        var s = sp.ToNative();
                        sp.AddGrammar(ref s, ref grammarAdded[i]);
                        samplingPtrs[i] = IntPtr.Add(block, i * size);
                        Marshal.StructureToPtr(s, samplingPtrs[i], false);
                    }
                }
                for (int i = 0; i < n; i++)
                {
                    if (sessions[i] == null) throw new ArgumentNullException("sessions", "element " + i + " is null");
                    sessions[i].handle.DangerousAddRef(ref added[i]); // ObjectDisposedException after Dispose
                    ptrs[i] = sessions[i].handle.DangerousGetHandle();
                }
                return native(ptrs, samplingPtrs);
            }
            finally
            {
                for (int i = 0; i < n; i++)
                    if (added[i]) sessions[i].handle.DangerousRelease();
                for (int i = 0; i < n; i++)
                    if (grammarAdded[i]) samplings[i].Value.ReleaseGrammar(true);
                if (block != IntPtr.Zero) Marshal.FreeHGlobal(block);
            }
        }

        /// <summary>A copy of the logits the next DecodeStep samples from.</summary>
        public float[] Logits()
        {
            IntPtr p;
            UIntPtr n;
            Native.Check(Native.llm_logits(H, out p, out n));
            var result = new float[(long)n];
            Marshal.Copy(p, result, 0, result.Length);
            return result;
        }

        public void Reset() { Native.Check(Native.llm_session_reset(H)); last = -1; }

        public void KvEvict(uint nKeep, uint nDiscard)
        {
            uint before = Stats().Tokens;
            Native.Check(Native.llm_kv_evict(H, nKeep, nDiscard));
            if ((ulong)nKeep + nDiscard >= before) last = -1; // the tail went; its last token is unknown here
        }

        public SessionStats Stats()
        {
            var s = new Native.SessionStats();
            s.struct_size = (uint)Marshal.SizeOf(typeof(Native.SessionStats));
            Native.Check(Native.llm_session_stats(H, ref s));
            return new SessionStats
            {
                Tokens = s.n_tokens, Cached = s.n_cached, Prompt = s.n_prompt, Generated = s.n_generated,
                KvPages = s.kv_pages, KvBytes = s.kv_bytes, TtftMs = s.ttft_ms, ItlMedianMs = s.itl_median_ms,
                ItlP95Ms = s.itl_p95_ms, PromptTokensPerS = s.prompt_tokens_per_s, GenTokensPerS = s.gen_tokens_per_s,
                Evicted = s.n_evicted,
            };
        }

        /// <summary>
        /// Up to maxTokens generated tokens with their text. An end-of-generation token ends the
        /// stream and is not yielded, except when bytes were still held back: they come (as U+FFFD)
        /// in a last piece carrying that token. After the last of maxTokens tokens, held-back bytes
        /// are appended to its text. Lazy: each MoveNext runs one decode step.
        /// </summary>
        public IEnumerable<Piece> Stream(int maxTokens, Sampling? sampling = null)
        {
            var detok = new Detokenizer(model, last);
            for (int i = 0; i < maxTokens; i++)
            {
                int tok = DecodeStep(sampling);
                if (Native.llm_token_is_eog(model.DangerousGetHandle(), tok) != 0)
                {
                    string rest = detok.Flush();
                    if (rest.Length > 0) yield return new Piece { Token = tok, Text = rest };
                    yield break;
                }
                string text = detok.Push(tok);
                if (i == maxTokens - 1) text += detok.Flush();
                yield return new Piece { Token = tok, Text = text };
            }
        }

        /// <summary>Tokenizes prompt (with BOS), prefills it now, and streams the continuation.</summary>
        public IEnumerable<Piece> GeneratePieces(string prompt, int maxTokens, Sampling? sampling = null)
        {
            Prefill(Model.Tokenize(model.DangerousGetHandle(), Encoding.UTF8.GetBytes(prompt), 1u));
            return Stream(maxTokens, sampling);
        }

        /// <summary>As GeneratePieces, yielding only the text.</summary>
        public IEnumerable<string> Generate(string prompt, int maxTokens, Sampling? sampling = null)
        {
            return TextOf(GeneratePieces(prompt, maxTokens, sampling));
        }

        private static IEnumerable<string> TextOf(IEnumerable<Piece> pieces)
        {
            foreach (var p in pieces) yield return p.Text;
        }
    }
}
