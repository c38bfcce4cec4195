//! Chat templates, grammars and text streams with stops (the 0.2 API) on
//! stories260K, which has no chat template of its own.
use libllm::{
    chat_render, json_schema_to_gbnf, ChatMessage, Device, Grammar, LoadParams, Model, Sampling, Status, Token,
};
use std::path::PathBuf;
use std::sync::Arc;

const PROMPT: &str = "Once upon a time";
const PROMPT_IDS: [i32; 5] = [1, 403, 407, 261, 378];
const GENERATED_IDS: [i32; 24] = [
    432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265,
    282,
];
/// A ChatML-like template in the subset llm_chat_render runs.
const CHATML: &str =
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n\
{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
const YES_NO: &str = r#"root ::= ("yes" | "no") ".""#;

fn models_dir() -> PathBuf {
    match std::env::var_os("LLM_MODELS_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/models"),
    }
}

fn stories() -> Model {
    let path = models_dir().join("stories260K.gguf");
    Model::load_with(&path, LoadParams::new().device(Device::Cpu).n_threads(1))
        .unwrap_or_else(|e| panic!("loading {}: {}", path.display(), e))
}

fn messages() -> Vec<ChatMessage> {
    vec![ChatMessage::system("Be brief."), ChatMessage::user("Hi!")]
}

/// Tokens after `prompt` up to and including an end-of-generation token.
fn generate(model: &Model, prompt: &str, sampling: &Sampling, max_tokens: usize) -> Vec<Token> {
    let mut s = model.session().unwrap();
    s.prefill(&model.tokenize(prompt, true).unwrap()).unwrap();
    let mut ids = Vec::new();
    while ids.len() < max_tokens {
        let t = s.decode_step(sampling).unwrap();
        ids.push(t);
        if model.is_eog(t) {
            break;
        }
    }
    ids
}

#[test]
fn render_without_model() {
    let text = chat_render(&messages(), CHATML, true).unwrap();
    assert_eq!(
        text,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    );
    assert!(!chat_render(&messages(), CHATML, false)
        .unwrap()
        .ends_with("assistant\n"));
    let err = chat_render(&messages(), "{% for m in messages %}{{ m['role'] }", true).unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
}

#[test]
fn render_with_model() {
    let model = stories();
    let template = format!("{{{{ bos_token }}}}{}{{{{ eos_token }}}}", CHATML);
    let text = model.chat_render(&messages(), true, Some(&template)).unwrap();
    assert!(text.starts_with("<s><s><|im_start|>system\n"), "{}", text);
    assert!(text.ends_with("<|im_start|>assistant\n</s>"), "{}", text);
    // A long conversation takes the buffer-too-small path.
    let many = vec![ChatMessage::user("x".repeat(1000)); 20];
    assert_eq!(
        model.chat_render(&many, true, Some(CHATML)).unwrap().len(),
        3 + 20 * (17 + 1000 + 11) + 22
    );
}

#[test]
fn model_without_template_is_unsupported() {
    let model = stories();
    assert_eq!(model.chat_template().unwrap_err().status(), Status::Unsupported);
    assert_eq!(
        model.chat_render(&messages(), true, None).unwrap_err().status(),
        Status::Unsupported
    );
}

#[test]
fn yes_no_grammar() {
    let model = stories();
    let grammar = Grammar::new(&model, YES_NO).unwrap();
    let sampling = Sampling {
        grammar: Some(&grammar),
        ..Sampling::greedy()
    };
    let ids = generate(&model, PROMPT, &sampling, 32);
    assert!(model.is_eog(*ids.last().unwrap()), "{:?}", ids);
    let text = model.detokenize(&ids[..ids.len() - 1]).unwrap();
    assert!(text.trim() == "yes." || text.trim() == "no.", "{:?}", text);

    // One grammar shared by threads through an Arc.
    let shared = Arc::new(grammar);
    let handles: Vec<_> = (0..2u64)
        .map(|seed| {
            let (model, grammar) = (model.clone(), shared.clone());
            std::thread::spawn(move || {
                let sampling = Sampling {
                    grammar: Some(&grammar),
                    temperature: 1.0,
                    seed,
                    ..Sampling::default()
                };
                let ids = generate(&model, "Lily", &sampling, 32);
                model.detokenize(&ids[..ids.len() - 1]).unwrap()
            })
        })
        .collect();
    for h in handles {
        let text = h.join().unwrap();
        assert!(text.trim() == "yes." || text.trim() == "no.", "{:?}", text);
    }
}

