//! End-to-end tests of the safe wrapper against the real library and the
//! stories260K reference vectors (case 0 of reference/stories260K_greedy.json,
//! produced by llama2.c run.c; copied here as test data).
use libllm::{
    sys, Device, Grammar, LoadParams, Model, PrefillStep, Sampling, Session, SessionParams, Status, TokenizeFlags,
};
use std::path::PathBuf;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const PROMPT: &str = "Once upon a time";
const PROMPT_IDS: [i32; 5] = [1, 403, 407, 261, 378];
const GENERATED_IDS: [i32; 64] = [
    432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265,
    282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267, 337, 335,
    312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438, 310, 439, 419, 357, 336,
];
const GENERATED_TEXT: &str = ", there was a little girl named Lily. She loved to play outside in the park. One day, \
she saw a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said";

fn models_dir() -> PathBuf {
    match std::env::var_os("LLM_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models"),
    }
}

fn stories() -> Model {
    // One compute thread each: the tests already run in parallel on small CI machines.
    let path = models_dir().join("stories260K.gguf");
    Model::load_with(&path, LoadParams::new().device(Device::Cpu).n_threads(1))
        .unwrap_or_else(|e| panic!("loading {}: {}", path.display(), e))
}

fn greedy_ids(session: &mut Session, n: usize) -> Vec<i32> {
    (0..n)
        .map(|_| session.decode_step(&Sampling::greedy()).unwrap())
        .collect()
}

#[test]
fn version_matches_header() {
    assert_eq!(libllm::version(), sys::LLM_VERSION_NUMBER);
    assert_eq!(
        libllm::version_string(),
        format!(
            "{}.{}.{}",
            sys::LLM_VERSION_MAJOR,
            sys::LLM_VERSION_MINOR,
            sys::LLM_VERSION_PATCH
        )
    );
}

#[test]
fn struct_layouts_match_c() {
    // x86-64 / LP64 values, the same ones tests/abi/layout_test.cpp pins for C.
    use std::mem::size_of;
    assert_eq!(size_of::<sys::llm_load_params>(), 64);
    assert_eq!(size_of::<sys::llm_model_properties>(), 112);
    assert_eq!(size_of::<sys::llm_detok_state>(), 16);
    assert_eq!(size_of::<sys::llm_session_params>(), 40);
    assert_eq!(size_of::<sys::llm_sampling>(), 48);
    assert_eq!(size_of::<sys::llm_session_stats_t>(), 80);
    assert_eq!(size_of::<sys::llm_chat_message>(), 16);
    assert_eq!(size_of::<sys::llm_chat_params>(), 24);
}

#[test]
fn model_is_send_sync_session_is_send() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Model>();
    send::<Session>();
}

#[test]
fn reference_greedy_continuation() {
    let model = stories();
    let info = model.info().unwrap();
    assert_eq!(info.vocab_size, 512);
    assert_eq!(info.n_layers, 5);
    assert_eq!(info.dim, 64);
    assert_eq!(info.architecture, "llama");
    assert_eq!(info.bos, Some(1));

    let prompt = model.tokenize(PROMPT, true).unwrap();
    assert_eq!(prompt, PROMPT_IDS);
    assert_eq!(model.detokenize(&prompt).unwrap(), PROMPT);

    let mut session = model.session().unwrap();
    session.prefill(&prompt).unwrap();
    {
        let logits = session.logits().unwrap();
        assert_eq!(logits.len(), 512);
        let argmax = (0..logits.len()).fold(0, |best, i| if logits[i] > logits[best] { i } else { best });
        assert_eq!(argmax as i32, GENERATED_IDS[0]);
    }
    assert_eq!(greedy_ids(&mut session, 64), GENERATED_IDS);
    let stats = session.stats().unwrap();
    assert_eq!(stats.n_prompt, 5);
    assert_eq!(stats.n_generated, 64);
    assert_eq!(stats.n_tokens, 69);

    // Same continuation through the streaming iterator, after a reset.
    session.reset().unwrap();
    let mut ids = Vec::new();
    let mut text = String::new();
    for piece in session.generate(PROMPT, 64, Sampling::greedy()).unwrap() {
        let piece = piece.unwrap();
        ids.push(piece.token);
        text.push_str(&piece.text);
    }
    assert_eq!(ids, GENERATED_IDS);
    assert_eq!(text, GENERATED_TEXT);
    assert_eq!(model.detokenize(&GENERATED_IDS).unwrap(), GENERATED_TEXT);
}

