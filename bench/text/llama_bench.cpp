// gantry-llama-bench: llama.cpp's prompt-processing (pp) and token-generation
// (tg) throughput, measured the way upstream's llama-bench measures it, for
// when the llama.cpp tree at hand does not ship llama-bench's source (the copy
// vendored in llama-cpp-sys-2 does not).
//
//   gantry-llama-bench -m MODEL.gguf [-t 2] [-p 100] [-n 128] [-r 3] [-ngl 0]
//                      [-d 0] [-b 2048] [-ub 512] [--poll 50] [--no-threadpool] [-o json|md]
//
// Method (as upstream): two tests, pp<p> and tg<n>, each in a fresh context of
// p+n cells. pp decodes p random tokens (BOS first where the model adds one)
// in batches of b; tg decodes n single tokens, one llama_decode each, from an
// empty cache, or, with -d D, after D prompt tokens (decoded untimed before
// each run, as upstream's -d does), so that generation attends to as many
// cells as a served request's does after its prompt. One untimed warm-up run
// per test, then r timed runs, each after clearing the cache; tokens/s =
// tokens / wall time of the run. Threads run in
// a ggml threadpool attached to the context with the given polling level, as
// upstream does (--no-threadpool leaves ggml to make one per graph, as a
// llama.cpp user that attaches none gets).
//
// --npl 4,16 adds, beyond upstream, tg<n>@npl<k>: n steps that each decode
// one token for each of k sequences in one batch (unified KV cache of k*n
// cells), as a server batching k streams does; its t/s counts all k
// sequences' tokens (upstream's llama-batched-bench measures the same).

#include "ggml-cpu.h"
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