#[test]
fn json_schema_grammar() {
    let schema = r#"{"type": "object", "properties": {"ok": {"type": "boolean"},
        "name": {"type": "string", "maxLength": 6}}, "required": ["ok", "name"], "additionalProperties": false}"#;
    assert!(json_schema_to_gbnf(schema).unwrap().contains("root"));
    let model = stories();
    let grammar = Grammar::from_json_schema(&model, schema).unwrap();
    let ids = generate(
        &model,
        PROMPT,
        &Sampling {
            grammar: Some(&grammar),
            ..Sampling::greedy()
        },
        200,
    );
    assert!(model.is_eog(*ids.last().unwrap()), "{:?}", ids);
    let text = model.detokenize(&ids[..ids.len() - 1]).unwrap();
    // The crate has no JSON parser: check the shape the schema allows.
    let t = text.trim();
    assert!(t.starts_with('{') && t.ends_with('}'), "{:?}", t);
    assert!(t.contains("\"ok\"") && t.contains("\"name\""), "{:?}", t);
    assert!(t.contains("true") || t.contains("false"), "{:?}", t);
}

#[test]
fn grammar_errors() {
    let model = stories();
    let err = Grammar::new(&model, "root ::= \"a\"\nitem ::= ( \"b\"").unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(err.message().contains("line 2"), "{}", err.message());
    let err = Grammar::from_json_schema(&model, "{\"type\": ").unwrap_err();
    assert_eq!(err.status(), Status::InvalidArgument);
    assert!(Grammar::with_root(&model, "start ::= \"x\"", "start").is_ok());
    assert_eq!(
        Grammar::new(&model, "root ::= \"a\0\"").unwrap_err().status(),
        Status::InvalidArgument
    );
}

#[test]
fn stop_string_across_tokens() {
    let model = stories();
    let all: Vec<Token> = PROMPT_IDS.iter().chain(GENERATED_IDS.iter()).copied().collect();
    let text = model.detokenize(&all).unwrap()[PROMPT.len()..].to_string();
    // A stop string that begins inside the 10th piece and ends inside the 11th.
    let cut = model.detokenize(&all[..PROMPT_IDS.len() + 10]).unwrap().len() - PROMPT.len();
    let stop = &text[cut - 2..cut + 2];
    let want = &text[..text.find(stop).unwrap()];

    let mut stream = model.stop_stream(&[stop, "never seen"]).unwrap();
    let mut got = String::new();
    for &t in GENERATED_IDS.iter() {
        let (piece, stopped) = stream.push(t).unwrap();
        got.push_str(&piece);
        if stopped {
            break;
        }
    }
    assert!(stream.is_stopped());
    assert_eq!(got, want);
    assert_eq!(stream.push(GENERATED_IDS[0]).unwrap(), (String::new(), true));

    stream.reset().unwrap();
    let mut got = String::new();
    for &t in &GENERATED_IDS[..5] {
        got.push_str(&stream.push(t).unwrap().0);
    }
    got.push_str(&stream.flush().unwrap());
    let five = model.detokenize(&all[..PROMPT_IDS.len() + 5]).unwrap();
    assert_eq!(got, &five[PROMPT.len()..]);

    let eos = model.info().unwrap().eos.unwrap();
    let mut plain = model.stop_stream::<&str>(&[]).unwrap();
    assert_eq!(plain.push(eos).unwrap(), (String::new(), true));
    assert_eq!(model.stop_stream(&[""]).unwrap_err().status(), Status::InvalidArgument);
}