#[test]
fn sessions_on_threads_share_one_model() {
    let model = stories();
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let model = model.clone();
            std::thread::spawn(move || {
                let mut s = model.session().unwrap();
                s.prefill(&PROMPT_IDS).unwrap();
                greedy_ids(&mut s, 24)
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), GENERATED_IDS[..24]);
    }
    // A session created here can move to another thread (Send).
    let mut s = model.session().unwrap();
    s.prefill(&PROMPT_IDS).unwrap();
    let ids = std::thread::spawn(move || greedy_ids(&mut s, 8)).join().unwrap();
    assert_eq!(ids, GENERATED_IDS[..8]);
}

#[test]
fn session_keeps_model_alive() {
    let model = stories();
    let mut s = model.session().unwrap();
    drop(model); // the session's reference keeps the C model alive
    s.prefill(&PROMPT_IDS).unwrap();
    assert_eq!(greedy_ids(&mut s, 4), GENERATED_IDS[..4]);
    assert_eq!(s.model().tokenize(PROMPT, true).unwrap(), PROMPT_IDS);
}

#[test]
fn errors_carry_status_and_message() {
    let missing = models_dir().join("does-not-exist.gguf");
    let err = Model::load(&missing).unwrap_err();
    assert_eq!(err.status(), Status::Io);
    assert!(!err.message().is_empty());
    assert!(err.to_string().contains(err.message()));

    let not_a_model = models_dir().join("README.md");
    let err = Model::load(&not_a_model).unwrap_err();
    assert_eq!(err.status(), Status::Format, "{}", err);

    let model = stories();
    let mut s = model.session().unwrap();
    // Decoding with no token at all is an invalid argument; the session stays usable.
    assert_eq!(
        s.decode_step(&Sampling::greedy()).unwrap_err().status(),
        Status::InvalidArgument
    );
    assert_eq!(s.prefill(&[100_000]).unwrap_err().status(), Status::InvalidArgument);
    s.prefill(&PROMPT_IDS).unwrap();
    assert_eq!(greedy_ids(&mut s, 2), GENERATED_IDS[..2]);
    assert_eq!(s.kv_evict(0, 1000).unwrap_err().status(), Status::InvalidArgument);
}

#[test]
fn vocab_only_model_tokenizes_but_has_no_sessions() {
    let progress_calls = Arc::new(AtomicUsize::new(0));
    let counter = progress_calls.clone();
    let model = Model::load_with(
        models_dir().join("stories260K.gguf"),
        LoadParams::new().vocab_only(true).progress(move |p| {
            assert!((0.0..=1.0).contains(&p));
            counter.fetch_add(1, Ordering::Relaxed);
            true
        }),
    )
    .unwrap();
    assert_eq!(
        model.tokenize_with(PROMPT.as_bytes(), TokenizeFlags::ADD_BOS).unwrap(),
        PROMPT_IDS
    );
    assert_eq!(model.session().unwrap_err().status(), Status::Unsupported);
    let _ = progress_calls.load(Ordering::Relaxed); // progress reporting is optional for tiny files
}

#[test]
fn progress_callback_can_cancel_loading() {
    let mut calls = 0;
    let result = Model::load_with(
        models_dir().join("stories260K.gguf"),
        LoadParams::new().device(Device::Cpu).progress(|_| {
            calls += 1;
            false
        }),
    );
    // A library that reports progress must honour the cancel request.
    if calls > 0 {
        assert_eq!(result.unwrap_err().status(), Status::Cancelled);
    }
}