static void log_cb(ggml_log_level level, const char * text, void *) {
    static ggml_log_level last = GGML_LOG_LEVEL_INFO;  // CONT continues the previous line's level
    if (level != GGML_LOG_LEVEL_CONT) {
        last = level;
    }
    if (last >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

static bool decode_prompt(llama_context * ctx, const llama_vocab * vocab, int n_prompt, int n_batch) {
    const int n_vocab = llama_vocab_n_tokens(vocab);
    std::vector<llama_token> tokens(n_batch);
    int done = 0;
    while (done < n_prompt) {
        int n = std::min(n_batch, n_prompt - done);
        for (int i = 0; i < n; i++) {
            tokens[i] = (done == 0 && i == 0 && llama_vocab_get_add_bos(vocab)) ? llama_vocab_bos(vocab)
                                                                                 : std::rand() % n_vocab;
        }
        if (llama_decode(ctx, llama_batch_get_one(tokens.data(), n)) != 0) {
            return false;
        }
        done += n;
    }
    llama_synchronize(ctx);
    return true;
}

static bool decode_gen(llama_context * ctx, const llama_vocab * vocab, int n_gen) {
    const int n_vocab = llama_vocab_n_tokens(vocab);
    llama_token token = llama_vocab_get_add_bos(vocab) ? llama_vocab_bos(vocab) : std::rand() % n_vocab;
    for (int i = 0; i < n_gen; i++) {
        if (llama_decode(ctx, llama_batch_get_one(&token, 1)) != 0) {
            return false;
        }
        llama_synchronize(ctx);
        token = std::rand() % n_vocab;
    }
    return true;
}

// n_gen steps that each decode one token for every one of n_par sequences
// (sequence s at position step), as a server batching n_par streams does.
static bool decode_gen_parallel(llama_context * ctx, const llama_vocab * vocab, int n_gen, int n_par) {
    const int n_vocab = llama_vocab_n_tokens(vocab);
    llama_batch batch = llama_batch_init(n_par, 0, 1);
    bool ok = true;
    for (int step = 0; ok && step < n_gen; step++) {
        batch.n_tokens = n_par;
        for (int s = 0; s < n_par; s++) {
            batch.token[s]     = (step == 0 && llama_vocab_get_add_bos(vocab)) ? llama_vocab_bos(vocab)
                                                                               : std::rand() % n_vocab;
            batch.pos[s]       = step;
            batch.n_seq_id[s]  = 1;
            batch.seq_id[s][0] = s;
            batch.logits[s]    = true;
        }
        ok = llama_decode(ctx, batch) == 0;
        llama_synchronize(ctx);
    }
    llama_batch_free(batch);
    return ok;
}

struct result {
    std::string name;
    int n_prompt, n_gen, n_par, n_depth;
    std::vector<double> ts;  // tokens per second, one per run
    std::vector<double> ns;  // run wall time
};

static void usage() {
    fprintf(stderr,
            "usage: gantry-llama-bench -m MODEL.gguf [-t 2] [-p 100] [-n 128] [-r 3] [-ngl 0] [-d 0] [-b 2048] [-ub 512]\n"
            "                          [--poll 50] [--no-threadpool] [--npl 4,16] [-c N] [--seq-max N] [-o json|md]\n"
            "  -d decodes that many prompt tokens (untimed) before each tg run\n"
            "  -c and --seq-max give every context that many KV cells and sequences (default: just\n"
            "  enough for the test), to decode in the geometry a serving context has\n");
    exit(2);
}

int main(int argc, char ** argv) {
    std::string model_path, output = "md";
    int threads = 2, n_prompt = 100, n_gen = 128, reps = 3, n_batch = 2048, n_ubatch = 512, poll = 50;
    int n_ctx_all = 0, n_seq_all = 0, depth = 0, n_gpu_layers = 0;
    bool use_threadpool = true;
    std::vector<int> parallel;  // extra tg tests with this many sequences decoded together
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto val = [&]() -> const char * {
            if (i + 1 >= argc) {
                usage();
            }
            return argv[++i];
        };
        if (a == "-m") {
            model_path = val();
        } else if (a == "-ngl") {
            n_gpu_layers = atoi(val());
        } else if (a == "-t") {
            threads = atoi(val());
        } else if (a == "-p") {
            n_prompt = atoi(val());
        } else if (a == "-n") {
            n_gen = atoi(val());
        } else if (a == "-r") {
            reps = atoi(val());
        } else if (a == "-d") {
            depth = atoi(val());
        } else if (a == "-b") {
            n_batch = atoi(val());
        } else if (a == "-ub") {
            n_ubatch = atoi(val());
        } else if (a == "--poll") {
            poll = atoi(val());
        } else if (a == "-c") {
            n_ctx_all = atoi(val());
        } else if (a == "--seq-max") {
            n_seq_all = atoi(val());
        } else if (a == "--no-threadpool") {
            use_threadpool = false;
        } else if (a == "--npl") {
            std::string list = val();
            for (size_t pos = 0; pos < list.size();) {
                size_t end = list.find(',', pos);
                end        = end == std::string::npos ? list.size() : end;
                int n      = atoi(list.substr(pos, end - pos).c_str());
                if (n > 1) {
                    parallel.push_back(n);
                }
                pos = end + 1;
            }
        } else if (a == "-o") {
            output = val();
        } else {
            usage();
        }
    }
    if (model_path.empty() || threads <= 0 || reps <= 0 || n_prompt < 0 || n_gen < 0 || depth < 0) {
        usage();
    }

    llama_log_set(log_cb, nullptr);
    llama_backend_init();
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers       = n_gpu_layers;  // layers offloaded in a build with a GPU backend
    llama_model * model        = llama_model_load_from_file(model_path.c_str(), mparams);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", model_path.c_str());
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    char desc[256];
    llama_model_desc(model, desc, sizeof desc);

    ggml_threadpool * pool = nullptr;
    if (use_threadpool) {
        ggml_threadpool_params tpp = ggml_threadpool_params_default(threads);
        tpp.poll                   = poll;
        pool                       = ggml_threadpool_new(&tpp);
        if (!pool) {
            fprintf(stderr, "cannot create a threadpool\n");
            return 1;
        }
    }

    std::vector<result> results;
    for (int test = 0; test < 2 + (int) parallel.size(); test++) {
        const int p   = test == 0 ? n_prompt : 0;
        const int g   = test == 0 ? 0 : n_gen;
        const int par = test < 2 ? 1 : parallel[test - 2];
        const int d   = test == 1 ? depth : 0;  // depth for the single-sequence tg test
        if (p + g == 0) {
            continue;
        }
        llama_context_params cparams = llama_context_default_params();
        cparams.n_ctx                = std::max(n_ctx_all, (p + g + d) * par);
        cparams.n_seq_max            = std::max(n_seq_all, par);
        cparams.kv_unified           = true;
        cparams.n_batch              = n_batch;
        cparams.n_ubatch             = n_ubatch;
        cparams.n_threads            = threads;
        cparams.n_threads_batch      = threads;
        cparams.no_perf              = true;
        llama_context * ctx          = llama_init_from_model(model, cparams);
        if (!ctx) {
            fprintf(stderr, "cannot create a context\n");
            return 1;
        }
        if (pool) {
            llama_attach_threadpool(ctx, pool, pool);
        }
        llama_memory_t mem = llama_get_memory(ctx);

        // warm-up
        auto run = [&](int n) {
            return p ? decode_prompt(ctx, vocab, p, n_batch)
                     : (par > 1 ? decode_gen_parallel(ctx, vocab, n, par) : decode_gen(ctx, vocab, n));
        };
        bool ok = run(1);
        std::string name = p ? "pp" + std::to_string(p) : "tg" + std::to_string(g);
        if (par > 1) {
            name += "@npl" + std::to_string(par);
        }
        if (d > 0) {
            name += "@d" + std::to_string(d);
        }
        result r{ name, p, g, par, d, {}, {} };
        for (int rep = 0; ok && rep < reps; rep++) {
            llama_memory_clear(mem, false);
            ok = d == 0 || decode_prompt(ctx, vocab, d, n_batch);
            if (!ok) {
                break;
            }
            auto t0 = std::chrono::steady_clock::now();
            ok      = run(g);
            double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
            r.ns.push_back(ns);
            r.ts.push_back((double) (p + g) * par / (ns / 1e9));  // all sequences' tokens
        }
        llama_free(ctx);
        if (!ok) {
            fprintf(stderr, "llama_decode failed\n");
            return 1;
        }
        results.push_back(r);
    }

    auto mean = [](const std::vector<double> & v) {
        double s = 0;
        for (double x : v) {
            s += x;
        }
        return s / v.size();
    };
    auto stdev = [&](const std::vector<double> & v) {
        if (v.size() < 2) {
            return 0.0;
        }
        double m = mean(v), s = 0;
        for (double x : v) {
            s += (x - m) * (x - m);
        }
        return std::sqrt(s / (v.size() - 1));
    };

    if (output == "json") {
        printf("[\n");
        for (size_t i = 0; i < results.size(); i++) {
            const result & r = results[i];
            printf("  {\"tool\": \"gantry-llama-bench\", \"llama_cpp_source\": \"%s\", \"model_desc\": \"%s\", "
                   "\"model_size\": %llu, \"model_n_params\": %llu, \"n_threads\": %d, \"threadpool\": %s, "
                   "\"poll\": %d, \"n_batch\": %d, \"n_ubatch\": %d, \"test\": \"%s\", \"n_prompt\": %d, "
                   "\"n_gen\": %d, \"n_parallel\": %d, \"n_depth\": %d, \"avg_ns\": %.0f, \"stddev_ns\": %.0f, \"avg_ts\": %.3f, \"stddev_ts\": %.3f, "
                   "\"samples_ts\": [",
                   GANTRY_LLAMA_SOURCE_ID, desc, (unsigned long long) llama_model_size(model),
                   (unsigned long long) llama_model_n_params(model), threads, pool ? "true" : "false", poll, n_batch,
                   n_ubatch, r.name.c_str(), r.n_prompt, r.n_gen, r.n_par, r.n_depth, mean(r.ns), stdev(r.ns), mean(r.ts), stdev(r.ts));
            for (size_t k = 0; k < r.ts.size(); k++) {
                printf("%s%.3f", k ? ", " : "", r.ts[k]);
            }
            printf("], \"system_info\": \"%s\"}%s\n", llama_print_system_info(), i + 1 < results.size() ? "," : "");
        }
        printf("]\n");
    } else {
        printf("| model | threads | test | t/s |\n| --- | ---: | ---: | ---: |\n");
        for (const result & r : results) {
            printf("| %s | %d | %s | %.2f ± %.2f |\n", desc, threads, r.name.c_str(), mean(r.ts), stdev(r.ts));
        }
    }

    if (pool) {
        ggml_threadpool_free(pool);
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
