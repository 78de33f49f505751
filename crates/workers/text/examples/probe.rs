#![allow(clippy::unwrap_used)]
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::token::LlamaToken;
use std::num::NonZeroU32;
use std::time::Instant;

fn main() {
    let mut backend = LlamaBackend::init().unwrap();
    backend.void_logs();
    let path = std::env::args().nth(1).unwrap();
    let model = LlamaModel::load_from_file(&backend, path, &LlamaModelParams::default()).unwrap();
    let ub: u32 = std::env::var("UB").ok().and_then(|v| v.parse().ok()).unwrap_or(512);
    let params = || {
        LlamaContextParams::default()
            .with_n_ctx(NonZeroU32::new(4096))
            .with_n_batch(512)
            .with_n_ubatch(ub)
            .with_n_seq_max(8)
            .with_kv_unified(true)
            .with_n_threads(2)
            .with_n_threads_batch(2)
    };
    let vocab = model.vocab();
    let text = "The history of the city begins in the year 1200, when a small village grew around a river crossing. "
        .repeat(20);
    let prompt: Vec<LlamaToken> = vocab.tokenize(text.as_bytes(), false, true)[..500].to_vec();
    let mut ctx = model.new_context(&backend, params()).unwrap();
    let mut batch = LlamaBatch::new(512, 1);
    // prefill timing
    let t = Instant::now();
    batch.clear();
    for (i, tok) in prompt.iter().enumerate() {
        batch.add(*tok, i as i32, &[0], false).unwrap();
    }
    ctx.decode(&mut batch).unwrap();
    println!(
        "UB={ub} prefill 500 tokens: {:.1} tok/s",
        500.0 / t.elapsed().as_secs_f64()
    );
    // decode timing, k sequences (copies of seq 0's prompt)
    for k in [1usize, 2, 4, 8] {
        for s in 1..k {
            ctx.copy_kv_cache_seq(0, s as i32, None, None).unwrap();
        }
        let steps = 40;
        let t = Instant::now();
        for step in 0..steps {
            batch.clear();
            for s in 0..k {
                batch.add(prompt[step], (500 + step) as i32, &[s as i32], true).unwrap();
            }
            ctx.decode(&mut batch).unwrap();
        }
        let el = t.elapsed().as_secs_f64();
        println!(
            "  {k} seqs: {:.2} ms/step, {:.1} tok/s aggregate",
            el * 1000.0 / steps as f64,
            (steps * k) as f64 / el
        );
        for s in 0..k {
            ctx.clear_kv_cache_seq(Some(s as u32), Some(500), None).unwrap();
        }
        for s in 1..k {
            ctx.clear_kv_cache_seq(Some(s as u32), None, None).unwrap();
        }
    }
}