#[test]
fn detokenizer_holds_back_incomplete_utf8() {
    let model = stories();
    // "ö" is not in the vocabulary: byte fallback gives <0xC3> <0xB6> = ids 198, 185.
    let ids = model.tokenize_with("ö".as_bytes(), TokenizeFlags::NONE).unwrap();
    assert!(ids.ends_with(&[198, 185]), "{:?}", ids);
    let mut d = model.detokenizer(Some(378));
    assert_eq!(d.push(198).unwrap(), "");
    assert_eq!(d.push(185).unwrap(), "ö");
    assert_eq!(d.push(198).unwrap(), "");
    assert_eq!(d.flush().unwrap(), "\u{FFFD}");
}

#[test]
fn fork_and_save_restore_continue_identically() {
    let model = stories();
    let mut s = model.session().unwrap();
    s.prefill(&PROMPT_IDS).unwrap();
    assert_eq!(greedy_ids(&mut s, 10), GENERATED_IDS[..10]);

    let mut fork = s.fork().unwrap();
    let saved = s.save().unwrap();
    assert!(!saved.is_empty());
    assert_eq!(greedy_ids(&mut s, 10), GENERATED_IDS[10..20]);
    // The fork shares the prefix and continues on its own thread.
    let fork_ids = std::thread::spawn(move || greedy_ids(&mut fork, 10)).join().unwrap();
    assert_eq!(fork_ids, GENERATED_IDS[10..20]);

    let mut restored = Session::restore(&model, &saved).unwrap();
    assert_eq!(restored.stats().unwrap().n_tokens, 15);
    assert_eq!(greedy_ids(&mut restored, 10), GENERATED_IDS[10..20]);

    // Damaged bytes are rejected with a status, never a crash.
    let mut bad = saved.clone();
    let mid = bad.len() / 2;
    bad[mid] ^= 0x55;
    let status = Session::restore(&model, &bad).unwrap_err().status();
    assert!(matches!(status, Status::Checksum | Status::Format), "{:?}", status);
    let status = Session::restore(&model, &saved[..saved.len() / 3])
        .unwrap_err()
        .status();
    assert!(matches!(status, Status::Checksum | Status::Format), "{:?}", status);
}

const BATCH_PROMPTS: [&str; 3] = ["Once upon a time", "Lily had a", "Tom and Sam went"];

fn prompted(model: &Model, prompt: &str, params: &SessionParams) -> Session {
    let mut s = model.session_with(params).unwrap();
    s.prefill(&model.tokenize(prompt, true).unwrap()).unwrap();
    s
}

#[test]
fn decode_batch_equals_stepping_each_session_alone() {
    let model = stories();
    let sampling = Sampling {
        temperature: 0.9,
        seed: 5,
        ..Sampling::default()
    };
    let params = SessionParams::new();
    let mut batch: Vec<Session> = BATCH_PROMPTS.iter().map(|p| prompted(&model, p, &params)).collect();
    let mut alone: Vec<Session> = BATCH_PROMPTS.iter().map(|p| prompted(&model, p, &params)).collect();
    let mut streams = vec![Vec::new(); 3];
    for step in 0..20 {
        let mut refs: Vec<&mut Session> = batch.iter_mut().collect();
        let got = Session::decode_batch(&mut refs, &sampling).unwrap();
        assert_eq!(got.len(), 3);
        for (i, s) in alone.iter_mut().enumerate() {
            assert_eq!(got[i], s.decode_step(&sampling).unwrap(), "session {} step {}", i, step);
            streams[i].push(got[i]);
        }
    }
    // Three different prompts sampled at temperature 0.9 give different continuations.
    assert!(streams[0] != streams[1] && streams[1] != streams[2], "{:?}", streams);
    // The streaming text of a batched session starts after its last batched token.
    let last = *streams[0].last().unwrap();
    let mut detok = model.detokenizer(Some(last));
    let next = alone[0].decode_step(&sampling).unwrap();
    let text = batch[0].stream(1, sampling).text().unwrap();
    if !model.is_eog(next) {
        assert_eq!(text, detok.push(next).unwrap() + &detok.flush().unwrap());
    }
    // No sessions: nothing to do.
    assert_eq!(Session::decode_batch(&mut [], &sampling).unwrap(), Vec::<i32>::new());
}

