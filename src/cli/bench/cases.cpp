// tparity bench's cases: the shapes timed, the targets each aims at, and the work each does (the
// FLOPs its products take, the bytes a memory-bound call must move).
#include "bench.hpp"

namespace tparity::cli::bench {

namespace {

// A LLaMA-7B-shaped LlamaDecoderLayer (hidden 4096, 32 heads over 8 kv heads of 128, intermediate
// 11008): T tokens, the last `decode` of them decoded one a call after a prefill of the others.
CaseSpec llama7b(std::string name, int64_t T, int64_t decode, bool quick) {
  CaseSpec s;
  s.name = std::move(name), s.module = ModuleKind::LlamaDecoderLayer, s.batch = 1, s.seq = T;
  s.dim = quick ? 512 : 4096, s.heads = quick ? 4 : 32, s.kv_heads = quick ? 1 : 8, s.head_dim = 128;
  s.ffn = quick ? 1376 : 11008, s.bias = false, s.decode_steps = decode, s.seed = 42;
  return s;
}

CaseSpec encoder_layer(std::string name, int64_t B, int64_t T, int64_t d, int64_t H, int64_t F, MaskKind mask,
                       bool zero_ffn_bias) {
  CaseSpec s;
  s.name = std::move(name), s.module = ModuleKind::TransformerEncoderLayer, s.batch = B, s.seq = T, s.dim = d;
  s.heads = H, s.ffn = F, s.mask = mask, s.zero_ffn_bias = zero_ffn_bias, s.seed = 42;
  return s;
}

}  // namespace

std::vector<BenchCase> bench_cases(bool quick) {
  const int64_t q = quick ? 1 : 0;
  CaseSpec attention;
  attention.name = "long_attention", attention.module = ModuleKind::MultiheadAttention, attention.batch = 1;
  attention.seq = q ? 256 : 4096, attention.dim = 512, attention.heads = 8, attention.bias = true;
  attention.need_weights = false, attention.seed = 42;
  return {
      {"seed_block",
       encoder_layer("seed_block", q ? 5 : 50, 100, 64, 4, 128, MaskKind::Causal, true),
       1,
       {0.9, 0.60, 0, 0, 0}},
      {"bert_base",
       encoder_layer("bert_base", q ? 1 : 8, q ? 32 : 128, 768, 12, 3072, MaskKind::None, false),
       1,
       {0.9, 0.88, 0, 0, 0}},
      {"long_attention", attention, 1, {0.9, 0.85, 0, 0.05, 0}},
      {"bert_base_2threads",
       encoder_layer("bert_base_2threads", q ? 1 : 8, q ? 32 : 128, 768, 12, 3072, MaskKind::None, false),
       2,
       {0.9, 0.80, 0, 0, 1.85}},
      {"llama7b_prefill", llama7b("llama7b_prefill", q ? 32 : 128, 0, quick), 1, {0.9, 0.85, 0, 0, 0}},
      {"llama7b_decode", llama7b("llama7b_decode", q ? 257 : 2049, 1, quick), 1, {0.9, 0, 0.90, 0, 0}, true},
  };
}

double flops(const CaseSpec& s) {
  if (s.module == ModuleKind::LlamaDecoderLayer) {  // the timed calls' tokens L over S keys
    const double C = double(s.dim), H = double(s.heads), K = double(s.kv_heads), D = double(s.head_dim),
                 I = double(s.ffn), L = double(s.decode_steps ? s.decode_steps : s.seq), S = double(s.seq);
    return 2 * L * (C * (H + 2 * K) * D + H * D * C + 3 * C * I) + 2 * 2 * L * S * H * D;
  }
  const double B = double(s.batch ? s.batch : 1), L = double(s.seq), S = double(s.kv_seq ? s.kv_seq : s.seq),
               E = double(s.dim);
  const double attention = 2 * B * L * E * E + 2 * 2 * B * S * E * E + 2 * 2 * B * L * S * E + 2 * B * L * E * E;
  if (s.module == ModuleKind::TransformerEncoderLayer) return attention + 2 * 2 * B * L * E * double(s.ffn);
  return attention;
}

double bytes_moved(const CaseSpec& s) {
  if (s.module != ModuleKind::LlamaDecoderLayer) return 0;
  const double C = double(s.dim), H = double(s.heads), K = double(s.kv_heads), D = double(s.head_dim),
               I = double(s.ffn), S = double(s.seq);
  const double weights = C * (H + 2 * K) * D + H * D * C + 3 * C * I + 2 * C;
  return 4 * (weights + 2 * K * S * D);
}

}  // namespace tparity::cli::bench
