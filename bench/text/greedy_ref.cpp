// gantry-greedy-ref: greedy (argmax) continuation of raw prompts with plain
// llama.cpp, printed as JSON. The reference the text worker's tests compare
// against (tests/fixtures/smollm2-greedy-llama-cpp.json).
//
//   gantry-greedy-ref -m MODEL.gguf [-n 32] [-t 1] [-v] PROMPT [PROMPT ...]
//
// Each prompt is tokenized as is, as llama-simple and the worker's
// greedy_tokens do (BOS only where the vocabulary's add_bos flag says so,
// special-token text parsed, no chat template),
// evaluated in one batch in a fresh context, then continued one token at a
// time with llama_sampler_init_greedy until n tokens or an end-of-generation
// token (which is not recorded). Single thread by default, so the float sums
// run in one fixed order.

#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static bool g_verbose = false;

static void log_cb(ggml_log_level level, const char * text, void *) {
    static ggml_log_level last = GGML_LOG_LEVEL_INFO;  // CONT continues the previous line's level
    if (level != GGML_LOG_LEVEL_CONT) {
        last = level;
    }
    if (g_verbose || last >= GGML_LOG_LEVEL_ERROR) {
        fputs(text, stderr);
    }
}

// JSON string literal; invalid UTF-8 becomes U+FFFD (and *valid is cleared).
static std::string json_str(const std::string & s, bool * valid = nullptr) {
    std::string out = "\"";
    size_t i = 0;
    while (i < s.size()) {
        unsigned char c = s[i];
        if (c < 0x80) {
            switch (c) {
                case '"':  out += "\\\""; break;
                case '\\': out += "\\\\"; break;
                case '\n': out += "\\n";  break;
                case '\r': out += "\\r";  break;
                case '\t': out += "\\t";  break;
                default:
                    if (c < 0x20) {
                        char buf[8];
                        snprintf(buf, sizeof buf, "\\u%04x", c);
                        out += buf;
                    } else {
                        out += (char) c;
                    }
            }
            i++;
            continue;
        }
        size_t len = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 0;
        bool ok = len > 0 && i + len <= s.size() && c < 0xF5;
        for (size_t k = 1; ok && k < len; k++) {
            ok = ((unsigned char) s[i + k] & 0xC0) == 0x80;
        }
        if (ok) {
            out.append(s, i, len);
            i += len;
        } else {
            out += "\xEF\xBF\xBD";
            if (valid) {
                *valid = false;
            }
            i++;
        }
    }
    return out + "\"";
}

static std::string json_ids(const std::vector<llama_token> & ids) {
    std::string out = "[";
    for (size_t i = 0; i < ids.size(); i++) {
        out += (i ? "," : "") + std::to_string(ids[i]);
    }
    return out + "]";
}

static std::string piece(const llama_vocab * vocab, llama_token t) {
    char buf[256];
    int n = llama_token_to_piece(vocab, t, buf, sizeof buf, 0, false);
    if (n < 0) {
        std::string big(-n, '\0');
        n = llama_token_to_piece(vocab, t, big.data(), (int) big.size(), 0, false);
        return big.substr(0, n);
    }
    return std::string(buf, n);
}

static void usage() {
    fprintf(stderr, "usage: gantry-greedy-ref -m MODEL.gguf [-n 32] [-t 1] [-v] PROMPT [PROMPT ...]\n");
    exit(2);
}