#[test]
fn decode_batch_rejects_duplicates_and_foreign_models() {
    let model = stories();
    let other = stories(); // the same file loaded twice is another C model
    let params = SessionParams::new();
    let mut a = prompted(&model, "Lily had a", &params);
    let mut b = prompted(&other, "Lily had a", &params);
    let mut fresh = prompted(&model, "Lily had a", &params);

    // Safe code cannot name one session twice (see the compile_fail doctest
    // of Session::decode_batch): the C check is reached through the raw handle.
    let raw = a.as_ptr();
    let dup = [raw, raw];
    let mut out = [7, 7];
    let code = unsafe { sys::llm_decode_batch(dup.as_ptr(), 2, ptr::null(), out.as_mut_ptr()) };
    assert_eq!(code, sys::LLM_ERR_INVALID_ARGUMENT);
    assert_eq!(out, [-1, -1]);

    let err = Session::decode_batch(&mut [&mut a, &mut b], &Sampling::greedy()).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(!err.message().is_empty());
    let mut short = [0; 1];
    let err = Session::decode_batch_into(&mut [&mut a, &mut fresh], &Sampling::greedy(), &mut short).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    // Nothing advanced: a's next greedy token is still the first one.
    assert_eq!(
        a.decode_step(&Sampling::greedy()).unwrap(),
        fresh.decode_step(&Sampling::greedy()).unwrap()
    );
}

#[test]
fn decode_batch_failure_keeps_the_tokens_of_advanced_sessions() {
    let model = stories();
    let roomy = SessionParams::new();
    let prompt_len = model.tokenize(BATCH_PROMPTS[1], true).unwrap().len() as u32;
    // Room for the prompt and one pending token: the third step is out of context.
    let tight = SessionParams::new().max_tokens(prompt_len + 1);
    let mut a = prompted(&model, BATCH_PROMPTS[0], &roomy);
    let mut b = prompted(&model, BATCH_PROMPTS[1], &tight);
    let mut c = prompted(&model, BATCH_PROMPTS[2], &roomy);
    let mut twin_a = prompted(&model, BATCH_PROMPTS[0], &roomy);
    let mut twin_c = prompted(&model, BATCH_PROMPTS[2], &roomy);
    let greedy = Sampling::greedy();
    for _ in 0..2 {
        let got = Session::decode_batch(&mut [&mut a, &mut b, &mut c], &greedy).unwrap();
        assert_eq!(got[0], twin_a.decode_step(&greedy).unwrap());
        assert_eq!(got[2], twin_c.decode_step(&greedy).unwrap());
    }
    let mut tokens = [0; 3];
    let err = Session::decode_batch_into(&mut [&mut a, &mut b, &mut c], &greedy, &mut tokens).unwrap_err();
    assert_eq!(err.status(), Status::ContextFull, "{}", err);
    assert_eq!(tokens[0], twin_a.decode_step(&greedy).unwrap()); // a advanced
    assert_eq!(&tokens[1..], &[-1, -1]);
    // c is unchanged: its next token is the one its twin samples now.
    assert_eq!(c.decode_step(&greedy).unwrap(), twin_c.decode_step(&greedy).unwrap());
}

fn hot(seed: u64) -> Sampling<'static> {
    Sampling {
        temperature: 0.9,
        seed,
        ..Sampling::default()
    }
}

#[test]
fn decode_batch_each_uses_each_sessions_sampling() {
    let model = stories();
    let params = SessionParams::new();
    let each = [Sampling::greedy(), hot(5)];
    let mut batch: Vec<Session> = BATCH_PROMPTS[..2]
        .iter()
        .map(|p| prompted(&model, p, &params))
        .collect();
    let mut alone: Vec<Session> = BATCH_PROMPTS[..2]
        .iter()
        .map(|p| prompted(&model, p, &params))
        .collect();
    for step in 0..12 {
        let mut refs: Vec<&mut Session> = batch.iter_mut().collect();
        let got = Session::decode_batch_each(&mut refs, &each).unwrap();
        let want: Vec<i32> = alone
            .iter_mut()
            .zip(&each)
            .map(|(s, sp)| s.decode_step(sp).unwrap())
            .collect();
        assert_eq!(got, want, "step {}", step);
    }
    let (x, y) = batch.split_at_mut(1);
    let err = Session::decode_batch_each(&mut [&mut x[0], &mut y[0]], &each[..1]).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert_eq!(Session::decode_batch_each(&mut [], &[]).unwrap(), Vec::<i32>::new());
}

