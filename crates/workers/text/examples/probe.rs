#![allow(clippy::unwrap_used)]
use std::num::NonZeroU32;
use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;

fn main() {
    let mut backend = LlamaBackend::init().unwrap();
    backend.void_logs();
    let path = std::env::args().nth(1).unwrap();
    let model = LlamaModel::load_from_file(&backend, path, &LlamaModelParams::default()).unwrap();
    let th: i32 = std::env::var("TH").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let params = || LlamaContextParams::default().with_n_ctx(NonZeroU32::new(2048)).with_n_batch(512).with_n_seq_max(16).with_kv_unified(true).with_n_threads(th).with_n_threads_batch(th);
    let vocab = model.vocab();
    let p1 = vocab.tokenize(b"Say hello in French. The answer is", false, true);
    let other = vocab.tokenize(b"Write a haiku about the sea, please, with many words in it", false, true);
    let mut ctx = model.new_context(&backend, params()).unwrap();
    let mut batch = LlamaBatch::new(512, 1);
    let diff = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    let mut reference: Vec<f32> = Vec::new();
    for k in 0..12usize {
        ctx.clear_kv_cache();
        // prefill p1 prefix (seq 0) and other sequences' prompts separately
        batch.clear();
        for (i, t) in p1[..p1.len()-1].iter().enumerate() { batch.add(*t, i as i32, &[0], false).unwrap(); }
        ctx.decode(&mut batch).unwrap();
        for s in 1..=k {
            batch.clear();
            for (i, t) in other.iter().enumerate() { batch.add(*t, i as i32, &[s as i32], false).unwrap(); }
            ctx.decode(&mut batch).unwrap();
        }
        // one decode step with p1's last token + one token per other seq
        batch.clear();
        batch.add(*p1.last().unwrap(), p1.len() as i32 - 1, &[0], true).unwrap();
        for s in 1..=k { batch.add(other[0], other.len() as i32, &[s as i32], true).unwrap(); }
        ctx.decode(&mut batch).unwrap();
        let l = ctx.get_logits_ith(0).to_vec();
        if k == 0 { reference = l.clone(); }
        println!("TH={th} k={k}: max diff {}", diff(&reference, &l));
    }
}
