//! Streams a story: `cargo run --example stream -- [model.gguf] [prompt] [max_tokens]`.
use libllm::{Model, Sampling};
use std::io::Write;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let model_path = args.next().unwrap_or_else(|| {
        let dir = std::env::var("LLM_MODELS_DIR").unwrap_or_else(|_| ".".into());
        format!("{}/stories260K.gguf", dir)
    });
    let prompt = args.next().unwrap_or_else(|| "Once upon a time".into());
    let max_tokens: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(200);

    let model = Model::load(&model_path)?;
    let mut session = model.session()?;
    let sampling = Sampling {
        temperature: 0.8,
        top_p: 0.95,
        seed: 42,
        ..Sampling::default()
    };

    let mut out = std::io::stdout().lock();
    write!(out, "{}", prompt)?;
    for piece in session.generate(&prompt, max_tokens, sampling)? {
        write!(out, "{}", piece?.text)?;
        out.flush()?;
    }
    writeln!(out)?;
    let stats = session.stats()?;
    eprintln!("ttft {:.2} ms, {:.1} tokens/s", stats.ttft_ms, stats.gen_tokens_per_s);
    Ok(())
}