#[test]
fn decode_batch_prefill_joins_running_sessions() {
    let model = stories();
    let params = SessionParams::new();
    let each = [Sampling::greedy(), hot(5), Sampling::greedy(), hot(11)];
    let mut running: Vec<Session> = BATCH_PROMPTS.iter().map(|p| prompted(&model, p, &params)).collect();
    let mut twins: Vec<Session> = BATCH_PROMPTS.iter().map(|p| prompted(&model, p, &params)).collect();
    for ((s, t), sp) in running.iter_mut().zip(twins.iter_mut()).zip(&each) {
        assert_eq!(s.decode_step(sp).unwrap(), t.decode_step(sp).unwrap());
    }
    let new_prompt = model.tokenize("The little dog", true).unwrap();
    running.push(model.session().unwrap());
    twins.push(prompted(&model, "The little dog", &params));
    for step in 0..8 {
        // The first call brings the new session's prompt, the later ones only step.
        let prompt: &[i32] = if step == 0 { &new_prompt } else { &[] };
        let steps: Vec<PrefillStep> = each
            .iter()
            .enumerate()
            .map(|(i, sp)| PrefillStep {
                prompt: if i == 3 { prompt } else { &[] },
                sample: true,
                sampling: *sp,
            })
            .collect();
        let mut refs: Vec<&mut Session> = running.iter_mut().collect();
        let got = Session::decode_batch_prefill(&mut refs, &steps).unwrap();
        let want: Vec<i32> = twins
            .iter_mut()
            .zip(&each)
            .map(|(s, sp)| s.decode_step(sp).unwrap())
            .collect();
        assert_eq!(got, want, "step {}", step);
    }
    assert_eq!(running[3].stats().unwrap().n_prompt as usize, new_prompt.len());
}

#[test]
fn decode_batch_prefill_in_chunks() {
    let model = stories();
    let params = SessionParams::new();
    let mut a = prompted(&model, BATCH_PROMPTS[0], &params);
    let mut twin_a = prompted(&model, BATCH_PROMPTS[0], &params);
    let prompt = model.tokenize("Tom and Sam went to the park", true).unwrap();
    let mut new = model.session().unwrap();
    let mut twin = prompted(&model, "Tom and Sam went to the park", &params);
    let greedy = Sampling::greedy();
    let chunk = [
        PrefillStep::default(),
        PrefillStep {
            prompt: &prompt[..3],
            sample: false,
            sampling: hot(5),
        },
    ];
    let got = Session::decode_batch_prefill(&mut [&mut a, &mut new], &chunk).unwrap();
    assert_eq!(got, vec![twin_a.decode_step(&greedy).unwrap(), -1]);
    assert_eq!(new.stats().unwrap().n_tokens, 3);
    let rest = [
        PrefillStep::default(),
        PrefillStep {
            prompt: &prompt[3..],
            sample: true,
            sampling: hot(5),
        },
    ];
    let got = Session::decode_batch_prefill(&mut [&mut a, &mut new], &rest).unwrap();
    assert_eq!(
        got,
        vec![twin_a.decode_step(&greedy).unwrap(), twin.decode_step(&hot(5)).unwrap()]
    );
    // The stream continues after the sampled token.
    let ids: Vec<i32> = new.stream(4, hot(5)).map(|p| p.unwrap().token).collect();
    let want: Vec<i32> = (0..4).map(|_| twin.decode_step(&hot(5)).unwrap()).collect();
    assert_eq!(ids, want);
}