int main(int argc, char ** argv) {
    std::string model_path;
    int n_predict = 32;
    int threads   = 1;
    std::vector<std::string> prompts;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if ((a == "-m" || a == "-n" || a == "-t") && i + 1 >= argc) {
            usage();
        }
        if (a == "-m") {
            model_path = argv[++i];
        } else if (a == "-n") {
            n_predict = atoi(argv[++i]);
        } else if (a == "-t") {
            threads = atoi(argv[++i]);
        } else if (a == "-v") {
            g_verbose = true;
        } else if (a == "--") {
            for (i++; i < argc; i++) {
                prompts.push_back(argv[i]);
            }
        } else {
            prompts.push_back(a);
        }
    }
    if (model_path.empty() || prompts.empty() || n_predict <= 0 || threads <= 0) {
        usage();
    }

    llama_log_set(log_cb, nullptr);
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers       = 0;
    llama_model * model        = llama_model_load_from_file(model_path.c_str(), mparams);
    if (!model) {
        fprintf(stderr, "cannot load %s\n", model_path.c_str());
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const bool add_bos        = llama_vocab_get_add_bos(vocab);
    char desc[256];
    llama_model_desc(model, desc, sizeof desc);

    std::string cases;
    std::string fa_used = "?";
    for (const std::string & prompt : prompts) {
        int n = -llama_tokenize(vocab, prompt.c_str(), (int) prompt.size(), nullptr, 0, true, true);
        std::vector<llama_token> prompt_tokens(n);
        if (llama_tokenize(vocab, prompt.c_str(), (int) prompt.size(), prompt_tokens.data(), n, true, true) != n) {
            fprintf(stderr, "tokenize failed\n");
            return 1;
        }

        llama_context_params cparams = llama_context_default_params();
        cparams.n_ctx                = n + n_predict + 8;
        cparams.n_batch              = cparams.n_ctx;
        cparams.n_ubatch             = cparams.n_ctx;
        cparams.n_seq_max            = 1;
        cparams.n_threads            = threads;
        cparams.n_threads_batch      = threads;
        cparams.no_perf              = true;
        llama_context * ctx          = llama_init_from_model(model, cparams);
        if (!ctx) {
            fprintf(stderr, "cannot create a context\n");
            return 1;
        }
        fa_used = llama_flash_attn_type_name(cparams.flash_attn_type);

        llama_sampler * smpl = llama_sampler_chain_init(llama_sampler_chain_default_params());
        llama_sampler_chain_add(smpl, llama_sampler_init_greedy());

        std::vector<llama_token> out;
        std::string text;
        std::string stop  = "length";
        llama_batch batch = llama_batch_get_one(prompt_tokens.data(), (int) prompt_tokens.size());
        llama_token next;
        while ((int) out.size() < n_predict) {
            if (llama_decode(ctx, batch) != 0) {
                fprintf(stderr, "llama_decode failed\n");
                return 1;
            }
            next = llama_sampler_sample(smpl, ctx, -1);
            if (llama_vocab_is_eog(vocab, next)) {
                stop = "eog";
                break;
            }
            out.push_back(next);
            text += piece(vocab, next);
            batch = llama_batch_get_one(&next, 1);
        }

        bool valid = true;
        std::string text_json = json_str(text, &valid);
        cases += std::string(cases.empty() ? "" : ",\n    ") + "{\"prompt\": " + json_str(prompt) +
                 ", \"prompt_tokens\": " + json_ids(prompt_tokens) + ", \"tokens\": " + json_ids(out) +
                 ", \"text\": " + text_json + ", \"stop\": \"" + stop + "\"" +
                 (valid ? "" : ", \"text_lossy\": true") + "}";

        llama_sampler_free(smpl);
        llama_free(ctx);
    }

    printf("{\n  \"tool\": \"gantry-greedy-ref\",\n  \"llama_cpp_source\": %s,\n  \"model_desc\": %s,\n"
           "  \"add_bos\": %s,\n  \"n_predict\": %d,\n  \"threads\": %d,\n  \"flash_attn_requested\": %s,\n"
           "  \"system_info\": %s,\n  \"cases\": [\n    %s\n  ]\n}\n",
           json_str(GANTRY_LLAMA_SOURCE_ID).c_str(), json_str(desc).c_str(), add_bos ? "true" : "false", n_predict,
           threads, json_str(fa_used).c_str(), json_str(llama_print_system_info()).c_str(), cases.c_str());

    llama_model_free(model);
    llama_backend_free();
    return 0;
}