#[test]
fn decode_batch_prefill_rejects_a_bad_token_before_anything_moves() {
    let model = stories();
    let params = SessionParams::new();
    let mut a = prompted(&model, BATCH_PROMPTS[0], &params);
    let mut twin_a = prompted(&model, BATCH_PROMPTS[0], &params);
    let mut new = model.session().unwrap();
    let bad = [1, 100_000];
    let steps = [
        PrefillStep::default(),
        PrefillStep {
            prompt: &bad,
            ..PrefillStep::default()
        },
    ];
    let mut tokens = [7, 7];
    let err = Session::decode_batch_prefill_into(&mut [&mut a, &mut new], &steps, &mut tokens).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument, "{}", err);
    assert_eq!(tokens, [-1, -1]);
    assert_eq!(new.stats().unwrap().n_tokens, 0);
    let greedy = Sampling::greedy();
    assert_eq!(a.decode_step(&greedy).unwrap(), twin_a.decode_step(&greedy).unwrap());
    let err = Session::decode_batch_prefill(&mut [&mut a, &mut new], &steps[..1]).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
}

#[test]
fn decode_batch_prefill_failure_keeps_the_tokens_of_advanced_sessions() {
    let model = stories();
    let roomy = SessionParams::new();
    let prompt_len = model.tokenize(BATCH_PROMPTS[1], true).unwrap().len() as u32;
    // b has room for its prompt and one more token: a 4-token chunk does not fit.
    let tight = SessionParams::new().max_tokens(prompt_len + 1);
    let mut a = prompted(&model, BATCH_PROMPTS[0], &roomy);
    let mut b = prompted(&model, BATCH_PROMPTS[1], &tight);
    let mut c = prompted(&model, BATCH_PROMPTS[2], &roomy);
    let mut twin_a = prompted(&model, BATCH_PROMPTS[0], &roomy);
    let mut twin_c = prompted(&model, BATCH_PROMPTS[2], &roomy);
    let chunk = [10, 11, 12, 13];
    let steps = [
        PrefillStep::default(),
        PrefillStep {
            prompt: &chunk,
            ..PrefillStep::default()
        },
        PrefillStep::default(),
    ];
    let mut tokens = [0; 3];
    let err = Session::decode_batch_prefill_into(&mut [&mut a, &mut b, &mut c], &steps, &mut tokens).unwrap_err();
    assert_eq!(err.status(), Status::ContextFull, "{}", err);
    let greedy = Sampling::greedy();
    assert_eq!(tokens, [twin_a.decode_step(&greedy).unwrap(), -1, -1]);
    assert_eq!(c.decode_step(&greedy).unwrap(), twin_c.decode_step(&greedy).unwrap());
}

#[test]
fn decode_batch_prefill_with_a_grammar() {
    let model = stories();
    let params = SessionParams::new();
    let g = Grammar::new(&model, r#"root ::= ("yes" | "no") ".""#).unwrap();
    let each = [
        Sampling::greedy(),
        Sampling {
            grammar: Some(&g),
            ..hot(5)
        },
    ];
    let mut a = prompted(&model, BATCH_PROMPTS[0], &params);
    let mut new = model.session().unwrap();
    let mut twins = [
        prompted(&model, BATCH_PROMPTS[0], &params),
        prompted(&model, BATCH_PROMPTS[1], &params),
    ];
    let prompt = model.tokenize(BATCH_PROMPTS[1], true).unwrap();
    for step in 0..4 {
        let steps = [
            PrefillStep {
                sampling: each[0],
                ..PrefillStep::default()
            },
            PrefillStep {
                prompt: if step == 0 { &prompt } else { &[] },
                sample: true,
                sampling: each[1],
            },
        ];
        let got = Session::decode_batch_prefill(&mut [&mut a, &mut new], &steps).unwrap();
        let want: Vec<i32> = twins
            .iter_mut()
            .zip(&each)
            .map(|(s, sp)| s.decode_step(sp).unwrap())
            .collect();
        assert_eq!(got, want, "step {}", step);
    }
}
